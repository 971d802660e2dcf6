"""rtnetlink work in a short-lived child of the shim.

pyroute2 costs a process about 25 MiB once imported, and a shim lives as
long as its container: that was most of a pod's shim memory. So the shim
forks a child, in the same namespaces, that loads pyroute2, does the work,
hands back its result and the fds it opened (a TAP's, which must outlive it)
over a socketpair, and exits. Only our own forked code is on the other end.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
from collections.abc import Callable
from typing import TypeVar

from paracell.errors import ParacellError

T = TypeVar("T")
# The result: interfaces with their addresses and routes, within the agent's bounds.
MAX_RESULT = 1 << 20
MAX_FDS = 64
# Netlink answers in milliseconds; pyroute2's import takes a fraction of a
# second under load. A child silent this long is stuck, and is killed.
TIMEOUT_S = 60.0


def run(work: Callable[[], tuple[T, list[int]]]) -> tuple[T, list[int]]:
    """work() in a child: its result, and the fds it returned, now ours.
    Its ParacellError is raised here, with the same line."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        try:
            ours.close()
            try:
                result, fds = work()
                message = pickle.dumps(("ok", result))
            except ParacellError as err:
                message, fds = pickle.dumps(("error", str(err))), []
            except BaseException as err:  # whatever it is, one line in the parent
                message, fds = pickle.dumps(("error", f"{type(err).__name__}: {err}")), []
            socket.send_fds(theirs, [message], fds)
        finally:
            os._exit(0)
    theirs.close()
    try:
        with ours:
            ours.settimeout(TIMEOUT_S)
            message, fds, _, _ = socket.recv_fds(ours, MAX_RESULT, MAX_FDS)
    except TimeoutError:
        os.kill(pid, signal.SIGKILL)
        raise ParacellError("setting up the VM's network: its helper process did not answer "
                            f"in {TIMEOUT_S:g} s") from None
    finally:
        os.waitpid(pid, 0)
    if not message:
        for fd in fds:
            os.close(fd)
        raise ParacellError("setting up the VM's network: its helper process died")
    kind, value = pickle.loads(message)
    if kind != "ok":
        raise ParacellError(value)
    return value, fds
