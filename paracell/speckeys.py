"""The launch spec's record keys, read from proto/launch_spec.h, their one
definition: `speckeys.ARG` is PC_KEY_ARG ("arg"). The agent compares against
the same macros, so no key is ever typed twice."""

from __future__ import annotations

_known: dict[str, str] = {}


def __getattr__(name: str) -> str:
    if name not in _known:
        from paracell import wire

        try:
            _known[name] = wire.text(f"PC_KEY_{name}")
        except AttributeError:
            raise AttributeError(f"proto/launch_spec.h has no PC_KEY_{name}") from None
    return _known[name]
