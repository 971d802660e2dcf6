"""Typed JSON records: what state.json and a saved VM hold."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class Record:
    """A JSON object with known fields and defaults. Plain classes, not
    dataclasses: `state` and `kill` run on every containerd poll, and
    dataclasses/pathlib would double their start-up."""

    FIELDS: dict[str, Any] = {}
    NESTED: dict[str, type[Record]] = {}

    def __init__(self, **values: Any) -> None:
        unknown = set(values) - set(self.FIELDS)
        if unknown:
            raise TypeError(f"unknown fields {sorted(unknown)}")
        for name, default in self.FIELDS.items():
            value = values.get(name, default)
            if name in self.NESTED:
                kind = self.NESTED[name]
                value = value if isinstance(value, kind) else kind(**(value or {}))
            elif value is default and isinstance(default, (dict, list)):
                value = type(default)()
            elif type(value) is not type(default):
                raise TypeError(f"field {name} must be {type(default).__name__}")
            setattr(self, name, value)

    def as_dict(self) -> dict[str, Any]:
        return {name: (getattr(self, name).as_dict() if name in self.NESTED
                       else getattr(self, name)) for name in self.FIELDS}
