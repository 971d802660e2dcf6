"""The host process that stands for a container process: the one body of
the shim (a VM's init), a pod member's proxy (an init in its pod's VM) and
an exec proxy (any other process).

Its pid is what a client waits on and signals; it relays the process's
stdio and signals and exits with its status. Each kind says how it opens its
process, how it relays, and how it closes; the order and the commit rule are
here, once:
1. open: make the process in the guest (and, for the shim, the VM);
2. report: the pid, or why it failed, to the verb that spawned it;
3. commit: a stand-in for an init waits until `create` has recorded its pid
   in the state; if `create` died first, nobody could ever delete the
   container, so the stand-in ends it instead. An exec proxy is recorded by
   nobody and never waits;
4. run, then close, whatever happened.
"""

from __future__ import annotations

from typing import Protocol

from paracell.errors import ParacellError
from paracell.runtime.vm.spawn import Handshake, Ready

EXIT_RUNTIME_ERROR = 255


class StandIn(Protocol):
    # Whether create records this pid as the container's, and so whether it
    # must wait for that record before it runs.
    needs_commit: bool

    def open(self) -> Ready:
        """The process exists in the guest; what to report. Raises
        ParacellError or OSError, reported as the failure."""

    def run(self) -> int:
        """Relays until the process ends; its exit status."""

    def close(self) -> None:
        """Idempotent cleanup, also after a failed open."""


def describe(err: BaseException) -> str:
    if isinstance(err, OSError) and err.strerror:
        return f"{err.filename}: {err.strerror}" if err.filename else err.strerror
    return str(err)


def serve(handshake: Handshake, stand_in: StandIn) -> int:
    """Runs the stand-in to the end; its exit status."""
    if not stand_in.needs_commit:
        handshake.no_commit()
    try:
        ready = stand_in.open()
    except (ParacellError, OSError) as err:
        handshake.report(Ready(error=describe(err)))
        stand_in.close()
        return EXIT_RUNTIME_ERROR
    try:
        handshake.report(ready)
        committed = handshake.committed() if stand_in.needs_commit else True
    except OSError:
        committed = False
    if not committed:
        stand_in.close()
        return EXIT_RUNTIME_ERROR
    try:
        return stand_in.run()
    finally:
        stand_in.close()
