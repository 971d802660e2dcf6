"""Host resources recorded for cleanup, and their cleanup by kind.

Whatever a container holds on the host outside its state directory (a RAM
file, a share's bind mounts, a TAP, a pod member's directory) is recorded in
its state, as plain JSON facts with a kind, before it is made. Whoever finds
the owner gone (`delete`, `delete --force`, a create that failed halfway)
removes it from the record alone, with no process or socket to ask.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

from paracell.errors import ParacellError


class Reclaimable:
    """A kind of recorded host resource."""

    kind: ClassVar[str]

    @classmethod
    def reclaim(cls, facts: dict[str, Any]) -> None:
        """Idempotent cleanup from recorded facts, by whoever finds the owner gone."""


_KINDS: dict[str, type[Reclaimable]] = {}
R = TypeVar("R", bound=type[Reclaimable])


def reclaimable(cls: R) -> R:
    """Class decorator: makes the kind's recorded facts reclaimable."""
    if _KINDS.setdefault(cls.kind, cls) is not cls:
        raise TypeError(f"two reclaimable kinds named {cls.kind!r}")
    return cls


def reclaim_all(records: list[dict[str, Any]]) -> None:
    """Cleans up every recorded resource, the last made first. A kind no
    module has registered is skipped, as is a record that cannot be read."""
    for entry in reversed(records):
        cls = _KINDS.get(str(entry.get("kind")))
        if cls is None:
            continue
        try:
            cls.reclaim({k: v for k, v in entry.items() if k != "kind"})
        except (KeyError, TypeError, ValueError, OSError, ParacellError):
            # A mangled record of one resource must not keep the others, or
            # the state, from going; what it named is found by name too.
            continue
