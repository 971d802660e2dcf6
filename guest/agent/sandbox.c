/* Applying a SANDBOX: the clock, fresh entropy, the hostname, the shares and
 * the interfaces, in that order, once per VM. */
#define _GNU_SOURCE
#include "sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/random.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "net.h"
#include "sandboxspec.h"

/* Options for every 9p share, as the host exports them. */
#define SHARE_OPTS "trans=virtio,version=9p2000.L,msize=262144,cache=mmap,access=client"

static int attached;
static struct sandbox_spec sb;

int sandbox_attached(void)
{
    return attached;
}

/* The host's bytes are credited as entropy, then the CRNG is reseeded at
 * once: every sandbox restored from one template draws its own numbers from
 * the first getrandom() on. */
static int add_entropy(const unsigned char *bytes, size_t n, char *err, size_t errlen)
{
    struct {
        struct rand_pool_info info;
        unsigned char buf[PC_SANDBOX_ENTROPY_MAX];
    } pool;
    pool.info.entropy_count = (int)(n * 8);
    pool.info.buf_size = (int)n;
    memcpy(pool.buf, bytes, n);
    int fd = open("/dev/urandom", O_WRONLY | O_CLOEXEC);
    int rc = fd < 0 ? -1 : ioctl(fd, RNDADDENTROPY, &pool.info);
    if (rc == 0)
        rc = ioctl(fd, RNDRESEEDCRNG);
    int e = errno;
    if (fd >= 0)
        close(fd);
    explicit_bzero(&pool, sizeof pool);
    if (rc < 0) {
        snprintf(err, errlen, "sandbox: entropy: %s", strerror(e));
        return -1;
    }
    return 0;
}

static int apply(struct sandbox_spec *s, char *err, size_t errlen)
{
    if (s->has_clock && clock_settime(CLOCK_REALTIME, &s->clock) < 0) {
        snprintf(err, errlen, "sandbox: clock: %s", strerror(errno));
        return -1;
    }
    if (s->nentropy && add_entropy(s->entropy, s->nentropy, err, errlen) < 0)
        return -1;
    explicit_bzero(s->entropy, sizeof s->entropy);
    if (s->hostname && sethostname(s->hostname, strlen(s->hostname)) < 0) {
        snprintf(err, errlen, "sandbox: sethostname: %s", strerror(errno));
        return -1;
    }
    for (int i = 0; i < PC_SANDBOX_MAX_SHARES; i++) {
        const struct sandbox_share *share = &SANDBOX_SHARES[i];
        if (s->shares[i] && mount(share->tag, share->dir, "9p", 0, SHARE_OPTS) < 0) {
            snprintf(err, errlen, "sandbox: mount %s: %s", share->tag, strerror(errno));
            return -1;
        }
    }
    return net_configure(&s->net, err, errlen);
}

int sandbox_attach(char *buf, size_t len, char *err, size_t errlen)
{
    if (attached) {
        snprintf(err, errlen, "sandbox: this VM is attached already");
        return -1;
    }
    if (sandbox_parse(buf, len, &sb, err, errlen) < 0)
        return -1;
    /* Attached even when applying fails half-way: a second try would meet
     * mounts and devices the first one made. */
    attached = 1;
    if (apply(&sb, err, errlen) < 0)
        return -1;
    logmsg("sandbox attached");
    return 0;
}
