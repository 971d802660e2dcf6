/* An agent that keeps its API key away from the tool code it runs in the
 * same process: the key lives in an XGates application domain, and only
 * the domain's one registered handler (sign) ever sees it.
 *
 *   gcc -static -O2 -I guest/xgate -o ROOTFS/agent-secret \
 *       oci/examples/xgate-domain/agent-secret.c guest/xgate/libxgate.c
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "xgate.h"

static const char *api_key; /* where the key lives; the address is no secret */

static void load_key(void *data)
{
    /* A real agent would read it from a file descriptor the host passed. */
    strcpy(data, "sk-demo-0123456789");
}

/* The only code that runs with the domain open: sign a request, return the tag. */
static long sign(long request)
{
    unsigned long h = 1469598103934665603ul ^ (unsigned long)request;
    for (const char *p = api_key; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ul;
    return (long)(h & 0x7fffffffffffffff);
}

static sigjmp_buf caught;
static void on_segv(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    (void)uc;
    printf("tool: reading the key faulted (si_code %d, SEGV_PKUERR is %d)\n", si->si_code,
           SEGV_PKUERR);
    siglongjmp(caught, 1);
}

/* Untrusted tool code: it knows where the key is and tries to read it. */
static void tool(void)
{
    struct sigaction sa = {.sa_sigaction = on_segv, .sa_flags = SA_SIGINFO};
    sigaction(SIGSEGV, &sa, NULL);
    char copy[64] = "";
    if (!sigsetjmp(caught, 1)) {
        strncpy(copy, api_key, sizeof copy - 1);
        printf("tool: stole the key: %s\n", copy);
    }
}

int main(void)
{
    void *data;
    int domain = xgate_domain_create(4096, load_key, sign, &data);
    if (domain < 0) {
        perror("xgate_domain_create (is io.paracell.xgates on?)");
        return 1;
    }
    api_key = data;
    printf("agent: request 42 signed: %lx\n", (unsigned long)xgate_domain_call(domain, 42));
    tool();
    printf("agent: request 42 signed again: %lx\n", (unsigned long)xgate_domain_call(domain, 42));
    return 0;
}
