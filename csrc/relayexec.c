/* paracell-relay: what an exec proxy or a pod member's proxy becomes once
 * its process is made in the guest. The Python stand-in does the protocol's
 * opening (runtime/vm/standin.py), then execs this, keeping its pid, its
 * fds and its blocked signals, so that for the rest of the process's life
 * the host holds a relay of a few hundred KiB instead of a Python process
 * of tens of MiB per container and per exec.
 *
 * argv: CHAN_FD TTY_FD CONTROL_FD FORWARD_MASK NET_RECORD TAP_PREFIX PYTHON [UNLINK_PATH...]
 *   CHAN_FD       the shim's connection for this process
 *   TTY_FD        the host pty slave to relay, or -1 for fds 0-2
 *   CONTROL_FD    a member's listening start/kill socket, or -1
 *   FORWARD_MASK  bit n: relay signal n to the process
 *   NET_RECORD    a container in a pooled VM whose network namespace (this
 *                 process's) may hold interfaces at `start`: its network
 *                 record (csrc/latenet.h, docs/pool.md); "-" for none
 *   TAP_PREFIX    the name of our TAPs
 *   PYTHON        the interpreter that runs paracell.net.latestart
 *   UNLINK_PATH   removed at the end (the exec's marker, the control socket)
 *
 * An exec's stand-in sent START before it said it was ready, as `runc exec
 * --detach` returns once its process runs; a member's shim starts it.
 *
 * Exits with the process's status; when its end is unknown (the channel was
 * lost), says why on stderr and exits 137, as the Python relay does
 * (runtime/agent/channel.py: relay_status). */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent_proto.h"
#include "execargs.h"
#include "latenet.h"
#include "relay.h"

#define EXIT_USAGE 255
#define EXIT_CHANNEL_LOST (128 + 9)

int main(int argc, char **argv)
{
    long long chan, tty, control;
    unsigned long long mask;
    if (argc < 8 || pc_arg_long(argv[1], 0, INT_MAX, &chan) ||
        pc_arg_long(argv[2], -1, INT_MAX, &tty) || pc_arg_long(argv[3], -1, INT_MAX, &control) ||
        pc_arg_mask(argv[4], &mask)) {
        fprintf(stderr, "paracell-relay: usage: CHAN_FD TTY_FD CONTROL_FD "
                        "FORWARD_MASK NET_RECORD TAP_PREFIX PYTHON [UNLINK_PATH...]\n");
        return EXIT_USAGE;
    }
    struct pc_relay_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.chan_fd = (int)chan;
    cfg.listen_fd = -1;
    cfg.control_fd = (int)control;
    cfg.abort_fd = -1;
    cfg.lease_fd = -1;
    cfg.forward_mask = mask;
    if (strcmp(argv[5], "-") != 0) {
        pc_late_configure(argv[5], argv[6], argv[7]);
        cfg.start_payload = pc_late_payload;
    }
    pc_relay_stdio(&cfg, (int)tty);
    struct pc_relay_result res;
    memset(&res, 0, sizeof res);
    pc_relay(&cfg, &res);

    for (int i = 8; i < argc; i++) unlink(argv[i]);
    if (res.end == PC_END_EXIT) return res.status & 0xFF;
    res.message[sizeof res.message - 1] = '\0';
    dprintf(2, "paracell: %s\n",
            res.message[0] ? res.message : "the session ended without an exit status");
    return EXIT_CHANNEL_LOST;
}
