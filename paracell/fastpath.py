"""The verbs containerd and podman call most (`state`, `kill`), answered
without click, cffi or sockets: a poll of `state` should cost about as much
as starting Python. Anything unusual falls through to the full CLI."""

from __future__ import annotations

import json
import sys

from paracell import globalopts


def split_globals(argv: list[str]) -> tuple[dict[str, str], list[str]] | None:
    """Global options (flags map to "") and what follows them; None if malformed."""
    opts: dict[str, str] = {}
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        arg = argv[i]
        key, eq, value = arg.partition("=")
        if key in globalopts.VALUED:
            if not eq:
                i += 1
                if i >= len(argv):
                    return None
                value = argv[i]
            opts[key] = value
        elif arg in globalopts.FLAGS:
            opts[arg] = ""
        else:
            return None
        i += 1
    return opts, argv[i:]


def _state(root: str, rest: list[str]) -> int | None:
    from paracell.runtime.state.store import StateStore, oci_state

    if len(rest) != 1 or rest[0].startswith("-"):
        return None
    state = StateStore(root).load(rest[0])
    sys.stdout.write(json.dumps(oci_state(state), indent=2) + "\n")
    return 0


def _kill(root: str, rest: list[str]) -> int | None:
    from paracell.runtime.agent.signals import parse_signal
    from paracell.runtime.state.store import StateStore
    from paracell.runtime.verbs import kill

    if not 1 <= len(rest) <= 2 or any(a.startswith("-") for a in rest):
        return None
    sig = parse_signal(rest[1] if len(rest) == 2 else "SIGTERM")
    done = kill.deliver(StateStore(root), rest[0], sig, False, None)
    return 0 if done else None


def run(argv: list[str]) -> int | None:
    """The exit status, or None when the full CLI must handle this call."""
    from paracell.errors import ParacellError
    from paracell.settings import DEFAULT_ROOT

    split = split_globals(argv)
    if split is None or not split[1] or not globalopts.FAST.issuperset(split[0]):
        return None
    opts, (verb, *rest) = split
    handler = {"state": _state, "kill": _kill}.get(verb)
    if handler is None:
        return None
    try:
        return handler(opts.get("--root", DEFAULT_ROOT), rest)
    except ParacellError as err:
        from paracell.log import RuntimeLog

        RuntimeLog(opts.get("--log"), opts.get("--log-format", "text")).error(str(err))
        return err.exit_code
