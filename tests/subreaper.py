"""Runs a command as a child subreaper, as containerd's shim is one, and
waits for the detached process whose pid the command wrote to a pid file:
it is reparented here, so its exit status can be read as containerd reads it.

usage: python -m tests.subreaper PID_FILE COMMAND...
Prints the command's exit code, then the waited process's status (exit code,
or 128+signal), one per line.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

PR_SET_CHILD_SUBREAPER = 36


def main() -> int:
    pid_file, command = sys.argv[1], sys.argv[2:]
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    created = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, timeout=120)
    print(created.returncode, flush=True)
    if created.returncode != 0:
        return 1
    with open(pid_file) as f:
        pid = int(f.read())
    _, raw = os.waitpid(pid, 0)
    status = 128 + os.WTERMSIG(raw) if os.WIFSIGNALED(raw) else os.WEXITSTATUS(raw)
    print(status, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
