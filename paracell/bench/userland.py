"""A real userland for `paracell bench memory`: Debian's own python3, its
standard library and the shared libraries it loads, copied from this host's
packages into a busybox rootfs, so no download is needed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from paracell.bench import common
from paracell.runtime.bundle import defaultspec

PYTHON = Path("/usr/bin/python3")
SCRIPT = Path(__file__).resolve().parent / "programs" / "agent_workload.py"
SKIP = shutil.ignore_patterns("test", "tests", "idlelib", "tkinter", "turtledemo", "ensurepip",
                              "lib2to3", "config-*")


def _libraries(binary: Path) -> list[Path]:
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        words = line.split()
        path = words[2] if "=>" in words and len(words) > 2 else words[0]
        if path.startswith("/"):
            found.append(Path(path))
    return found


def rootfs() -> Path:
    """Built once into the bench cache; the script is refreshed each time."""
    root = common.bench_dir() / "userland-rootfs"
    python = PYTHON.resolve()
    if not (root / python.relative_to("/")).exists():
        shutil.rmtree(root, ignore_errors=True)
        defaultspec.busybox_rootfs(root)
        stdlib = Path(f"/usr/lib/python{sys.version_info.major}.{sys.version_info.minor}")
        shutil.copytree(stdlib, root / stdlib.relative_to("/"), symlinks=True, ignore=SKIP)
        for lib in _libraries(python):
            target = root / lib.relative_to("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(lib.resolve(), target)
        (root / python.relative_to("/")).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(python, root / python.relative_to("/"))
    dest = root / "usr" / "local" / "bin"
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(SCRIPT, dest / SCRIPT.name)
    return root


def command(rounds: int, items: int) -> list[str]:
    return [str(PYTHON.resolve()), "-B", f"/usr/local/bin/{SCRIPT.name}", str(rounds), str(items)]
