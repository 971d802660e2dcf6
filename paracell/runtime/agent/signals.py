"""Signal names and the set the shim forwards into the guest.

The shim relays every signal in FORWARDED that it receives to the container's
init, so `kill` can simply signal the shim; the C relay gets this set as a
mask, so the two can never disagree.
"""

from __future__ import annotations

from paracell.errors import ParacellError

# Never forwarded: uncatchable, the shim's own faults, job control of the
# shim's terminal, and SIGCHLD/SIGPIPE/SIGWINCH/SIGURG, which mean something
# to the shim itself (SIGWINCH becomes a RESIZE instead). Numbers, not
# signal.SIG*: the signal module drags in enum, and `kill` must start fast.
SIGKILL = 9
_NEVER = {
    SIGKILL, 19,  # SIGSTOP
    17, 13,  # SIGCHLD, SIGPIPE
    11, 7, 4, 8, 5, 31,  # SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS
    23, 21, 22, 28,  # SIGURG, SIGTTIN, SIGTTOU, SIGWINCH
}
FORWARDED = frozenset(s for s in range(1, 32) if s not in _NEVER)


def forward_mask() -> int:
    return sum(1 << s for s in FORWARDED)


def parse_signal(value: str) -> int:
    text = value.strip().upper()
    if text.isdigit():
        number = int(text)
    else:
        import signal

        name = text if text.startswith("SIG") else f"SIG{text}"
        member = getattr(signal.Signals, name, None) if name.isidentifier() else None
        if member is None:
            raise ParacellError(f"invalid signal: {value}")
        number = int(member)
    if not 0 < number < 65:
        raise ParacellError(f"invalid signal: {value}")
    return number


def exit_status_for_signal(signo: int) -> int:
    """A process killed by signo exits with this status, as shells and runc report it."""
    return 128 + signo
