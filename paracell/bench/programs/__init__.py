"""Static C programs that benchmarks and tests copy into a container's rootfs,
compiled once per source hash into the cache."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from paracell import settings
from paracell.errors import ParacellError

HERE = Path(__file__).resolve().parent


def built(name: str) -> Path:
    source = HERE / f"{name}.c"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:20]
    exe = settings.cache_dir() / "programs" / digest / name
    if not exe.exists():
        exe.parent.mkdir(parents=True, exist_ok=True)
        tmp = exe.with_suffix(".tmp")
        result = subprocess.run(["gcc", "-static", "-O2", "-Wall", "-Wextra", "-Werror",
                                 "-o", str(tmp), str(source)], capture_output=True, text=True)
        if result.returncode != 0:
            raise ParacellError(f"compiling {source.name}: {result.stderr.strip()}")
        tmp.rename(exe)
    return exe


def install(name: str, rootfs: Path) -> str:
    """Copies the program into rootfs/usr/local/bin; returns its path in the container."""
    dest = rootfs / "usr" / "local" / "bin"
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(built(name), dest / name)
    return f"/usr/local/bin/{name}"


def busybox_rootfs_with(name: str, root: Path) -> Path:
    """A busybox rootfs at root (made once) holding the program `name`."""
    from paracell.runtime.bundle import defaultspec

    if not (root / "bin" / "busybox").exists():
        shutil.rmtree(root, ignore_errors=True)
        defaultspec.busybox_rootfs(root)
    install(name, root)
    return root
