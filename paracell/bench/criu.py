"""A CRIU that runs on this host, for `paracell bench agent`'s runc + CRIU
column.

Debian 12's CRIU 3.17.1 fails `criu check` on newer kernels (on this
project's hosts, Linux 6.18: `vdso: Unexpected rt vDSO area bounds`), and
every dump and restore begins with that check. Debian 13's CRIU 4.1.1
passes it. It needs Debian 13's C library, so it is not installed: its
package, its libcompel and Debian 13's libc6 are unpacked into the bench
cache, and CRIU runs under that libc's own loader with that libc first on
its library path (the rest of its libraries are Debian 12's, same sonames).
runc is given the wrapper with `--criu`.

What is fetched is checked the way apt checks it: the suite's InRelease
against Debian's archive keyring (gpgv), Packages.xz against the SHA-256
that InRelease lists, each .deb against the SHA-256 that Packages lists.
"""

from __future__ import annotations

import hashlib
import http.client
import lzma
import os
import shlex
import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path

from paracell.bench import common
from paracell.errors import ParacellError

ARCHIVE = "http://deb.debian.org/debian"
SUITE = "trixie"
PACKAGES = ("criu", "libcompel1", "libc6")
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
INDEX = "main/binary-amd64/Packages.xz"
FETCH_TIMEOUT_S = 120
MAX_INDEX_BYTES = 64 << 20
MAX_DEB_BYTES = 32 << 20
CHECK_TIMEOUT_S = 60
LIBDIR = "usr/lib/x86_64-linux-gnu"
SYSTEM_LIBDIRS = ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu")


def check(criu: str) -> str:
    """Why this CRIU cannot checkpoint here, or "": its own `criu check`.
    The first error it prints is the cause; the ones after gave up on it."""
    try:
        done = subprocess.run([criu, "check"], capture_output=True, text=True,
                              timeout=CHECK_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"`criu check` did not finish in {CHECK_TIMEOUT_S} s"
    except OSError as err:
        return f"{criu}: {err.strerror}"
    if done.returncode == 0:
        return ""
    errors = [line.split("): ", 1)[-1] for line in (done.stderr + done.stdout).splitlines()
              if line.startswith("Error (")]
    return f"`criu check` fails on this kernel: {(errors or ['no reason given'])[0][:300]}"


def find() -> tuple[str, str]:
    """(the CRIU to give runc, "") or ("", why there is none): Debian's own
    where it passes its check, else Debian 13's from the bench cache,
    fetched the first time."""
    system = shutil.which("criu")
    why = check(system) if system else "Debian's criu is not installed"
    if not why:
        return system or "", ""
    wrapper = _cache() / "criu"
    if not wrapper.exists():
        common.progress("agent", f"Debian 12's CRIU cannot run here ({why}); fetching Debian "
                        f"{SUITE}'s from {ARCHIVE}")
        try:
            _fetch()
        except (OSError, ParacellError, lzma.LZMAError, subprocess.SubprocessError,
                http.client.HTTPException, KeyError, ValueError) as err:
            detail = err.strerror if isinstance(err, OSError) and err.strerror else \
                (str(err) or type(err).__name__)
            return "", f"{why}; and Debian {SUITE}'s could not be fetched: {detail[:300]}"
    newer = check(str(wrapper))
    return (str(wrapper), "") if not newer else ("", f"{why}; Debian {SUITE}'s too: {newer}")


def _cache() -> Path:
    return common.bench_dir() / f"criu-{SUITE}"


def _get(url: str, limit: int) -> bytes:
    with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:
        data = response.read(limit + 1)
    if len(data) > limit:
        raise ParacellError(f"{url}: more than {limit >> 20} MiB")
    return data


def _verified_release(staging: Path) -> str:
    """The suite's InRelease, its signature checked against Debian's keyring:
    only the text gpgv vouches for is returned."""
    signed = staging / "InRelease"
    signed.write_bytes(_get(f"{ARCHIVE}/dists/{SUITE}/InRelease", 1 << 20))
    clear = staging / "Release"
    done = subprocess.run(["gpgv", "--keyring", str(KEYRING), "--output", str(clear),
                           str(signed)], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise ParacellError(f"Debian {SUITE}'s InRelease: its signature does not check: "
                            f"{done.stderr.strip().splitlines()[-1:]}")
    return clear.read_text()


def _sha256_in_release(release: str, name: str) -> str:
    in_sha256 = False
    for line in release.splitlines():
        if not line.startswith(" "):
            in_sha256 = line.startswith("SHA256:")
        elif in_sha256 and line.split()[-1] == name:
            return line.split()[0]
    raise ParacellError(f"Debian {SUITE}'s Release lists no {name}")


def _stanzas(index: str, wanted: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """The Packages entries of these packages: field -> value."""
    found: dict[str, dict[str, str]] = {}
    for block in index.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines()
                      if ": " in line and not line.startswith(" "))
        name = fields.get("Package")
        if name in wanted and fields.get("Architecture") == "amd64" and name not in found:
            found[name] = fields
    missing = [p for p in wanted if p not in found]
    if missing:
        raise ParacellError(f"Debian {SUITE}'s index has no {', '.join(missing)}")
    return found


def _checked(data: bytes, sha256: str, what: str) -> bytes:
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ParacellError(f"{what}: its SHA-256 is not the one the signed index lists")
    return data


def _fetch() -> None:
    target = _cache()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".criu-", dir=target.parent))
    try:
        release = _verified_release(staging)
        index = _checked(_get(f"{ARCHIVE}/dists/{SUITE}/{INDEX}", MAX_INDEX_BYTES),
                         _sha256_in_release(release, INDEX), INDEX)
        stanzas = _stanzas(lzma.decompress(index).decode(errors="replace"), PACKAGES)
        root = staging / "root"
        for name, fields in stanzas.items():
            deb = staging / f"{name}.deb"
            deb.write_bytes(_checked(_get(f"{ARCHIVE}/{fields['Filename']}", MAX_DEB_BYTES),
                                     fields["SHA256"], fields["Filename"]))
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True,
                           capture_output=True, timeout=120)
            deb.unlink()
        libs = target / "root" / LIBDIR
        wrapper = staging / "criu"
        # exec keeps runc's fds (its swrk socket) and pid; the loader named
        # first so that Debian 13's libc, not the host's, is the one loaded.
        wrapper.write_text(
            "#!/bin/sh\n"
            f"exec {shlex.quote(f'{libs}/ld-linux-x86-64.so.2')} --library-path "
            f"{shlex.quote(':'.join([str(libs), *SYSTEM_LIBDIRS]))} "
            f"{shlex.quote(f'{target}/root/usr/sbin/criu')} \"$@\"\n")
        wrapper.chmod(0o755)
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
