/* The pod sandbox's process: it holds the pod's namespaces and does nothing
 * else.  Built static, so the pause image needs no libc.  As PID 1 of its
 * PID namespace it reaps orphans (shareProcessNamespace pods hand it theirs)
 * and ends on SIGINT or SIGTERM, which PID 1 gets only if it asks for them. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig)
{
	(void)sig;
	_exit(0);
}

static void reap(int sig)
{
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
}

int main(void)
{
	struct sigaction quit = { .sa_handler = stop };
	struct sigaction child = { .sa_handler = reap, .sa_flags = SA_NOCLDSTOP | SA_RESTART };

	if (sigaction(SIGINT, &quit, NULL) || sigaction(SIGTERM, &quit, NULL) ||
	    sigaction(SIGCHLD, &child, NULL))
		return 1;
	for (;;)
		pause();
}
