"""The container state machine: the statuses, which verb may run in which
status, where it leads, and the errors for the rest, worded as runc words them
(containerd and podman match on some of them).

Every verb asks this module, the fast path included. Import-light on purpose:
`state` and `kill` run on every containerd poll.
"""

from __future__ import annotations

from paracell.errors import NotRunningError, ParacellError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

CREATING = "creating"  # create holds the lock; the VM is booting
CREATED = "created"    # the VM is up, the process waits for start
RUNNING = "running"
PAUSED = "paused"      # vCPUs stopped
STOPPED = "stopped"    # the process ended, or its shim or creator died

ALL = frozenset({CREATING, CREATED, RUNNING, PAUSED, STOPPED})
# While in these, the shim is the container: if it is gone, the container stopped.
SHIM_LIVE = frozenset({CREATED, RUNNING, PAUSED})

# verb -> {status it may run in: status it leads to}
_TRANSITIONS: dict[str, dict[str, str]] = {
    "start": {CREATED: RUNNING},
    "pause": {RUNNING: PAUSED},
    "resume": {PAUSED: RUNNING},
    "kill": {CREATED: CREATED, RUNNING: RUNNING, PAUSED: PAUSED},
    "exec": {CREATED: CREATED, RUNNING: RUNNING},
    "ps": {CREATED: CREATED, RUNNING: RUNNING, PAUSED: PAUSED},
    "update": {CREATED: CREATED, RUNNING: RUNNING, PAUSED: PAUSED},
    "delete": {CREATED: STOPPED, STOPPED: STOPPED},
    "checkpoint": {RUNNING: RUNNING},
    "rollback": {RUNNING: RUNNING},
    # A fork or a restore: its init runs already once its create is done.
    "restored": {CREATED: RUNNING},
    # A pod member's create: its pod's sandbox must be up.
    "join pod": {CREATED: CREATED, RUNNING: RUNNING},
    "delete --force": {s: STOPPED for s in (CREATING, CREATED, RUNNING, PAUSED, STOPPED)},
}


def _refusal(verb: str, status: str, container_id: str) -> ParacellError:
    if verb == "start":
        if status == STOPPED:
            return ParacellError("cannot start a container that has stopped")
        if status == RUNNING:
            return ParacellError("cannot start an already running container")
        return ParacellError(f"cannot start a container in the {status} state")
    if verb == "exec":
        if status == STOPPED:
            return ParacellError("cannot exec in a stopped container")
        if status == PAUSED:
            return ParacellError("cannot exec in a paused container")
    if verb == "resume":
        return ParacellError("container not paused")
    if verb == "delete":
        return ParacellError(
            f"cannot delete container {container_id} that is not stopped: {status}"
        )
    if verb == "join pod":
        return ParacellError(f"pod sandbox {container_id} is {status}, not running")
    return NotRunningError()


def transition(verb: str, status: str, container_id: str) -> str:
    """The status `verb` leads to from `status`, or runc's error for that pair."""
    target = _TRANSITIONS[verb].get(status)
    if target is None:
        raise _refusal(verb, status, container_id)
    return target


def settle(status: str, shim_alive: Callable[[], bool],
           creator_alive: Callable[[], bool]) -> str:
    """What the status really is, given which recorded processes still live: a
    crash can never leave a container that looks alive. The checks read /proc,
    so only the one the status needs runs."""
    if status in SHIM_LIVE and not shim_alive():
        return STOPPED
    if status == CREATING and not creator_alive():
        return STOPPED
    return status


def is_stopped(status: str) -> bool:
    return status == STOPPED


def is_creating(status: str) -> bool:
    """Whether a create holds the container (it has no VM to answer for yet)."""
    return status == CREATING


def stands_for_a_process(status: str) -> bool:
    """Whether the container has a pid (its shim) to show."""
    return status in SHIM_LIVE
