#include "execargs.h"

#include <errno.h>
#include <stdlib.h>

int pc_arg_long(const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int pc_arg_mask(const char *s, unsigned long long *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-') return -1;
    *out = v;
    return 0;
}

void pc_relay_stdio(struct pc_relay_cfg *cfg, int tty_fd)
{
    cfg->tty_fd = tty_fd;
    cfg->err_fd = 2;
    if (tty_fd >= 0) {
        cfg->in_fd = cfg->out_fd = tty_fd;
    } else {
        cfg->in_fd = 0;
        cfg->out_fd = 1;
    }
}
