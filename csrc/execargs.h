/* What the relay's executables (csrc/relayexec.c, csrc/vmshimexec.c) share:
 * their numeric arguments, which a Python stand-in passes them through
 * execv, and the process's stdio as the relay sees it. */
#ifndef PARACELL_EXECARGS_H
#define PARACELL_EXECARGS_H

#include "relay.h"

/* 0 and *out set, or -1: s is not a decimal in lo..hi. */
int pc_arg_long(const char *s, long long lo, long long hi, long long *out);
/* 0 and *out set, or -1: s is not an unsigned decimal (a signal mask). */
int pc_arg_mask(const char *s, unsigned long long *out);
/* The process's stdio: the host pty slave tty_fd (its output and input both
 * on it, the relay's own lines on fd 2), or fds 0-2 when tty_fd is -1. */
void pc_relay_stdio(struct pc_relay_cfg *cfg, int tty_fd);

#endif
