"""Guest RAM backing: a sparse file on tmpfs that the runtime creates and owns.

QEMU maps it shared, so the host can see and (with the Pager) release exactly
the pages the guest has touched, by punching holes in this file.

The directory is a private tmpfs mounted with huge=within_size while any RAM
file lives in it: QEMU then maps guest RAM with 2 MiB pages where it can, so
memory the Pager binds back in 2 MiB blocks costs QEMU one fault per block,
not one per 4 KiB page. It is unmounted when its last file goes. Where it
cannot be mounted (no CAP_SYS_ADMIN), plain tmpfs works the same, with
4 KiB pages.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

from paracell import fileanswers, settings
from paracell.linux import MNT_DETACH, libc

TMPFS_OPTIONS = b"huge=within_size,mode=0700,size=100%"
# QEMU loads it for a VM whose RAM is a template's, mapped copy-on-write
# (csrc/ramplugin.c; setup.py builds it).
PLUGIN = Path(__file__).resolve().parent.parent / "_qemu_ram_plugin.so"


def plugin_option(*options: str) -> str:
    """QEMU's `-plugin` value for the RAM plugin with these name=value
    options (QEMU's option syntax: a comma in a value is written twice)."""
    return ",".join([f"file={str(PLUGIN).replace(',', ',,')}", *options])


def plugin_loads(qemu: str) -> bool:
    """Whether this QEMU loads the RAM plugin (Debian's is built with plugins;
    a build without --enable-plugins is not): asked to load it with no
    arguments, the plugin refuses in its own words, and QEMU exits at once.
    Asked once per process and per version of the two files
    (paracell/fileanswers.py)."""
    import subprocess

    def ask() -> bool:
        try:
            out = subprocess.run([qemu, "-display", "none", "-nodefaults", "-M", "none",
                                  "-plugin", plugin_option()], stdin=subprocess.DEVNULL,
                                 capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return "paracell ram plugin:" in out.stderr

    return bool(fileanswers.once("loads the RAM plugin", (qemu, str(PLUGIN)), ask))


def key_for(root: str, container_id: str) -> str:
    """One per (state root, id), since containerd namespaces may reuse an id;
    of fixed length, since an id may be 255 bytes long."""
    return hashlib.sha256(f"{os.path.abspath(root)}\0{container_id}".encode()).hexdigest()[:32]


def path_for(root: str, container_id: str) -> Path:
    return settings.memory_dir() / f"{key_for(root, container_id)}.mem"


def socket_for(root: str, container_id: str, what: str) -> Path:
    """A socket a libvirt domain's QEMU connects to: beside the RAM file, in
    a directory only root enters, and short enough for sun_path."""
    return settings.memory_dir() / f"{key_for(root, container_id)}.{what}"


class _DirLock:
    """Serializes mounting, creating, removing and unmounting in one directory."""

    def __init__(self, directory: Path) -> None:
        self.path = directory.parent / f".{directory.name}.lock"

    def __enter__(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def _is_mount_point(directory: Path) -> bool:
    target = os.path.realpath(directory)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == target for line in f)


def _mount_huge_tmpfs(directory: Path) -> None:
    if directory != settings.memory_dir():
        return  # only the runtime's own directory holds nothing but RAM files
    if _is_mount_point(directory) or any(directory.iterdir()):
        return  # mounted already, or files a mount would hide from their owners
    # Failure only costs 2 MiB mappings: plain tmpfs below works the same.
    libc().mount(b"paracell-ram", str(directory).encode(), b"tmpfs", 0, TMPFS_OPTIONS)


def create_at(path: Path, size_mib: int) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with _DirLock(path.parent):
        _mount_huge_tmpfs(path.parent)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, size_mib << 20)
        finally:
            os.close(fd)


def resident_bytes(path: Path) -> int:
    """Host memory the guest's RAM holds right now: the file's allocated blocks."""
    try:
        return os.stat(path).st_blocks * 512
    except OSError:
        return 0


def remove(path: Path) -> None:
    directory = path.parent
    if not directory.is_dir():
        return
    with _DirLock(directory):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        if _is_mount_point(directory) and not any(directory.iterdir()):
            libc().umount2(str(directory).encode(), MNT_DETACH)
