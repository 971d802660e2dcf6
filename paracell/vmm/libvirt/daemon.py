"""The daemon behind a libvirt URI, as this host's kernel shows it: its
process, the qemu.conf it read when it started, its log manager's socket,
and what its mount namespace sees of a directory. libvirt's API reports none
of these, so they are read through /proc/PID of the daemon itself: its root
(`/proc/PID/root`) is its own mount namespace's view, which may not be ours
(a daemon in a namespace of its own, like the test fixture's). Nothing is
cached: every call looks again.

Each function raises ParacellError with the reason when it cannot tell;
callers report that setting as unverified rather than guess.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from paracell.errors import ParacellError
from paracell.vmm.libvirt import virconf

# The daemons that run QEMU domains: libvirt's monolithic daemon and its
# modular QEMU driver daemon.
DAEMONS = ("libvirtd", "virtqemud")
# For qemu:///system without ?socket=, libvirt's client takes the modular
# daemon's socket if it is there, else the monolithic daemon's (its "auto"
# mode); `?mode=direct|legacy` picks one.
SYSTEM_SOCKETS = {"virtqemud": "/run/libvirt/virtqemud-sock",
                  "libvirtd": "/run/libvirt/libvirt-sock"}
# A daemon running as root reads SYSCONFDIR/libvirt/qemu.conf (Debian:
# /etc), and sends QEMU's stdio to virtlogd at this socket.
QEMU_CONF = "/etc/libvirt/qemu.conf"
VIRTLOGD_SOCKET = "/run/libvirt/virtlogd-sock"
# /proc/stat's btime is whole seconds: a start time is this coarse.
CLOCK_SLACK_S = 1.0


@dataclass(frozen=True)
class Daemon:
    pid: int
    name: str  # one of DAEMONS
    started: float  # seconds since the epoch

    @property
    def root(self) -> str:
        return f"/proc/{self.pid}/root"


def _query(uri: str) -> dict[str, str]:
    params: dict[str, str] = {}
    for part in re.split("[&;]", uri.partition("?")[2]):
        key, _, value = part.partition("=")
        params[unquote(key)] = unquote(value)  # the last one wins, as in libvirt
    return params


def socket_of(uri: str) -> tuple[str, str]:
    """The daemon's socket for a URI that check_uri took, and the daemon
    expected behind it."""
    params = _query(uri)
    if params.get("socket"):
        name = "virtqemud" if "virtqemud" in os.path.basename(params["socket"]) else "libvirtd"
        return params["socket"], name
    if not uri.startswith("qemu:///system"):
        raise ParacellError("a session daemon's socket depends on its user's runtime directory; "
                            "name it with ?socket=PATH")
    mode = params.get("mode", "auto")
    if mode == "direct" or (mode == "auto" and os.path.exists(SYSTEM_SOCKETS["virtqemud"])):
        return SYSTEM_SOCKETS["virtqemud"], "virtqemud"
    return SYSTEM_SOCKETS["libvirtd"], "libvirtd"


def _name_of(pid: int) -> str | None:
    try:
        name = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return None
    return name if name in DAEMONS else None


def _status(pid: int, key: str) -> list[str]:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return line.split()[1:]
    return []


def _started(pid: int) -> float:
    from paracell.procfs import process_start_time

    ticks = process_start_time(pid)
    if ticks is None:
        raise ParacellError(f"the daemon (pid {pid}) is gone")
    with open("/proc/stat") as f:
        boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _peer_of_connection(path: str) -> int:
    """The pid that this process's open libvirt connection to `path` has
    for its peer (SO_PEERCRED on libvirt's own socket, found among our fds):
    a connection of our own would make the daemon log an error when it
    closes unspoken."""
    try:
        want = os.stat(path)
    except OSError as err:
        raise ParacellError(f"{path}: {err.strerror}") from None
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        try:
            peer = sock.getpeername() if sock.family == socket.AF_UNIX else ""
            if not isinstance(peer, str) or not peer.startswith("/"):
                continue
            found = os.stat(peer)
            if (found.st_dev, found.st_ino) == (want.st_dev, want.st_ino):
                return int(struct.unpack("3i", sock.getsockopt(
                    socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0])
        except OSError:
            continue
        finally:
            sock.close()
    raise ParacellError(f"this process has no connection to {path}")


def find(uri: str) -> Daemon:
    """The process serving the URI's socket, while this process holds a
    libvirt connection to it: the connection's peer. Under systemd's socket
    activation that peer is systemd, which listens for the daemon, and the
    daemon is found by its pid file."""
    path, expected = socket_of(uri)
    pid = _peer_of_connection(path)
    if pid <= 0:
        raise ParacellError(f"the process serving {path} is outside this PID namespace")
    name = _name_of(pid)
    if name is None:
        try:
            with open(f"/run/{expected}.pid") as f:
                activated = int(f.read(32).strip() or 0)
        except (OSError, ValueError):
            activated = 0
        if activated > 0 and _name_of(activated) == expected:
            pid, name = activated, expected
        else:
            raise ParacellError(f"{path} is served by pid {pid}, which is not {expected}, "
                                f"and /run/{expected}.pid names no running {expected}")
    try:
        euid = _status(pid, "Uid")[1]
    except (OSError, IndexError):
        raise ParacellError(f"cannot read the status of {name} (pid {pid})") from None
    if euid != "0":
        raise ParacellError(f"{name} (pid {pid}) does not run as root: it reads its user's "
                            "qemu.conf")
    return Daemon(pid, name, _started(pid))


def _open_in_root(daemon: Daemon, path: str) -> int:
    """A file of the daemon's mount namespace, by a path of no symlinks: one
    would resolve in ours, not in the daemon's."""
    parts = path.strip("/").split("/")
    fd = os.open(daemon.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=fd)
            os.close(fd)
            fd = nxt
        return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)


def qemu_conf(daemon: Daemon) -> dict[str, virconf.Value]:
    """The settings of the daemon's qemu.conf, if they are the ones it runs
    with: the daemon reads the file once, when it starts."""
    try:
        fd = _open_in_root(daemon, QEMU_CONF)
    except FileNotFoundError:
        return {}  # libvirt's defaults, as for a file it cannot read
    except OSError as err:
        why = ("a symlink on the way" if err.errno in (errno.ELOOP, errno.ENOTDIR)
               else err.strerror)
        raise ParacellError(f"cannot read {daemon.name}'s {QEMU_CONF} ({why})") from None
    try:
        if os.fstat(fd).st_mtime > daemon.started + CLOCK_SLACK_S:
            raise ParacellError(f"{QEMU_CONF} changed after {daemon.name} started; restart "
                                f"{daemon.name} to apply it")
        chunks: list[bytes] = []
        size = 0
        while size <= virconf.MAX_FILE:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    try:
        return virconf.parse(b"".join(chunks).decode(errors="replace"))
    except ParacellError as err:
        raise ParacellError(f"cannot parse {daemon.name}'s {QEMU_CONF}: {err}") from None


def log_manager_refusal(daemon: Daemon) -> str | None:
    """None if virtlogd takes a connection at the daemon's socket for it,
    else why not (the connection is closed at once; virtlogd drops it)."""
    from paracell import unixsock

    try:
        unixsock.connect(Path(daemon.root + VIRTLOGD_SOCKET)).close()
    except OSError as err:
        return f"{VIRTLOGD_SOCKET}: {err.strerror}"
    return None


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mounts(pid: str) -> list[tuple[str, list[str]]]:
    """(mount point, optional fields) of each mount of /proc/PID/mountinfo,
    in the kernel's order: of two at one point, the later is on top."""
    found = []
    with open(f"/proc/{pid}/mountinfo") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[6:]:
                found.append((_unescape(fields[4]), fields[6:fields.index("-", 6)]))
    return found


def _holder(mounts: list[tuple[str, list[str]]], path: str,
            excluding: str) -> tuple[str, list[str]] | None:
    """The mount that holds path, not counting one at `excluding` itself
    (the RAM tmpfs: a new one is mounted where it is, on the mount below)."""
    best = None
    for point, tags in mounts:
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and point != excluding and (best is None or len(point) >= len(best[0])):
            best = (point, tags)
    return best


def sees(daemon: Daemon, directory: str) -> tuple[bool, str]:
    """Whether a mount made on `directory` here (ParaCell's RAM tmpfs, made
    when a container is created) reaches the daemon, whose mount namespace
    its QEMU's own copies: (answer, why)."""
    target = os.path.realpath(directory)
    try:
        ours = os.stat("/proc/self/ns/mnt")
        theirs = os.stat(f"/proc/{daemon.pid}/ns/mnt")
    except OSError as err:
        raise ParacellError(f"cannot read {daemon.name}'s mount namespace ({err.strerror})") \
            from None
    if (ours.st_dev, ours.st_ino) == (theirs.st_dev, theirs.st_ino):
        return True, "the daemon shares this mount namespace"
    anchor = target
    while not os.path.exists(anchor):
        anchor = os.path.dirname(anchor)
    try:
        here, there = os.stat(anchor), os.stat(daemon.root + anchor)
    except OSError:
        return False, f"the daemon has no {anchor}"
    if (here.st_dev, here.st_ino) != (there.st_dev, there.st_ino):
        return False, f"the daemon's {anchor} is another directory"
    try:
        holder = _holder(_mounts("self"), target, excluding=target)
        theirs_at = _holder(_mounts(str(daemon.pid)), target, excluding=target)
    except OSError as err:
        raise ParacellError(f"cannot read {daemon.name}'s mounts ({err.strerror})") from None
    if holder is None or theirs_at is None or theirs_at[0] != holder[0]:
        raise ParacellError(f"the daemon's mounts around {target} differ from ours")
    point, tags = holder
    peer = next((t.split(":", 1)[1] for t in tags if t.startswith("shared:")), None)
    if peer is None:
        return False, f"{point} is not a shared mount, so mounts made under it stay here"
    if f"shared:{peer}" in theirs_at[1] or f"master:{peer}" in theirs_at[1]:
        return True, f"{point} propagates to the daemon's mount namespace"
    return False, f"the daemon's {point} does not receive mounts from this one"
