/* The agent's side of container processes: one slot per channel holding the
 * process's pid, the agent's ends of its stdio, and its exit status.
 *
 * A slot lives until the process has been reaped AND its output fds and
 * status pipe have reached EOF; only then is EXIT queued, so EXIT always
 * follows the last byte of output on the wire. */
#define _GNU_SOURCE
#include "process.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent_codec.h"
#include "channel.h"
#include "child.h"
#include "log.h"

/* Bigger pipes mean fewer wakeups per MiB of output under TCG. */
#define PIPE_SIZE (256 * 1024)
/* Holds the host's whole window (proto/agent_proto.h), so a STDIN frame
 * within it is always taken at once; it also holds a whole frame, so a frame
 * beyond the window is taken or left whole. */
#define STDIN_CAP PC_STDIN_WINDOW
_Static_assert(STDIN_CAP >= PC_MAX_PAYLOAD, "a STDIN frame must fit the stdin buffer");
/* Credit goes back once this much has gathered: the host then always has
 * room for a whole frame while nothing is buffered. */
#define CREDIT_BATCH (PC_STDIN_WINDOW / 4)
_Static_assert(PC_STDIN_WINDOW - CREDIT_BATCH >= PC_MAX_PAYLOAD, "credit must not stall a frame");
/* Room kept for other control frames when credit is queued. */
#define CREDIT_ROOM (OUTQ_CTRL_RESERVE / 2)
#define SETUP_TIMEOUT_MS 30000

enum { P_FREE, P_CREATED, P_RUNNING };

struct proc {
    int state;
    struct ctr *ctr;
    int is_init;
    pid_t pid;
    int tty;
    int out_fd, err_fd; /* agent's read ends; -1 once at EOF */
    int in_fd;          /* agent's write end of stdin; -1 once closed */
    int status_fd;      /* socket; reports a failed execve; -1 once at EOF */
    int start_fd;       /* -1 once START was given */
    int exited, status;
    unsigned char *inbuf;
    size_t in_off, in_len;
    int in_eof;
    uint32_t credit_due; /* stdin bytes passed on or dropped, not yet credited */
};

static struct proc procs[PC_MAX_CHAN + 1];
static int self_pidns = -1;

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

static void close_stdin(struct proc *p)
{
    /* What is still buffered is dropped: the host may send that much again. */
    p->credit_due += (uint32_t)p->in_len;
    close_fd(&p->in_fd);
    free(p->inbuf);
    p->inbuf = NULL;
    p->in_off = p->in_len = 0;
}

int proc_active(void)
{
    int n = 0;
    for (unsigned c = 0; c <= PC_MAX_CHAN; c++)
        n += procs[c].state != P_FREE;
    return n;
}

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static int open_pipes(int ours[3], int theirs[3])
{
    int fds[2];
    for (int i = 0; i < 3; i++) {
        if (pipe2(fds, O_CLOEXEC) < 0)
            return -1;
        if (i == 0) {
            theirs[0] = fds[0];
            ours[2] = fds[1];
        } else {
            ours[i - 1] = fds[0];
            theirs[i] = fds[1];
            fcntl(fds[0], F_SETPIPE_SZ, PIPE_SIZE);
        }
    }
    for (int i = 0; i < 3; i++)
        if (set_nonblock(ours[i]) < 0)
            return -1;
    return 0;
}

/* The child's first message: "O" when it is ready to exec, "E<text>" when
 * not.  A child with a terminal sends the pty master along with "O": it
 * allocates the pty itself, from the container's own devpts. */
static int wait_setup(int fd, int *master, char *err, size_t errlen)
{
    char buf[ERRTEXT_MAX];
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int))];
    } cm;
    struct iovec iov = {buf, sizeof buf - 1};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b,
                        .msg_controllen = sizeof cm.b};
    struct pollfd q = {fd, POLLIN, 0};
    int r;
    do
        r = poll(&q, 1, SETUP_TIMEOUT_MS);
    while (r < 0 && errno == EINTR);
    if (r == 0) {
        snprintf(err, errlen, "process setup timed out");
        return -1;
    }
    ssize_t n;
    do
        n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    int got = -1;
    struct cmsghdr *c = n >= 0 ? CMSG_FIRSTHDR(&mh) : NULL;
    if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
        c->cmsg_len == CMSG_LEN(sizeof(int)))
        memcpy(&got, CMSG_DATA(c), sizeof got);
    if (n == 1 && buf[0] == 'O' && (got >= 0) == (master != NULL)) {
        if (master)
            *master = got;
        return 0;
    }
    if (got >= 0)
        close(got);
    if (n > 1 && buf[0] == 'E') {
        buf[n] = 0;
        snprintf(err, errlen, "%s", buf + 1);
    } else {
        snprintf(err, errlen, "process died during setup");
    }
    return -1;
}

int proc_chan_free(unsigned chan, char *err, size_t errlen)
{
    if (procs[chan].state == P_FREE)
        return 0;
    snprintf(err, errlen, "channel %u is already in use", chan);
    return -1;
}

int proc_spawn(unsigned chan, const struct spec *s, struct ctr *c, char *err, size_t errlen)
{
    struct proc *p = &procs[chan];
    int is_init = c->state == CTR_NEW;
    if (is_init) {
        c->xgates = s->xgates;
        c->userns = s->userns;
        /* Before the init exists: a limit asked for is never missing. */
        if (cg_limit(&c->cg, s->memory_max, s->pids_max, err, errlen) < 0)
            return -1;
    }
    int ours[3] = {-1, -1, -1}, theirs[3] = {-1, -1, -1};
    int st[2] = {-1, -1}, go[2] = {-1, -1};
    pid_t pid = -1;

    err[0] = 0;
    if (proc_chan_free(chan, err, errlen) < 0)
        return -1;
    if (self_pidns < 0 && (self_pidns = open("/proc/self/ns/pid", O_RDONLY | O_CLOEXEC)) < 0) {
        snprintf(err, errlen, "open /proc/self/ns/pid: %s", strerror(errno));
        return -1;
    }

    /* The status channel is a socket so that it can carry the pty master. */
    if ((!s->terminal && open_pipes(ours, theirs) < 0) ||
        socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, st) < 0 || pipe2(go, O_CLOEXEC) < 0) {
        snprintf(err, errlen, "create pipes: %s", strerror(errno));
        goto fail;
    }

    /* A pod member's init joins the namespaces of the containers its SPEC
     * names; each must be running now, and stays held by that container. */
    int join_ns[SPEC_JOIN_COUNT] = {-1, -1, -1};
    static const enum ctr_ns join_kind[SPEC_JOIN_COUNT] = {CTR_NS_IPC, CTR_NS_UTS, CTR_NS_PID};
    static const char *const join_name[SPEC_JOIN_COUNT] = {"ipc", "uts", "pid"};
    for (int i = 0; is_init && i < SPEC_JOIN_COUNT; i++) {
        if (!s->join[i])
            continue;
        const struct ctr *target = ctr_find_live(s->join[i]);
        if (!target) {
            snprintf(err, errlen, "container %s, whose %s namespace this one joins, is not running",
                     s->join[i], join_name[i]);
            goto fail;
        }
        join_ns[i] = target->ns[join_kind[i]];
    }

    /* Both calls only change the pid namespace of the agent's next child;
     * the agent itself stays where it is and switches back right after. */
    int pidns = is_init ? join_ns[SPEC_JOIN_PID] : c->ns[CTR_NS_PID];
    if ((pidns < 0 ? unshare(CLONE_NEWPID) : setns(pidns, CLONE_NEWPID)) < 0) {
        snprintf(err, errlen, "%s pid namespace: %s", is_init ? "create" : "join", strerror(errno));
        goto fail;
    }
    pid = fork();
    if (pid == 0) {
        struct child_ctx cc = {
            .spec = s, .is_init = is_init, .stdio = {theirs[0], theirs[1], theirs[2]},
            .tty = s->terminal, .status_fd = st[1], .start_fd = go[0],
            .ns_mnt = c->ns[CTR_NS_MNT],
            .ns_uts = is_init ? join_ns[SPEC_JOIN_UTS] : c->ns[CTR_NS_UTS],
            .ns_ipc = is_init ? join_ns[SPEC_JOIN_IPC] : c->ns[CTR_NS_IPC],
            .xgates = is_init ? s->xgates : c->xgates,
            .ns_user = !is_init && c->userns ? c->ns[CTR_NS_USER] : -1,
            .seccomp = c->seccomp,
            .cgroup_procs = c->cg.procs_fd,
        };
        child_main(&cc);
    }
    int fork_errno = errno;
    if (setns(self_pidns, CLONE_NEWPID) < 0)
        logmsg("cannot return to the agent's pid namespace: %s", strerror(errno));
    if (pid < 0) {
        snprintf(err, errlen, "fork: %s", strerror(fork_errno));
        goto fail;
    }

    for (int i = 0; i < 3; i++)
        close_fd(&theirs[i]);
    close_fd(&st[1]);
    close_fd(&go[0]);
    if (wait_setup(st[0], s->terminal ? &ours[0] : NULL, err, errlen) < 0)
        goto fail;
    if (s->terminal) {
        /* A separate fd for input, so stdin EOF and output EOF close
         * independently; EIO on the master means every slave fd is gone. */
        ours[2] = fcntl(ours[0], F_DUPFD_CLOEXEC, 3);
        if (ours[2] < 0 || set_nonblock(ours[0]) < 0) {
            snprintf(err, errlen, "set up terminal: %s", strerror(errno));
            goto fail;
        }
    }
    set_nonblock(st[0]);
    /* Last: a container must not outlive an init that failed to start. */
    if (is_init && ctr_started(c, pid) < 0) {
        snprintf(err, errlen, "open namespaces of pid %d: %s", (int)pid, strerror(errno));
        goto fail;
    }

    memset(p, 0, sizeof *p);
    p->state = P_CREATED;
    p->ctr = c;
    p->is_init = is_init;
    ctr_hold(c);
    p->pid = pid;
    p->tty = s->terminal;
    p->out_fd = ours[0];
    p->err_fd = ours[1];
    p->in_fd = ours[2];
    p->status_fd = st[0];
    p->start_fd = go[1];
    return pid;

fail:
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, __WALL);
    }
    for (int i = 0; i < 3; i++) {
        close_fd(&theirs[i]);
        close_fd(&ours[i]);
    }
    close_fd(&st[0]);
    close_fd(&st[1]);
    close_fd(&go[0]);
    close_fd(&go[1]);
    return -1;
}

void proc_start(unsigned chan)
{
    struct proc *p = &procs[chan];
    if (p->state != P_CREATED) {
        loghost("START for chan %u, which has no created process", chan);
        return;
    }
    if (write(p->start_fd, "S", 1) < 0) {
        /* The process is already gone; its EXIT will follow. */
    }
    close_fd(&p->start_fd);
    p->state = P_RUNNING;
}

int proc_stdin(unsigned chan, const unsigned char *data, size_t len)
{
    struct proc *p = &procs[chan];
    if (p->state == P_FREE)
        return 0; /* its session is over on the host too: no credit */
    /* Input after EOF, or for a process that is gone, is a normal race. */
    if (p->in_fd < 0 || p->in_eof) {
        p->credit_due += (uint32_t)len;
        return 0;
    }
    if (!len) {
        p->in_eof = 1;
        if (!p->in_len)
            close_stdin(p);
        return 0;
    }
    if (!p->in_len) {
        /* Straight into the pipe when nothing is queued ahead; since the
         * buffer is empty, any rest below always fits. */
        ssize_t n = write(p->in_fd, data, len);
        if (n < 0 && errno != EAGAIN && errno != EINTR) {
            p->credit_due += (uint32_t)len;
            close_stdin(p);
            return 0;
        }
        if (n > 0) {
            p->credit_due += (uint32_t)n;
            data += n;
            len -= (size_t)n;
        }
        if (!len)
            return 0;
    }
    if (!p->inbuf && !(p->inbuf = malloc(STDIN_CAP))) {
        logmsg("out of memory: dropping stdin of chan %u", chan);
        p->credit_due += (uint32_t)len;
        close_stdin(p);
        return 0;
    }
    if (STDIN_CAP - p->in_len < len)
        return 1;
    if (p->in_off + p->in_len + len > STDIN_CAP) {
        memmove(p->inbuf, p->inbuf + p->in_off, p->in_len);
        p->in_off = 0;
    }
    memcpy(p->inbuf + p->in_off + p->in_len, data, len);
    p->in_len += len;
    return 0;
}

static void flush_stdin(struct proc *p)
{
    while (p->in_len) {
        ssize_t n = write(p->in_fd, p->inbuf + p->in_off, p->in_len);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR)
                return;
            /* The reader is gone (EPIPE): what is left has nowhere to go. */
            close_stdin(p);
            return;
        }
        p->in_off += (size_t)n;
        p->in_len -= (size_t)n;
        p->credit_due += (uint32_t)n;
    }
    p->in_off = 0;
    if (p->in_eof)
        close_stdin(p);
}

void proc_signal(unsigned chan, uint32_t signo, uint32_t flags)
{
    struct proc *p = &procs[chan];
    if (signo < 1 || signo > 64) {
        loghost("ignoring signal with bad number %u", signo);
        return;
    }
    if (flags & PC_SIGNAL_ALL) {
        if (p->state != P_FREE && ctr_signal_all(p->ctr, (int)signo) < 0)
            loghost("signal %u to container %s: %s", signo, p->ctr->id, strerror(errno));
        return;
    }
    if (p->state == P_FREE || p->exited)
        return;
    if (kill(p->pid, (int)signo) < 0 && errno != ESRCH)
        loghost("signal %u to chan %u: %s", signo, chan, strerror(errno));
}

void proc_resize(unsigned chan, unsigned rows, unsigned cols)
{
    struct proc *p = &procs[chan];
    if (p->state == P_FREE || !p->tty || p->out_fd < 0)
        return;
    struct winsize ws = {(unsigned short)rows, (unsigned short)cols, 0, 0};
    ioctl(p->out_fd, TIOCSWINSZ, &ws);
}

void proc_reap(void)
{
    int st;
    pid_t pid;
    /* Orphans end up here too; they have no slot and are simply reaped. */
    while ((pid = waitpid(-1, &st, WNOHANG | __WALL)) > 0) {
        for (unsigned c = 0; c <= PC_MAX_CHAN; c++) {
            struct proc *p = &procs[c];
            if (p->state == P_FREE || p->exited || p->pid != pid)
                continue;
            p->exited = 1;
            p->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            close_stdin(p);
            close_fd(&p->start_fd);
            if (p->is_init) {
                logmsg("container %s: init exited with status %d", p->ctr->id, p->status);
                ctr_init_exited(p->ctr);
            }
            break;
        }
    }
}

/* Which fd of which process a pollfd entry stands for. */
enum { W_OUT, W_ERR, W_STATUS, W_IN };
static struct {
    uint16_t chan;
    uint8_t which;
} tags[4 * (PC_MAX_CHAN + 1)];
static int first_tag;

int proc_poll_prepare(struct pollfd *pfd, int n, int max)
{
    int data = outq_has_data_room();
    /* A status pipe may carry an ERROR text: needs control-frame room. */
    int ctrl = outq_free() >= OUTQ_CTRL_RESERVE;
    first_tag = n;

#define ADD(fd_, ev_, which_)                          \
    do {                                               \
        if (n < max) {                                 \
            pfd[n].fd = (fd_);                         \
            pfd[n].events = (ev_);                     \
            pfd[n].revents = 0;                        \
            tags[n - first_tag].chan = (uint16_t)c;    \
            tags[n - first_tag].which = (which_);      \
            n++;                                       \
        }                                              \
    } while (0)

    for (unsigned c = 0; c <= PC_MAX_CHAN; c++) {
        struct proc *p = &procs[c];
        if (p->state == P_FREE)
            continue;
        /* Output fds are left out, not just muted, while the queue is full:
         * a hung-up pipe would report POLLHUP every time and spin the loop. */
        if (data && p->out_fd >= 0)
            ADD(p->out_fd, POLLIN, W_OUT);
        if (data && p->err_fd >= 0)
            ADD(p->err_fd, POLLIN, W_ERR);
        if (ctrl && p->status_fd >= 0)
            ADD(p->status_fd, POLLIN, W_STATUS);
        if (p->in_fd >= 0 && p->in_len)
            ADD(p->in_fd, POLLOUT, W_IN);
    }
#undef ADD
    return n;
}

static void read_output(unsigned chan, int *fd, uint16_t type)
{
    /* A few frames per fd per round keeps one busy process from starving
     * the others while still doing big reads. */
    for (int i = 0; i < 4 && *fd >= 0 && outq_has_data_room(); i++) {
        ssize_t n = outq_read_frame(*fd, type, (uint16_t)chan);
        if (n > 0)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return;
        /* EOF; a pty master reports EIO once every slave fd is closed. */
        if (n < 0 && errno != EIO)
            logmsg("read output of chan %u: %s", chan, strerror(errno));
        close_fd(fd);
    }
}

static void read_status(unsigned chan, struct proc *p)
{
    char buf[ERRTEXT_MAX];
    ssize_t n = read(p->status_fd, buf, sizeof buf - 1);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n > 1 && buf[0] == 'E') {
        /* execve failed after CREATED; EXIT 127 follows. */
        buf[n] = 0;
        chan_send_text(PC_ERROR, (uint16_t)chan, buf + 1);
        return;
    }
    /* EOF: execve succeeded (the pipe is close-on-exec) or the process died. */
    close_fd(&p->status_fd);
}

void proc_poll_handle(const struct pollfd *pfd, int n)
{
    for (int i = first_tag; i < n; i++) {
        if (!pfd[i].revents)
            continue;
        unsigned c = tags[i - first_tag].chan;
        struct proc *p = &procs[c];
        switch (tags[i - first_tag].which) {
        case W_OUT:
            read_output(c, &p->out_fd, PC_STDOUT);
            break;
        case W_ERR:
            read_output(c, &p->err_fd, PC_STDERR);
            break;
        case W_STATUS:
            if (p->status_fd >= 0)
                read_status(c, p);
            break;
        case W_IN:
            if (p->in_fd >= 0)
                flush_stdin(p);
            break;
        }
    }
}

static void send_credit(unsigned chan, uint32_t bytes)
{
    unsigned char b[PC_U32_MSG_LEN];
    pc_stdin_credit_encode(b, &(struct pc_stdin_credit_msg){bytes});
    chan_send(PC_STDIN_CREDIT, (uint16_t)chan, b, sizeof b);
}

void proc_send_credits(void)
{
    for (unsigned c = 0; c <= PC_MAX_CHAN && outq_free() >= CREDIT_ROOM; c++) {
        struct proc *p = &procs[c];
        if (p->state == P_FREE || p->credit_due < CREDIT_BATCH)
            continue;
        send_credit(c, p->credit_due);
        p->credit_due = 0;
    }
}

void proc_rolled_back(void)
{
    for (unsigned c = 0; c <= PC_MAX_CHAN; c++) {
        struct proc *p = &procs[c];
        if (p->state == P_FREE)
            continue;
        if (p->is_init) {
            /* The host counts this window from 0 now: all of it but what
             * this checkpoint's buffer still holds. */
            p->credit_due = 0;
            send_credit(c, (uint32_t)(STDIN_CAP - p->in_len));
            continue;
        }
        /* The slot is free at once: the host may give its channel to a new
         * session in its next frame.  The killed process is reaped as an
         * orphan. */
        if (!p->exited && p->pid > 0)
            kill(p->pid, SIGKILL);
        close_fd(&p->out_fd);
        close_fd(&p->err_fd);
        close_fd(&p->status_fd);
        close_fd(&p->start_fd);
        close_stdin(p);
        ctr_release(p->ctr);
        memset(p, 0, sizeof *p);
        p->state = P_FREE;
    }
}

void proc_collect(void)
{
    for (unsigned c = 0; c <= PC_MAX_CHAN; c++) {
        struct proc *p = &procs[c];
        if (p->state == P_FREE || !p->exited || p->out_fd >= 0 || p->err_fd >= 0 || p->status_fd >= 0)
            continue;
        /* Credit still due is not sent: EXIT ends the channel's window. */
        unsigned char b[PC_U32_MSG_LEN];
        struct pc_exit_msg m = {.status = p->status};
        pc_exit_encode(b, &m);
        chan_send(PC_EXIT, (uint16_t)c, b, sizeof b);
        close_stdin(p);
        close_fd(&p->start_fd);
        if (p->is_init)
            ctr_init_reported(p->ctr);
        ctr_release(p->ctr);
        memset(p, 0, sizeof *p);
        p->state = P_FREE;
    }
}
