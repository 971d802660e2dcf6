"""`kill`: the one implementation, for the fast path and the full CLI alike.

Most signals need no socket round trip: the shim relays every signal in
FORWARDED that it receives, and SIGKILL must not depend on the guest's
cooperation (it may be paused, wedged or hostile), so it kills the shim, its
VM with it, and waiters see death by SIGKILL, 137, as with runc. Only the
rest (--all, signals the shim keeps for itself) go through the shim's socket.
Import-light: containerd calls `kill` often.
"""

from __future__ import annotations

import os

from paracell.procfs import kill_same
from paracell.runtime.agent.signals import FORWARDED, SIGKILL
from paracell.runtime.state import status

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from paracell.runtime.context import Context
    from paracell.runtime.state.store import ContainerState, StateStore


def deliver(store: StateStore, container_id: str, sig: int, all_processes: bool,
            through_shim: Callable[[ContainerState], None] | None) -> bool:
    """Signals the container under its lock. Returns False, having done
    nothing, when the signal needs the shim's socket and through_shim is None."""
    with store.locked(container_id):
        state = store.load(container_id)
        # runc signals whatever is left in a stopped container's cgroup, which
        # for a VM is nothing: containerd's shim sends this on every stop.
        if all_processes and status.is_stopped(state.status):
            return True
        status.transition("kill", state.status, container_id)
        if sig in FORWARDED and not all_processes:
            os.kill(state.shim_pid, sig)
        elif sig == SIGKILL:
            kill_same(state.shim_pid, state.shim_start, SIGKILL)
        elif through_shim is not None:
            through_shim(state)
        else:
            return False
    return True


def kill(ctx: Context, container_id: str, sig: int, all_processes: bool) -> None:
    """The full CLI's kill: what the fast path leaves goes through the shim."""
    from paracell.runtime.agent import channel
    from paracell.runtime.state.store import CONTROL_SOCKET

    def through_shim(state: ContainerState) -> None:
        from paracell._native import lib

        channel.control_request(ctx.store.dir(state.id) / CONTROL_SOCKET, lib.PC_SIGNAL,
                                channel.encode_signal(sig, all_processes))

    deliver(ctx.store, container_id, sig, all_processes, through_shim)
