"""Linux ABI numbers Python's os module does not carry (from <sys/mount.h>),
and the one handle on libc for the calls it lacks (mount, setns, unshare)."""

from __future__ import annotations

import ctypes

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_SLAVE = 1 << 19
MS_SHARED = 1 << 20
MNT_DETACH = 2

_libc: ctypes.CDLL | None = None


def libc() -> ctypes.CDLL:
    """Loaded once, and before any fork that needs it (QEMU's preexec)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc
