"""Builds and finds the guest kernel and initramfs, cached by a hash of their inputs.

`paracell guest build` hashes every input, builds what is missing and records
the result in `current.json`; the runtime only reads that record, so starting a
container never hashes a 130 MB source tarball.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from paracell import settings
from paracell.errors import ParacellError
from paracell.guest import cpio

REPO_ROOT = Path(__file__).resolve().parents[2]
GUEST_SRC = REPO_ROOT / "guest"
KERNEL_TARBALL = Path("/usr/src/linux-source-6.1.tar.xz")
PROTO_SRC = REPO_ROOT / "proto"
AGENT_CFLAGS = ["-static", "-Os", "-Wall", "-Wextra", "-Werror"]
# The agent makes its share mount points itself, after it leaves the initramfs.
INITRAMFS_DIRS = ("dev", "proc", "sys", "tmp")


@dataclass(frozen=True)
class GuestArtifacts:
    kernel: Path
    initramfs: Path
    kernel_key: str
    initramfs_key: str


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _tarball_digest(tarball: Path) -> str:
    """The tarball's hash, remembered per (size, mtime) because hashing it takes seconds."""
    st = tarball.stat()
    memo = settings.cache_dir() / "tarball-digests.json"
    stamp = f"{tarball}:{st.st_size}:{st.st_mtime_ns}"
    try:
        known = json.loads(memo.read_text())
    except (OSError, ValueError):
        known = {}
    if stamp not in known:
        known[stamp] = _sha256_file(tarball)
        _atomic_write(memo, json.dumps(known).encode())
    return known[stamp]


def _hash_inputs(parts: list[tuple[str, bytes]]) -> str:
    digest = hashlib.sha256()
    for name, data in parts:
        digest.update(name.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()[:20]


def _patch_paths() -> list[Path]:
    lines = (GUEST_SRC / "kernel" / "series").read_text().splitlines()
    return [GUEST_SRC / ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


def kernel_key(tarball: Path = KERNEL_TARBALL) -> str:
    files = [GUEST_SRC / "kernel" / n for n in ("build.sh", "paracell.config", "series")]
    files += _patch_paths()
    parts = [(str(p.relative_to(REPO_ROOT)), p.read_bytes()) for p in files]
    parts.append(("tarball", _tarball_digest(tarball).encode()))
    return _hash_inputs(parts)


def _agent_sources() -> list[Path]:
    agent = GUEST_SRC / "agent"
    return sorted([*agent.glob("*.c"), *agent.glob("*.h"), *PROTO_SRC.glob("*.h")])


def _gcc_version() -> bytes:
    out = subprocess.run(["gcc", "--version"], capture_output=True, check=True)
    return out.stdout.splitlines()[0]


def initramfs_key() -> str:
    parts = [(str(p.relative_to(REPO_ROOT)), p.read_bytes()) for p in _agent_sources()]
    parts.append(("gcc", _gcc_version()))
    parts.append(("cflags", " ".join(AGENT_CFLAGS).encode()))
    parts.append(("layout", Path(cpio.__file__).read_bytes() + repr(INITRAMFS_DIRS).encode()))
    return _hash_inputs(parts)


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _log(message: str) -> None:
    print(f"paracell: {message}", file=sys.stderr, flush=True)


def build_kernel(key: str, tarball: Path = KERNEL_TARBALL) -> Path:
    out = settings.cache_dir() / "kernel" / key
    if (out / "bzImage").exists():
        _log(f"kernel {key} is cached")
        return out / "bzImage"
    if not tarball.exists():
        raise ParacellError(f"{tarball} is missing: install Debian's linux-source-6.1")
    _log(f"building kernel {key} from {tarball}")
    build_script = GUEST_SRC / "kernel" / "build.sh"
    result = subprocess.run(["bash", str(build_script), str(tarball), str(out)])
    if result.returncode != 0 or not (out / "bzImage").exists():
        raise ParacellError(f"guest kernel build failed (exit {result.returncode})")
    return out / "bzImage"


def build_initramfs(key: str) -> Path:
    out = settings.cache_dir() / "initramfs" / key / "initramfs.cpio"
    if out.exists():
        _log(f"initramfs {key} is cached")
        return out
    _log(f"building agent and initramfs {key}")
    agent = out.with_name("agent")
    out.parent.mkdir(parents=True, exist_ok=True)
    sources = [str(p) for p in _agent_sources() if p.suffix == ".c"]
    cmd = ["gcc", *AGENT_CFLAGS, f"-I{PROTO_SRC}", "-o", str(agent), *sources]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise ParacellError(f"agent build failed: {result.stderr.strip().splitlines()[-1:]}")
    entries = [cpio.directory(d) for d in INITRAMFS_DIRS]
    entries.append(cpio.char_device("dev/console", 5, 1))
    entries.append(cpio.executable("init", agent.read_bytes()))
    # Uncompressed on purpose: under TCG, gunzip in the guest costs more than
    # reading a bigger image through fw_cfg.
    _atomic_write(out, cpio.newc_archive(entries))
    return out


def _current_record() -> Path:
    return settings.cache_dir() / "current.json"


def build_all() -> GuestArtifacts:
    kkey, ikey = kernel_key(), initramfs_key()
    artifacts = GuestArtifacts(build_kernel(kkey), build_initramfs(ikey), kkey, ikey)
    record = {
        "kernel": str(artifacts.kernel),
        "initramfs": str(artifacts.initramfs),
        "kernel_key": kkey,
        "initramfs_key": ikey,
    }
    _atomic_write(_current_record(), json.dumps(record, indent=2).encode())
    return artifacts


def current() -> GuestArtifacts:
    """The last built artifacts; cheap, for every container start."""
    try:
        record = json.loads(_current_record().read_text())
        artifacts = GuestArtifacts(
            Path(record["kernel"]), Path(record["initramfs"]),
            record["kernel_key"], record["initramfs_key"],
        )
    except (OSError, ValueError, KeyError, TypeError):
        raise ParacellError("guest artifacts are not built: run `paracell guest build`") from None
    if not (artifacts.kernel.exists() and artifacts.initramfs.exists()):
        raise ParacellError("guest artifacts are missing: run `paracell guest build`")
    return artifacts


def freshness() -> dict[str, object]:
    """For `paracell check`: are the recorded artifacts built from today's inputs?"""
    try:
        art = current()
    except ParacellError as err:
        return {"built": False, "detail": str(err)}
    up_to_date = art.kernel_key == kernel_key() and art.initramfs_key == initramfs_key()
    return {
        "built": True,
        "up_to_date": up_to_date,
        "kernel": str(art.kernel),
        "initramfs": str(art.initramfs),
    }
