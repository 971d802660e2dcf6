"""The default config.json that `paracell spec` writes, and the example bundles
(a busybox rootfs from Debian's busybox-static) the demo and tests use."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from paracell.errors import ParacellError

BUSYBOX = Path("/bin/busybox")
DEFAULT_CAPS = ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]


def default_config(args: list[str] | None = None, terminal: bool = False) -> dict[str, Any]:
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": terminal,
            "user": {"uid": 0, "gid": 0},
            "args": args or ["sh"],
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "TERM=xterm"],
            "cwd": "/",
            "capabilities": {k: list(DEFAULT_CAPS) for k in
                             ("bounding", "effective", "permitted", "ambient")},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": True,
        },
        "root": {"path": "rootfs", "readonly": True},
        "hostname": "paracell",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
             "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
             "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs",
             "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "nodev", "mode=1777"]},
        ],
        "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount")]},
    }


def write(bundle: str) -> None:
    path = Path(bundle) / "config.json"
    if path.exists():
        raise ParacellError(f"File {path} exists. Remove it first")
    path.write_text(json.dumps(default_config(), indent=2) + "\n")


def busybox_rootfs(rootfs: Path) -> Path:
    """A busybox rootfs with one symlink per applet; rebuilt only when missing."""
    if not BUSYBOX.exists():
        raise ParacellError(f"{BUSYBOX} not found: install Debian's busybox-static")
    marker = rootfs / "bin" / "busybox"
    if marker.exists():
        return rootfs
    for d in ("bin", "sbin", "usr/bin", "usr/sbin", "etc", "proc", "sys", "dev", "tmp", "root",
              "home", "var", "run"):
        (rootfs / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2(BUSYBOX, marker)
    listing = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True)
    applets = listing.stdout.split()
    for applet in applets:
        link = rootfs / "bin" / applet
        if applet != "busybox" and not link.exists():
            link.symlink_to("busybox")
    (rootfs / "etc" / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")
    (rootfs / "etc" / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
    return rootfs


def example_bundle(directory: Path, args: list[str], readonly: bool = True) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    busybox_rootfs(directory / "rootfs")
    config = default_config(args)
    config["root"]["readonly"] = readonly
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory
