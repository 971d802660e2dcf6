"""Debian's own programs in a test rootfs: the host's binaries, copied with
every shared library `ldd` names, at the paths the host has them. A container
then runs the very iptables, nft or bindfs that Debian ships, with no image to
download; Debian's packages (scripts/install-deps.sh) are the only source."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

# ldd's "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" and the
# loader's "/lib64/ld-linux-x86-64.so.2 (0x...)".
_LDD_PATH = re.compile(r"(/\S+) \(0x[0-9a-f]+\)")
# Host programs are searched here, /usr first, so that on a merged-/usr host
# they land in the rootfs beside busybox's /bin, not over it.
SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_MAX_LINKS = 40


def shared_libraries(elf: Path) -> list[Path]:
    """The libraries the loader would map for `elf`; none for a static one."""
    out = subprocess.run(["ldd", str(elf)], capture_output=True, text=True)
    if out.returncode != 0:  # "not a dynamic executable"
        return []
    return [Path(p) for p in _LDD_PATH.findall(out.stdout)]


def _place(path: Path, rootfs: Path) -> Path:
    """Copies `path` to the same place under rootfs and returns the host file
    it really is. Symlinks are recreated and followed, because a multi-call
    binary (xtables-legacy-multi as iptables-legacy) dispatches on its name."""
    for _ in range(_MAX_LINKS):
        target = rootfs / str(path).lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            link = os.readlink(path)
            if not (target.is_symlink() and os.readlink(target) == link):
                if target.is_symlink() or target.exists():
                    target.unlink()
                target.symlink_to(link)
            path = Path(os.path.normpath(path.parent / link))
            continue
        if target.is_symlink():  # e.g. a busybox applet the host program replaces
            target.unlink()
        if not target.exists():
            shutil.copy2(path, target)
        return path
    raise OSError(f"{path}: more than {_MAX_LINKS} symbolic links")


def install_file(path: Path, rootfs: Path) -> None:
    """One host file, and for an ELF file every library it needs."""
    real = _place(path, rootfs)
    with real.open("rb") as f:
        elf = f.read(4) == b"\x7fELF"
    if elf:
        for lib in shared_libraries(real):
            _place(lib, rootfs)


def install_programs(rootfs: Path, programs: Iterable[str],
                     plugin_dirs: Iterable[Path] = ()) -> None:
    """Host programs by name, and whole directories of what they dlopen()
    (which ldd cannot see: iptables' xtables/ extensions), into rootfs."""
    for name in programs:
        found = shutil.which(name, path=SEARCH_PATH)
        if found is None:
            raise FileNotFoundError(f"{name}: not installed on the host "
                                    "(scripts/install-deps.sh installs it)")
        install_file(Path(found), rootfs)
    for directory in plugin_dirs:
        for path in sorted(directory.iterdir()):
            install_file(path, rootfs)
