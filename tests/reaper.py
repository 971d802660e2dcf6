"""Runs a command as a child subreaper that reaps every orphan at once, and
exits with the command's status; SIGTERM is passed on to the command.

The private libvirtd runs under it (tests/libvirtd.py): libvirt daemonizes
each QEMU, whose parent is then the nearest subreaper, and libvirt counts a
domain as stopped only once its QEMU is reaped. On a host whose PID 1 is
systemd that is at once; this machine's PID 1 reaps late (by seconds).

usage: python -m tests.reaper COMMAND...
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_CHILD_SUBREAPER = 36


def main() -> int:
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    child = os.fork()
    if child == 0:
        os.execvp(sys.argv[1], sys.argv[1:])
    signal.signal(signal.SIGTERM, lambda *_: os.kill(child, signal.SIGTERM))
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 0
        except InterruptedError:
            continue
        if pid == child:
            return os.waitstatus_to_exitcode(status) & 0xFF


if __name__ == "__main__":
    sys.exit(main())
