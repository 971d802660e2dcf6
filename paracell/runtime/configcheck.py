"""Type and range checks for config.json fields, with one-line errors that
name the field; shared by the modules that turn parts of it into records."""

from __future__ import annotations

from typing import Any

from paracell.errors import ParacellError


class ConfigError(ParacellError):
    """A bad field; `detail` names it, for callers that check the same fields
    from another source (exec --process, whose file is one process object)."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"invalid config.json: {detail}")
        self.detail = detail


def fail(msg: str) -> ConfigError:
    return ConfigError(msg)


def expect(value: Any, kind: type | tuple[type, ...], where: str) -> Any:
    """value, if it is of kind (a bool is never an int here)."""
    if isinstance(value, bool) and kind is int:
        raise fail(f"{where} must be an integer")
    if not isinstance(value, kind):
        name = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise fail(f"{where} must be of type {name}")
    return value


def uint(value: Any, where: str, limit: int) -> int:
    """An integer in 0..limit."""
    expect(value, int, where)
    if not 0 <= value <= limit:
        raise fail(f"{where} {value} is out of range (0 to {limit})")
    return value


def entries(value: Any, where: str, limit: int) -> list[tuple[str, dict[str, Any]]]:
    """A list of at most limit objects, each with the name errors give it."""
    expect(value, list, where)
    if len(value) > limit:
        raise fail(f"{where} has more than {limit} entries")
    return [(f"{where}[{i}]", expect(item, dict, f"{where}[{i}]")) for i, item in enumerate(value)]
