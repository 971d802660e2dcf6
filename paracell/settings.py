"""Where ParaCell keeps its files, and the environment knobs that move them."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

DEFAULT_ROOT = "/run/paracell"


def cache_dir() -> Path:
    """Guest artifacts live outside the repo, keyed by content, shared by checkouts."""
    from pathlib import Path

    override = os.environ.get("PARACELL_CACHE")
    if override:
        return Path(override)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "paracell"


def memory_dir() -> Path:
    """Guest RAM files must sit on tmpfs: on disk every guest write would be written back."""
    from pathlib import Path

    return Path(os.environ.get("PARACELL_MEMORY_DIR", "/dev/shm/paracell"))


def engine_override() -> str | None:
    return os.environ.get("PARACELL_ENGINE")


def guest_memory_mib() -> int:
    return int(os.environ.get("PARACELL_GUEST_MEMORY_MIB", "256"))
