/* The host half of the Pager (see pager.h and docs/pager.md).
 *
 * The guest is hostile.  Every index and range is copied out of the shared
 * memory once, validated as a whole batch, and only then acted on; a batch
 * with any bad entry is refused entirely and ends the VM.  The only file this
 * code writes is the guest-RAM file it was given, and only inside it. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "pager_proto.h"
#include "pager.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define FOUR_GIB (1ULL << 32)
/* A read fault on a file mapping also maps the page cache around it, 64 KiB
 * aligned (the kernel's fault_around_bytes), so one byte read per 64 KiB
 * maps a populated range whole. */
#define PREFAULT_STEP (64 * 1024ULL)
#define PREFAULT_IOVS 64
#define VMM_LOOKUPS 8
#define NS_PER_S 1000000000ULL

_Static_assert(sizeof(struct pc_pager_shm) <= PC_PAGER_SHM_SIZE, "rings must fit their range");
_Static_assert(sizeof(((struct pc_pager_shm *)0)->unbind_ring) ==
               PC_PAGER_UNBIND_SLOTS * sizeof(struct pc_pager_range), "unbind slots");
_Static_assert(sizeof(((struct pc_pager_shm *)0)->bind_ring) ==
               PC_PAGER_BIND_SLOTS * sizeof(struct pc_pager_range), "bind slots");
_Static_assert((PC_PAGER_TOKEN_SIZE & (PC_PAGER_TOKEN_SIZE - 1)) == 0, "a BAR is a power of two");
_Static_assert(PC_PAGER_RING_GPA % PC_PAGER_PAGE_SIZE == 0 &&
               PC_PAGER_SHM_SIZE % PC_PAGER_PAGE_SIZE == 0, "the ring range is whole pages");

static int fail(struct pc_pager *p, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->error, sizeof p->error, fmt, ap);
    va_end(ap);
    return code;
}

static uint64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * NS_PER_S + (uint64_t)ts.tv_nsec;
}

static void close_fd(int *fd)
{
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

int pc_pager_open(struct pc_pager *p, int ram_fd, uint64_t ram_size, uint64_t ram_split,
                  int token_fd, int stats_fd)
{
    memset(p, 0, sizeof *p);
    p->ram_fd = p->token_fd = p->doorbell_fd = p->irq_fd = p->stop_fd = p->abort_fd = -1;
    if (ram_size == 0 || ram_size % PC_PAGER_PAGE_SIZE || ram_split > ram_size ||
        ram_split % PC_PAGER_PAGE_SIZE || ram_split > FOUR_GIB ||
        ram_split < PC_PAGER_RING_GPA + PC_PAGER_SHM_SIZE)
        return fail(p, PC_PAGER_IO_ERROR, "bad guest RAM layout");
    p->ram_size = ram_size;
    p->ram_split = ram_split;
    p->gate = malloc(sizeof(pthread_mutex_t));
    if (!p->gate || pthread_mutex_init(p->gate, NULL)) {
        free(p->gate);
        p->gate = NULL;
        return fail(p, PC_PAGER_IO_ERROR, "allocating the Pager's gate");
    }
    p->token_fd = dup(token_fd);
    if (p->token_fd < 0) goto io_error;
    if (ram_fd >= 0 && (p->ram_fd = dup(ram_fd)) < 0) goto io_error;
    /* Allocated, not just sized: on a full filesystem the first store into
     * a sparse shared mapping is a SIGBUS; here it is ENOSPC, reported. */
    if (fallocate(p->token_fd, 0, 0, PC_PAGER_TOKEN_SIZE) < 0 ||
        fallocate(stats_fd, 0, 0, sizeof(struct pc_pager_stats)) < 0)
        goto io_error;
    p->stats = mmap(NULL, sizeof *p->stats, PROT_READ | PROT_WRITE, MAP_SHARED, stats_fd, 0);
    if (p->stats == MAP_FAILED) { p->stats = NULL; goto io_error; }
    if (p->ram_fd >= 0) {
        /* NORESERVE: this mapping only ever populates what the guest asked for. */
        p->ram_map = mmap(NULL, ram_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE,
                          p->ram_fd, 0);
        if (p->ram_map == MAP_FAILED) { p->ram_map = NULL; goto io_error; }
        /* The rings: guest RAM the host reserved (memmap=), below the split. */
        p->shm = (struct pc_pager_shm *)(p->ram_map + PC_PAGER_RING_GPA);
        p->unbound = calloc(ram_size / PC_PAGER_PAGE_SIZE, 1);
        if (!p->unbound) goto io_error;
    }
    p->doorbell_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    p->irq_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    p->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    p->abort_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (p->doorbell_fd < 0 || p->irq_fd < 0 || p->stop_fd < 0 || p->abort_fd < 0) goto io_error;

    memset(p->stats, 0, sizeof *p->stats);
    p->stats->ram_pages = ram_size / PC_PAGER_PAGE_SIZE;
    return PC_PAGER_OK;
io_error:
    fail(p, PC_PAGER_IO_ERROR, "setting up the Pager: %s", strerror(errno));
    pc_pager_close(p);
    return PC_PAGER_IO_ERROR;
}

int pc_pager_adopt(struct pc_pager *p, uint8_t *ram_map, uint64_t ram_size, uint64_t ram_split,
                   int doorbell_fd, int irq_fd, int abort_fd, int stats_fd)
{
    memset(p, 0, sizeof *p);
    p->ram_fd = p->token_fd = p->stop_fd = -1;
    p->in_vmm = 1;
    p->ram_size = ram_size;
    p->ram_split = ram_split;
    p->doorbell_fd = doorbell_fd;
    p->irq_fd = irq_fd;
    p->abort_fd = abort_fd;
    p->ram_map = ram_map;
    p->shm = (struct pc_pager_shm *)(ram_map + PC_PAGER_RING_GPA);
    p->gate = malloc(sizeof(pthread_mutex_t));
    if (!p->gate || pthread_mutex_init(p->gate, NULL)) {
        free(p->gate);
        p->gate = NULL;
        return fail(p, PC_PAGER_IO_ERROR, "allocating the Pager's gate");
    }
    p->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    p->stats = mmap(NULL, sizeof *p->stats, PROT_READ | PROT_WRITE, MAP_SHARED, stats_fd, 0);
    if (p->stop_fd < 0 || p->stats == MAP_FAILED) {
        p->stats = NULL;
        return fail(p, PC_PAGER_IO_ERROR, "setting up the Pager in QEMU: %s", strerror(errno));
    }
    return PC_PAGER_OK;
}

/* One int64 little-endian message, with an fd attached when fd >= 0. */
static int send_msg(int sock, int64_t value, int fd)
{
    union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } control;
    struct iovec iov = {.iov_base = &value, .iov_len = sizeof value};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0) {
        memset(&control, 0, sizeof control);
        msg.msg_control = control.buf;
        msg.msg_controllen = sizeof control.buf;
        struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
        cmsg->cmsg_level = SOL_SOCKET;
        cmsg->cmsg_type = SCM_RIGHTS;
        cmsg->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cmsg), &fd, sizeof fd);
    }
    ssize_t n;
    do n = sendmsg(sock, &msg, MSG_NOSIGNAL); while (n < 0 && errno == EINTR);
    return n == (ssize_t)sizeof value ? 0 : -1;
}

int pc_pager_greet(struct pc_pager *p, int sock_fd)
{
    /* x86-64 is little-endian, as the protocol is. */
    if (send_msg(sock_fd, 0, -1) < 0 ||                        /* protocol version */
        send_msg(sock_fd, PC_PAGER_GUEST_PEER, -1) < 0 ||      /* QEMU's own id */
        send_msg(sock_fd, -1, p->token_fd) < 0 ||              /* BAR2's token page */
        send_msg(sock_fd, PC_PAGER_GUEST_PEER, p->irq_fd) < 0 ||  /* QEMU's vector 0 */
        send_msg(sock_fd, PC_PAGER_HOST_PEER, p->doorbell_fd) < 0)  /* our vector 0 */
        return fail(p, PC_PAGER_IO_ERROR, "greeting QEMU's ivshmem device: %s", strerror(errno));
    return PC_PAGER_OK;
}

/* The offset in the RAM file of a valid guest-physical range, or -1.  The
 * rings' own range is never valid: the host reads them through this file. */
static int64_t ram_offset(const struct pc_pager *p, uint64_t addr, uint64_t len)
{
    if (len == 0 || addr % PC_PAGER_PAGE_SIZE || len % PC_PAGER_PAGE_SIZE ||
        len / PC_PAGER_PAGE_SIZE > PC_PAGER_MAX_RANGE_PAGES || addr + len < addr)
        return -1;
    if (addr < PC_PAGER_RING_GPA + PC_PAGER_SHM_SIZE && PC_PAGER_RING_GPA < addr + len)
        return -1;
    if (addr + len <= p->ram_split) return (int64_t)addr;
    uint64_t above = p->ram_size - p->ram_split;
    if (addr >= FOUR_GIB && addr - FOUR_GIB <= above && len <= above - (addr - FOUR_GIB))
        return (int64_t)(p->ram_split + (addr - FOUR_GIB));
    return -1;
}

static int bad_range(struct pc_pager *p, const char *ring, const struct pc_pager_range *r)
{
    return fail(p, PC_PAGER_VIOLATION,
                "pager protocol violation: %s range 0x%llx+0x%llx is not page-aligned "
                "guest RAM outside the rings (0x%llx bytes)", ring, (unsigned long long)r->addr,
                (unsigned long long)r->len, (unsigned long long)p->ram_size);
}

/* How many entries the guest published, or a violation for an impossible index. */
static int64_t published(struct pc_pager *p, const char *ring, const uint32_t *prod_word,
                         uint32_t cons, uint32_t slots)
{
    uint32_t prod = __atomic_load_n(prod_word, __ATOMIC_ACQUIRE);
    uint32_t avail = prod - cons;
    if (avail > UINT32_MAX / 2)
        return fail(p, PC_PAGER_VIOLATION,
                    "pager protocol violation: %s ring index %u is behind the host's %u",
                    ring, prod, cons);
    if (avail > slots)
        return fail(p, PC_PAGER_VIOLATION,
                    "pager protocol violation: oversized %s batch of %u entries (ring has %u)",
                    ring, avail, slots);
    return avail;
}

static int populate(struct pc_pager *p, int64_t off, uint64_t len)
{
    if (madvise(p->ram_map + off, len, MADV_POPULATE_WRITE) == 0) return 0;
    if (errno != EINVAL) return -1;
    /* Hosts before Linux 5.14.  Inside QEMU a private page cannot be
     * allocated ahead: binding only saves a fault, so QEMU takes the fault. */
    if (p->in_vmm) return 0;
    /* Otherwise allocate in the file; QEMU's fault then maps it. */
    return fallocate(p->ram_fd, 0, off, (off_t)len);
}

void pc_pager_set_vmm(struct pc_pager *p, int pid)
{
    __atomic_store_n(&p->vmm_lookups, VMM_LOOKUPS, __ATOMIC_RELAXED);
    __atomic_store_n(&p->vmm_pid, pid, __ATOMIC_RELEASE);
}

uint64_t pc_find_file_mapping(const char *maps_path, uint64_t dev, uint64_t ino, uint64_t size,
                              char kind)
{
    char line[512];
    uint64_t found = 0;
    FILE *f = fopen(maps_path, "re");
    if (!f) return 0;
    while (!found && fgets(line, sizeof line, f)) {
        unsigned long long start, end, offset, inode;
        unsigned int maj, min;
        char perms[8];
        if (sscanf(line, "%llx-%llx %7s %llx %x:%x %llu", &start, &end, perms, &offset, &maj,
                   &min, &inode) == 7 && inode == ino && makedev(maj, min) == dev &&
            offset == 0 && perms[1] == 'w' && perms[3] == kind && end - start >= size)
            found = start;
    }
    fclose(f);
    return found;
}

/* QEMU's shared mapping of the whole RAM file, in /proc/PID/maps. */
static uint64_t find_vmm_mapping(const struct pc_pager *p, int pid)
{
    struct stat st;
    char path[64];
    if (fstat(p->ram_fd, &st) < 0) return 0;
    snprintf(path, sizeof path, "/proc/%d/maps", pid);
    return pc_find_file_mapping(path, st.st_dev, st.st_ino, p->ram_size, 's');
}

/* Maps a populated range into QEMU's page tables by reading one byte of it
 * per fault-around window through process_vm_readv: a read fault on a shared
 * file mapping installs writable entries, so QEMU's own stores then run
 * without a fault.  Only reads, and only inside QEMU's mapping of guest RAM;
 * any failure just leaves the faults to QEMU, as without this. */
static void prefault_vmm(struct pc_pager *p, int64_t off, uint64_t len)
{
    int pid = __atomic_load_n(&p->vmm_pid, __ATOMIC_ACQUIRE);
    if (!pid) return;
    if (!p->vmm_base) {
        if (p->vmm_lookups <= 0) return;
        p->vmm_lookups--;
        p->vmm_base = find_vmm_mapping(p, pid);
        if (!p->vmm_base) return;
    }
    char sink[PREFAULT_IOVS];
    struct iovec local[PREFAULT_IOVS], remote[PREFAULT_IOVS];
    uint64_t at = (uint64_t)off, end = (uint64_t)off + len;
    while (at < end) {
        int n = 0;
        for (; n < PREFAULT_IOVS && at < end; n++) {
            local[n] = (struct iovec){.iov_base = &sink[n], .iov_len = 1};
            remote[n] = (struct iovec){.iov_base = (void *)(uintptr_t)(p->vmm_base + at),
                                       .iov_len = 1};
            at = (at + PREFAULT_STEP) & ~(PREFAULT_STEP - 1);
        }
        ssize_t got = process_vm_readv(pid, local, n, remote, n, 0);
        if (got < 0 && errno != EFAULT) {
            p->vmm_base = 0;  /* QEMU gone, or not ours to read: stop trying */
            p->vmm_lookups = 0;
            return;
        }
        if (got < n) return;  /* a page QEMU could not map now: it faults it in itself */
    }
    p->stats->vmm_prefault_pages += len / PC_PAGER_PAGE_SIZE;
}

static int drain_bind(struct pc_pager *p, int *more)
{
    int64_t avail = published(p, "BIND", &p->shm->bind.prod, p->bind_cons, PC_PAGER_BIND_SLOTS);
    if (avail < 0) return (int)avail;
    uint32_t n = avail > PC_PAGER_MAX_BIND_PER_WAKEUP ? PC_PAGER_MAX_BIND_PER_WAKEUP : (uint32_t)avail;
    for (uint32_t i = 0; i < n; i++) {
        struct pc_pager_range r;
        memcpy(&r, (const void *)&p->shm->bind_ring[(p->bind_cons + i) % PC_PAGER_BIND_SLOTS],
               sizeof r);
        int64_t off = ram_offset(p, r.addr, r.len);
        if (off < 0) return bad_range(p, "BIND", &r);
        uint64_t t0 = monotonic_ns();
        if (populate(p, off, r.len) < 0) {
            if (errno != ENOMEM)
                return fail(p, PC_PAGER_IO_ERROR, "binding guest memory: %s", strerror(errno));
        } else {
            prefault_vmm(p, off, r.len);
        }
        p->stats->bind_ns += monotonic_ns() - t0;
        p->stats->bind_ranges++;
        p->stats->bind_pages += r.len / PC_PAGER_PAGE_SIZE;
    }
    if (n) {
        p->bind_cons += n;
        __atomic_store_n(&p->shm->bind.cons, p->bind_cons, __ATOMIC_RELEASE);
        p->stats->bind_batches++;
    }
    *more = (uint32_t)avail > n;
    return (int)n;
}

/* Gives a free range's memory back to the host.  A shared file is punched;
 * QEMU's private mapping of a template drops its own copy, and the range
 * reads the template's page again, which its other users share: the
 * template's file itself is never written. */
static int discard(struct pc_pager *p, int64_t off, uint64_t len)
{
    if (p->in_vmm) return madvise(p->ram_map + off, len, MADV_DONTNEED);
    return fallocate(p->ram_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, (off_t)len);
}

static int by_addr(const void *a, const void *b)
{
    const struct pc_pager_range *x = a, *y = b;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

static int drain_unbind(struct pc_pager *p, uint64_t now_ns)
{
    int64_t avail = published(p, "UNBIND", &p->shm->unbind.prod, p->unbind_cons,
                              PC_PAGER_UNBIND_SLOTS);
    if (avail <= 0) return (int)avail;
    struct pc_pager_range batch[PC_PAGER_UNBIND_SLOTS];
    int64_t offs[PC_PAGER_UNBIND_SLOTS];
    /* One copy: what is checked is what is acted on, whatever the guest
     * writes to the ring meanwhile. */
    for (int64_t i = 0; i < avail; i++)
        memcpy(&batch[i], (const void *)&p->shm->unbind_ring[(p->unbind_cons + i) %
                                                              PC_PAGER_UNBIND_SLOTS],
               sizeof batch[i]);
    for (int64_t i = 0; i < avail; i++)
        if (ram_offset(p, batch[i].addr, batch[i].len) < 0) return bad_range(p, "UNBIND", &batch[i]);
    qsort(batch, (size_t)avail, sizeof batch[0], by_addr);
    for (int64_t i = 1; i < avail; i++)
        if (batch[i - 1].addr + batch[i - 1].len > batch[i].addr)
            return fail(p, PC_PAGER_VIOLATION,
                        "pager protocol violation: UNBIND ranges 0x%llx+0x%llx and 0x%llx+0x%llx "
                        "overlap in one batch", (unsigned long long)batch[i - 1].addr,
                        (unsigned long long)batch[i - 1].len, (unsigned long long)batch[i].addr,
                        (unsigned long long)batch[i].len);
    for (int64_t i = 0; i < avail; i++) offs[i] = ram_offset(p, batch[i].addr, batch[i].len);
    for (int64_t i = 0; i < avail; i++) {
        if (discard(p, offs[i], batch[i].len) < 0)
            return fail(p, PC_PAGER_IO_ERROR, "unbinding guest memory: %s", strerror(errno));
        if (p->unbound)
            memset(p->unbound + offs[i] / PC_PAGER_PAGE_SIZE, 1,
                   batch[i].len / PC_PAGER_PAGE_SIZE);
        p->stats->unbind_ranges++;
        p->stats->unbind_pages += batch[i].len / PC_PAGER_PAGE_SIZE;
    }
    p->unbind_cons += (uint32_t)avail;
    __atomic_store_n(&p->shm->unbind.cons, p->unbind_cons, __ATOMIC_RELEASE);
    uint64_t one = 1;
    if (write(p->irq_fd, &one, sizeof one) < 0 && errno != EAGAIN)
        return fail(p, PC_PAGER_IO_ERROR, "interrupting the guest: %s", strerror(errno));
    p->stats->unbind_batches++;
    p->stats->last_reclaim_ns = monotonic_ns() - now_ns;
    return (int)avail;
}

/* At the first doorbell: the guest has written the header by then.  The
 * consumer indices are taken from the rings once, here (zero after a cold
 * boot, the previous host's after a restore), and kept by the host after. */
static int attach(struct pc_pager *p)
{
    struct pc_pager_shm head;
    memcpy(&head, (const void *)p->shm, offsetof(struct pc_pager_shm, guest));
    if (head.magic != PC_PAGER_MAGIC || head.version != PC_PAGER_VERSION ||
        head.unbind_slots != PC_PAGER_UNBIND_SLOTS || head.bind_slots != PC_PAGER_BIND_SLOTS)
        return fail(p, PC_PAGER_VIOLATION,
                    "pager protocol violation: no Pager rings at 0x%x (magic 0x%x version %u)",
                    PC_PAGER_RING_GPA, head.magic, head.version);
    p->unbind_cons = head.unbind.cons;
    p->bind_cons = head.bind.cons;
    p->attached = 1;
    return PC_PAGER_OK;
}

int pc_pager_wakeup(struct pc_pager *p, uint64_t doorbells, uint64_t now_ns)
{
    int more = 0;
    p->stats->doorbells += doorbells;
    if (!p->attached) {
        int rc = attach(p);
        if (rc < 0) return rc;
    }
    /* BIND first: the guest publishes binds older than an UNBIND before it,
     * and populating after punching would only waste memory. */
    int bound = drain_bind(p, &more);
    if (bound < 0) return bound;
    int unbound = drain_unbind(p, now_ns);
    if (unbound < 0) return unbound;
    if (bound == 0 && unbound == 0 && doorbells) {
        if (now_ns - p->idle_window_ns >= NS_PER_S) {
            p->idle_window_ns = now_ns;
            p->idle_doorbells = 0;
        }
        p->idle_doorbells += doorbells;
        if (p->idle_doorbells > PC_PAGER_MAX_IDLE_WAKEUPS)
            return fail(p, PC_PAGER_VIOLATION,
                        "pager protocol violation: doorbell storm (%llu doorbells with no work "
                        "within a second)", (unsigned long long)p->idle_doorbells);
    }
    return more ? 1 : PC_PAGER_OK;
}

static void *serve(void *arg)
{
    struct pc_pager *p = arg;
    int rc = PC_PAGER_OK;
    for (;;) {
        struct pollfd pfd[2] = {{.fd = p->doorbell_fd, .events = POLLIN},
                                {.fd = p->stop_fd, .events = POLLIN}};
        /* Leftover BIND work runs again at once; otherwise wait. */
        if (poll(pfd, 2, rc == 1 ? 0 : -1) < 0) {
            if (errno == EINTR) continue;
            rc = fail(p, PC_PAGER_IO_ERROR, "poll: %s", strerror(errno));
            break;
        }
        if (pfd[1].revents) return NULL;
        uint64_t doorbells = 0;
        if (pfd[0].revents && read(p->doorbell_fd, &doorbells, sizeof doorbells) < 0 &&
            errno != EAGAIN) {
            rc = fail(p, PC_PAGER_IO_ERROR, "reading the doorbell: %s", strerror(errno));
            break;
        }
        pthread_mutex_lock(p->gate);
        rc = pc_pager_wakeup(p, doorbells, monotonic_ns());
        pthread_mutex_unlock(p->gate);
        if (rc < 0) break;
    }
    if (rc == PC_PAGER_VIOLATION) p->stats->violations++;
    /* Inside QEMU the shim cannot read this struct: the reason goes to qemu.log. */
    if (p->in_vmm) fprintf(stderr, "paracell pager: %s\n", p->error);
    uint64_t one = 1;
    if (write(p->abort_fd, &one, sizeof one) < 0) { /* the relay still sees QEMU go */ }
    return NULL;
}

int pc_pager_start(struct pc_pager *p)
{
    if (!p->ram_map) return PC_PAGER_OK;  /* served inside QEMU (pc_pager_open) */
    /* The thread is born with every signal blocked: signals sent to the shim
     * (SIGWINCH, SIGTERM, ...) must reach its relay's signalfd, never this
     * thread, where SIGTERM's default action would end the whole shim. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t t;
    int err = pthread_create(&t, NULL, serve, p);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err) return fail(p, PC_PAGER_IO_ERROR, "starting the Pager thread: %s", strerror(err));
    p->thread = (unsigned long)t;
    p->running = 1;
    return PC_PAGER_OK;
}

void pc_pager_pause(struct pc_pager *p)
{
    if (p->gate) pthread_mutex_lock(p->gate);
}

void pc_pager_resume(struct pc_pager *p, int reattach)
{
    if (!p->gate) return;
    if (reattach) p->attached = 0;
    pthread_mutex_unlock(p->gate);
}

void pc_pager_close(struct pc_pager *p)
{
    if (p->running) {
        uint64_t one = 1;
        if (write(p->stop_fd, &one, sizeof one) < 0) { /* join below still ends it */ }
        pthread_join((pthread_t)p->thread, NULL);
        p->running = 0;
    }
    /* Inside QEMU the RAM mapping and the eventfds are QEMU's, lent. */
    if (p->ram_map && !p->in_vmm) munmap(p->ram_map, p->ram_size);
    if (p->stats) munmap(p->stats, sizeof *p->stats);
    p->ram_map = NULL;
    p->shm = NULL;
    p->stats = NULL;
    free(p->unbound);
    p->unbound = NULL;
    close_fd(&p->ram_fd);
    close_fd(&p->token_fd);
    close_fd(&p->stop_fd);
    if (!p->in_vmm) {
        close_fd(&p->doorbell_fd);
        close_fd(&p->irq_fd);
        close_fd(&p->abort_fd);
    }
    if (p->gate) {
        pthread_mutex_destroy(p->gate);
        free(p->gate);
        p->gate = NULL;
    }
}

void pc_pager_take_unbound(struct pc_pager *p, uint8_t *changed)
{
    if (!p->unbound) return;
    uint64_t pages = p->ram_size / PC_PAGER_PAGE_SIZE;
    for (uint64_t i = 0; i < pages; i++)
        changed[i] |= p->unbound[i];
    memset(p->unbound, 0, pages);
    /* The rings: this thread stores the consumer indices there, through its
     * own mapping, which QEMU's log of writes never sees. */
    memset(changed + PC_PAGER_RING_GPA / PC_PAGER_PAGE_SIZE, 1,
           PC_PAGER_SHM_SIZE / PC_PAGER_PAGE_SIZE);
}
