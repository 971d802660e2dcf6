#define _GNU_SOURCE
#include "caps.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <linux/capability.h>

#include "log.h"

/* A kernel that hides the number gets 6.1's. */
static int last_cap = 40;

void caps_init(void)
{
    char buf[16] = "";
    int fd = open("/proc/sys/kernel/cap_last_cap", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    int v = n > 0 ? atoi(buf) : 0;
    if (v > 0 && v < 64)
        last_cap = v;
}

static uint64_t known(void)
{
    return last_cap >= 63 ? ~0ull : (1ull << (last_cap + 1)) - 1;
}

int caps_drop_bounding(uint64_t keep, int *failed)
{
    for (int c = 0; c <= last_cap; c++)
        if (!(keep >> c & 1) && prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0) {
            *failed = c;
            return -1;
        }
    return 0;
}

int caps_set(uint64_t eff, uint64_t perm, uint64_t inh)
{
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2];
    eff &= known();
    perm &= known();
    inh &= known();
    for (int i = 0; i < 2; i++) {
        d[i].effective = (uint32_t)(eff >> (32 * i));
        d[i].permitted = (uint32_t)(perm >> (32 * i));
        d[i].inheritable = (uint32_t)(inh >> (32 * i));
    }
    return syscall(SYS_capset, &hdr, d) < 0 ? -1 : 0;
}

int caps_set_ambient(uint64_t want)
{
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0)
        return -1;
    /* runc only warns here: an ambient cap needs to be permitted and
     * inheritable, and configs often ask for more. */
    for (int c = 0; c <= last_cap; c++)
        if (want >> c & 1 && prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, c, 0, 0) < 0)
            logmsg("cannot raise ambient capability %d: %s", c, strerror(errno));
    return 0;
}
