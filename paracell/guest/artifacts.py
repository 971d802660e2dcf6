"""Builds and finds the guest kernel and initramfs, cached by a hash of their inputs.

`paracell guest build` hashes every input, builds what is missing and records
the result in `current.json`; the runtime only reads that record, so starting a
container never hashes a 130 MB source tarball.

The kernel key covers guest/kernel/, the patches its `series` lists and the
proto/ headers the kernel build copies in. The
initramfs key covers every file under proto/ and under guest/ but guest/kernel/,
so a new folder there (guest/xgate/, guest/pager/) is an input as soon as it
exists. A folder adds static programs to the initramfs by listing them in its
own `programs` file (format in `guest_programs`); guest/agent/ lists /init.
Keys hash paths relative to the repository, so every checkout gets the same keys.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from paracell import settings
from paracell.errors import ParacellError
from paracell.guest import cpio

REPO_ROOT = Path(__file__).resolve().parents[2]
GUEST_SRC = REPO_ROOT / "guest"
KERNEL_TARBALL = Path("/usr/src/linux-source-6.1.tar.xz")
# Every guest program gets these, plus -I proto and -I for its own folder.
PROGRAM_CFLAGS = ["-static", "-Os", "-Wall", "-Wextra", "-Werror"]
PROGRAMS_FILE = "programs"
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


# proto/ headers that build.sh copies into the kernel tree.
KERNEL_PROTO = [REPO_ROOT / "proto" / "pager_proto.h"]


def _patch_paths() -> list[Path]:
    lines = (GUEST_SRC / "kernel" / "series").read_text().splitlines()
    return [GUEST_SRC / ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


def kernel_key(tarball: Path = KERNEL_TARBALL) -> str:
    files = [GUEST_SRC / "kernel" / n for n in ("build.sh", "paracell.config", "series")]
    files += _patch_paths()
    files += KERNEL_PROTO
    parts = [(str(p.relative_to(REPO_ROOT)), p.read_bytes()) for p in files]
    parts.append(("tarball", _tarball_digest(tarball).encode()))
    return _hash_inputs(parts)


@dataclass(frozen=True)
class GuestProgram:
    """A static program in the initramfs, built from C sources of one guest/ folder."""

    dest: str  # its path inside the initramfs, e.g. "init" or "usr/bin/xgate-selftest"
    folder: str  # the folder relative to the repository, e.g. "guest/agent"
    sources: tuple[str, ...]  # relative to the repository, sorted


def _walk_files(top: Path) -> list[Path]:
    """Every file under top, sorted; hidden names and __pycache__ are not sources."""
    found = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "__pycache__"]
        found += [Path(dirpath) / f for f in filenames if not f.startswith(".")]
    return sorted(found)


def _initramfs_folders(root: Path) -> list[Path]:
    skip = ("kernel", "__pycache__")
    return sorted(p for p in (root / "guest").iterdir()
                  if p.is_dir() and p.name not in skip and not p.name.startswith("."))


def initramfs_sources(root: Path = REPO_ROOT) -> list[Path]:
    """Everything the initramfs is built from; guest/kernel/ is the kernel key's."""
    loose = [p for p in (root / "guest").iterdir() if p.is_file() and not p.name.startswith(".")]
    files = _walk_files(root / "proto") + sorted(loose)
    for folder in _initramfs_folders(root):
        files += _walk_files(folder)
    return files


def guest_programs(root: Path = REPO_ROOT) -> list[GuestProgram]:
    """The programs that guest/*/programs list.

    One program per line: its path in the initramfs, then one or more globs of
    its sources, relative to the folder. `#` starts a comment. For example,
    guest/agent/programs holds `init *.c`.
    """
    programs: list[GuestProgram] = []
    taken = {*INITRAMFS_DIRS, "dev/console"}
    for folder in _initramfs_folders(root):
        listing = folder / PROGRAMS_FILE
        if not listing.is_file():
            continue
        for n, line in enumerate(listing.read_text().splitlines(), 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            where = f"{listing.relative_to(root)}:{n}"
            dest = PurePosixPath(words[0])
            if (len(words) < 2 or not dest.parts or dest.is_absolute() or ".." in dest.parts
                    or str(dest) in taken):
                raise ParacellError(f"{where}: want `<relative initramfs path> <sources>...`, "
                                    f"each path once")
            taken.add(str(dest))
            sources: set[Path] = set()
            for pattern in words[1:]:
                inside = not (PurePosixPath(pattern).is_absolute()
                              or ".." in PurePosixPath(pattern).parts)
                matched = [p for p in folder.glob(pattern) if p.is_file()] if inside else []
                if not matched:
                    raise ParacellError(f"{where}: {pattern} names no file in {folder.name}/")
                sources.update(matched)
            rel = tuple(sorted(p.relative_to(root).as_posix() for p in sources))
            programs.append(GuestProgram(str(dest), folder.relative_to(root).as_posix(), rel))
    return programs


def _gcc_version() -> bytes:
    out = subprocess.run(["gcc", "--version"], capture_output=True, check=True)
    return out.stdout.splitlines()[0]


def initramfs_key(root: Path = REPO_ROOT) -> str:
    parts = [(p.relative_to(root).as_posix(), p.read_bytes()) for p in initramfs_sources(root)]
    parts.append(("gcc", _gcc_version()))
    parts.append(("cflags", " ".join(PROGRAM_CFLAGS).encode()))
    parts.append(("layout", Path(cpio.__file__).read_bytes() + repr(INITRAMFS_DIRS).encode()))
    return _hash_inputs(parts)


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _log(message: str) -> None:
    print(f"paracell: {message}", file=sys.stderr, flush=True)


def kernel_config_key(tarball: Path = KERNEL_TARBALL) -> str:
    """What decides the kernel's .config, and so roughly how many objects it
    builds: the config fragment and the source (not the patches)."""
    fragment = (GUEST_SRC / "kernel" / "paracell.config").read_bytes()
    return _hash_inputs([("fragment", fragment),
                         ("tarball", _tarball_digest(tarball).encode())])


def build_kernel(key: str, tarball: Path = KERNEL_TARBALL) -> Path:
    from paracell.guest import buildprogress

    out = settings.cache_dir() / "kernel" / key
    if (out / "bzImage").exists():
        _log(f"kernel {key} is cached")
        return out / "bzImage"
    if not tarball.exists():
        raise ParacellError(f"{tarball} is missing: install Debian's linux-source-6.1")
    _log(f"building kernel {key} from {tarball}")
    build_script = GUEST_SRC / "kernel" / "build.sh"
    # The build's own output goes to a log; stderr gets its progress.
    log = out.with_name(f"{key}.log")
    counts = buildprogress.ObjectCounts(out.with_name("objects.json"))
    config = kernel_config_key(tarball)
    progress = buildprogress.Progress("kernel", sys.stderr, counts.estimate(config))
    code = buildprogress.run_logged(["bash", str(build_script), str(tarball), str(out)], log,
                                    progress)
    if code != 0 or not (out / "bzImage").exists():
        for line in buildprogress.tail(log):
            print(line, file=sys.stderr)
        raise ParacellError(f"guest kernel build failed (exit {code}); its output is in {log}")
    with contextlib.suppress(OSError):  # only an estimate: never fails a build that worked
        counts.record(config, progress.objects)
    os.replace(log, out / "build.log")
    return out / "bzImage"


def compile_program(program: GuestProgram, out: Path, root: Path = REPO_ROOT) -> None:
    # Relative paths, run from the repository: nothing of the checkout's
    # location can end up in the binary.
    cmd = ["gcc", *PROGRAM_CFLAGS, "-Iproto", f"-I{program.folder}", "-o", str(out),
           *program.sources]
    result = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        errors = [ln for ln in lines if "error" in ln] or lines[-3:]
        raise ParacellError(f"building /{program.dest} from {program.folder}/ failed: "
                            + " | ".join(errors[:3]))


def _initramfs_entries(programs: dict[str, bytes]) -> list[cpio.Entry]:
    entries = [cpio.directory(d) for d in INITRAMFS_DIRS]
    entries.append(cpio.char_device("dev/console", 5, 1))
    dirs = set(INITRAMFS_DIRS)
    for dest in sorted(programs):
        for parent in reversed(PurePosixPath(dest).parents[:-1]):
            if str(parent) not in dirs:
                dirs.add(str(parent))
                entries.append(cpio.directory(str(parent)))
        entries.append(cpio.executable(dest, programs[dest]))
    return entries


def build_initramfs(key: str, root: Path = REPO_ROOT) -> Path:
    out = settings.cache_dir() / "initramfs" / key / "initramfs.cpio"
    if out.exists():
        _log(f"initramfs {key} is cached")
        return out
    _log(f"building guest programs and initramfs {key}")
    programs = guest_programs(root)
    if "init" not in {p.dest for p in programs}:
        raise ParacellError("no guest folder lists the program `init` (guest/agent/programs)")
    out.parent.mkdir(parents=True, exist_ok=True)
    built: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        for i, program in enumerate(programs):
            exe = Path(tmp) / str(i)
            compile_program(program, exe, root)
            built[program.dest] = exe.read_bytes()
    # Uncompressed on purpose: under TCG, gunzip in the guest costs more than
    # reading a bigger image through fw_cfg.
    _atomic_write(out, cpio.newc_archive(_initramfs_entries(built)))
    return out


def _current_record() -> Path:
    return settings.cache_dir() / "current.json"


@contextlib.contextmanager
def _build_lock() -> Iterator[None]:
    """One build at a time per cache: a second build of the same key would
    wipe the first one's work directory under it. The second waits, then
    finds what the first built."""
    directory = settings.cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / "build.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def build_all() -> GuestArtifacts:
    kkey, ikey = kernel_key(), initramfs_key()
    with _build_lock():
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
