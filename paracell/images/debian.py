"""A Debian rootfs built with `mmdebstrap` from Debian's own packages, cached
outside the repo under the cache dir by a content key.

`debian_rootfs(packages)` returns the directory of a rootfs that holds those
packages (and Debian's essential set). The key is a hash of everything that
decides the result: the suite, the mirror, the variant, the sorted package
list and this builder's version, so a changed list builds a new image and an
unchanged one is reused. A build is locked (two processes asking for the same
image build it once), made in a temporary directory beside its final place,
checked (every package installed, per the image's own dpkg database, and
every binary asked for present), and only then renamed into place with a
marker that records what it holds: a half-made image is never returned.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from paracell import settings
from paracell.errors import ParacellError

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
VARIANT = "essential"
BUILDER_VERSION = 1
MARKER = ".paracell-image.json"
BUILD_TIMEOUT_S = 1800
# Debian package names: lowercase letters, digits, + - . and at least two characters.
PACKAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]{1,100}$")
# Left out of every image: documentation and translations nothing here reads.
EXCLUDES = ("/usr/share/man/*", "/usr/share/doc/*", "/usr/share/info/*",
            "/usr/share/locale/*", "/usr/share/lintian/*")


def _validated(packages: Iterable[str]) -> list[str]:
    names = sorted(set(packages))
    bad = [p for p in names if not PACKAGE_NAME.match(p)]
    if bad:
        raise ParacellError(f"not Debian package names: {', '.join(repr(b[:40]) for b in bad)}")
    if len(names) > 200:
        raise ParacellError("a Debian image of more than 200 named packages")
    return names


def image_key(packages: Iterable[str], suite: str = SUITE, mirror: str = MIRROR) -> str:
    """The content key of the image these inputs build."""
    spec = {"suite": suite, "mirror": mirror, "variant": VARIANT, "excludes": EXCLUDES,
            "packages": _validated(packages), "builder": BUILDER_VERSION}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:24]


def images_dir() -> Path:
    return settings.cache_dir() / "images"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def is_valid(root: Path, packages: Iterable[str]) -> bool:
    """The image's marker names these packages and its dpkg database has them installed."""
    try:
        marker = json.loads((root / MARKER).read_text())
    except (OSError, ValueError):
        return False
    wanted = _validated(packages)
    return marker.get("packages") == wanted and not _missing(root, wanted)


def _missing(root: Path, packages: list[str]) -> list[str]:
    """The packages the image's own dpkg status does not list as installed."""
    try:
        status = (root / "var/lib/dpkg/status").read_text(errors="replace")
    except OSError:
        return list(packages)
    installed = set()
    for stanza in status.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines()
                      if ": " in line and not line.startswith(" "))
        if fields.get("Status", "").endswith(" installed"):
            installed.add(fields.get("Package", ""))
    return [p for p in packages if p not in installed]


def _build(target: Path, packages: list[str], suite: str, mirror: str) -> None:
    if shutil.which("mmdebstrap") is None:
        raise ParacellError("building a Debian image needs mmdebstrap (Debian's `mmdebstrap`)")
    cmd = ["mmdebstrap", "--mode=root", f"--variant={VARIANT}", "--quiet",
           *(f"--dpkgopt=path-exclude={e}" for e in EXCLUDES),
           "--dpkgopt=path-include=/usr/share/doc/*/copyright",
           f"--include={','.join(packages)}" if packages else "--include=",
           suite, str(target), mirror]
    try:
        result = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as err:
        raise ParacellError(f"mmdebstrap took more than {BUILD_TIMEOUT_S} s") from err
    if result.returncode != 0:
        raise ParacellError(f"mmdebstrap failed: {result.stderr.strip()[-600:]}")


def debian_rootfs(packages: Iterable[str], suite: str = SUITE, mirror: str = MIRROR) -> Path:
    """The directory of a Debian rootfs with these packages, built once and cached.

    Callers share it read-only (a container's root with "readonly": true)."""
    names = _validated(packages)
    key = image_key(names, suite, mirror)
    final = images_dir() / f"debian-{suite}-{key}"
    if is_valid(final, names):
        return final
    with _locked(images_dir() / f".{key}.lock"):
        if is_valid(final, names):  # built while this one waited for the lock
            return final
        work = images_dir() / f".build-{key}-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        try:
            _build(work, names, suite, mirror)
            missing = _missing(work, names)
            if missing:
                raise ParacellError(f"the Debian image lacks {', '.join(missing)} after its build")
            (work / MARKER).write_text(json.dumps({
                "key": key, "suite": suite, "mirror": mirror, "variant": VARIANT,
                "packages": names, "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }, indent=2) + "\n")
            if final.exists():  # an invalid leftover (an older marker, a broken build)
                shutil.rmtree(final)
            os.rename(work, final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return final
