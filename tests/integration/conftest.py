"""Fixtures of the integration tests that more than one module uses."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

# The container's init (memfill.c): MIB of memory filled with a pattern of
# a seed, /data holding the seed; SIGUSR1 moves both on, and /report says
# what the process holds (tests/integration/snapshots.py reads it).
MEMFILL = Path(__file__).with_name("memfill.c")


@pytest.fixture
def memfill_rootfs(writable_rootfs: Path) -> Path:
    subprocess.run(["gcc", "-O2", "-static", "-o", str(writable_rootfs / "bin" / "memfill"),
                    str(MEMFILL)], check=True, capture_output=True)
    return writable_rootfs
