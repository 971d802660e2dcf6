"""The launch spec's records: their keys, read from proto/launch_spec.h, their
one definition (`speckeys.ARG` is PC_KEY_ARG, "arg"; the agent compares
against the same macros, so no key is ever typed twice), and `encode`, the
one writer of a payload of records (KEY=VALUE\0 ...): the SPEC, the
SANDBOX, FORKED and a START's late interfaces."""

from __future__ import annotations

from paracell.errors import ParacellError

_known: dict[str, str] = {}


class NulInRecord(ParacellError):
    """A value with a NUL byte, which would end its record early."""

    def __init__(self, key: str) -> None:
        super().__init__(f"{key} contains a NUL byte")
        self.key = key


def encode(records: list[tuple[str, str]]) -> bytes:
    from paracell._native import lib

    out = bytearray()
    for key, value in records:
        if "\0" in value:
            raise NulInRecord(key)
        out += f"{key}={value}".encode() + b"\0"
    if len(out) > lib.PC_MAX_PAYLOAD:
        raise ParacellError(
            "process spec is too large for the agent channel "
            f"({len(out)} > {lib.PC_MAX_PAYLOAD} bytes)"
        )
    return bytes(out)


def __getattr__(name: str) -> str:
    if name not in _known:
        from paracell import wire

        try:
            _known[name] = wire.text(f"PC_KEY_{name}")
        except AttributeError:
            raise AttributeError(f"proto/launch_spec.h has no PC_KEY_{name}") from None
    return _known[name]
