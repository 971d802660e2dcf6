"""`delete --force` of a container whose state cannot be read.

A state.json that is truncated, empty, binary, mistyped or `{}` records
nothing that can be trusted, yet the container's VM may still run. What it
holds is found from what exists instead, by names that only this container
can have:
- its QEMU, by the guest-RAM file on its command line (named from the state
  root and the ID, paracell.vmm.memory.path_for);
- its shim (or a pod member's proxy), by the pid file create writes beside
  the state (pid and start time), as the holder of the control socket in
  the container's state directory, and as QEMU's parent;
- the host cgroups those processes sit in, and the default one named by the
  ID, removed once empty (the levels above a cgroupsPath leaf that create
  made are recorded only in the state, and stay);
- the RAM file itself, and the mounts and files under the state directory.

QEMU is killed first, so that a live shim sees its VM end and tears down
what only it knows (TAP mirroring in the container's network namespace)
before it is killed in turn.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from paracell.errors import ParacellError
from paracell.procfs import process_start_time

SHIM_EXIT_WAIT_S = 5.0


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read(1 << 16)
    except OSError:
        return b""


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def qemu_processes(ram_file: Path, state_dir: Path) -> list[int]:
    """QEMU processes whose guest RAM is this container's file, or, for a VM
    restored copy-on-write (no RAM file: it maps its template's), whose
    console log is in this container's state directory."""
    needles = (f"mem-path={ram_file}".encode(), f"path={state_dir}/".encode())
    return [pid for pid in _pids() if b"qemu-system" in _cmdline(pid)
            and any(needle in _cmdline(pid) for needle in needles)]


def _socket_inodes(path: Path) -> set[str]:
    """Inodes of the unix sockets bound at path: the listener and the
    connections it accepted (/proc/net/unix names them all by that path)."""
    found = set()
    target = str(path)
    try:
        with open("/proc/net/unix") as f:
            next(f, None)
            for line in f:
                fields = line.split()
                if len(fields) >= 8 and fields[7] == target:
                    found.add(fields[6])
    except OSError:
        pass
    return found


def socket_holders(path: Path) -> list[int]:
    """Processes with an fd on a unix socket bound at path."""
    inodes = {f"socket:[{inode}]" for inode in _socket_inodes(path)}
    if not inodes:
        return []
    holders = []
    for pid in _pids():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    holders.append(pid)
                    break
            except OSError:
                continue
    return holders


def _cgroup_dirs(pid: int) -> list[Path]:
    """The cgroup directories a process sits in, in every mounted hierarchy."""
    dirs = []
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    base = Path("/sys/fs/cgroup")
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if path in ("", "/"):
            continue
        names = [c.removeprefix("name=") for c in controllers.split(",") if c] or ["unified"]
        for name in names:
            candidate = base / name / path.lstrip("/")
            if candidate.is_dir():
                dirs.append(candidate)
    return dirs


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _wait_gone(pids: list[int], starts: dict[int, int | None], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    left = pids
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = [p for p in left if process_start_time(p) == starts[p]]
    return left


def recorded_stand_in(pid_file: Path) -> int | None:
    """The stand-in named by its pid file, if that process still lives."""
    from paracell.jsonfile import read_regular
    from paracell.procfs import same_process

    try:
        fields = read_regular(str(pid_file), 64, follow=False).split()
    except (OSError, ParacellError):
        return None
    if len(fields) != 2 or not all(f.isdigit() and len(f) < 20 for f in fields):
        return None
    pid, start = int(fields[0]), int(fields[1])
    return pid if pid > 1 and same_process(pid, start) else None


def default_cgroups(container_id: str) -> list[Path]:
    """Where a container without cgroupsPath has its cgroup: its ID under
    the runtime's own, in each hierarchy (runtime/host/cgroups/hierarchy.py)."""
    from paracell.runtime.host.cgroups import hierarchy

    found = []
    for h in hierarchy.discover():
        try:
            found.append(Path(hierarchy.directory(h, "", container_id)))
        except ParacellError:
            continue
    return found


def reclaim(state_dir: Path, ram_file: Path, control_socket: Path, pid_file: Path,
            container_id: str) -> list[str]:
    """Ends and removes what the container holds; returns what was found,
    for the log. The state directory itself is the caller's to remove."""
    from paracell.vmm import memory

    own = os.getpid()
    qemus = qemu_processes(ram_file, state_dir)
    shims = {p for p in socket_holders(control_socket) if p != own}
    recorded = recorded_stand_in(pid_file)
    if recorded is not None and recorded != own:
        shims.add(recorded)
    shims |= {parent for parent in map(_parent, qemus)
              if parent > 1 and parent != own and b"paracell" in _cmdline(parent)}
    victims = [*qemus, *sorted(shims)]
    starts = {p: process_start_time(p) for p in victims}
    cgroups = ({d for p in victims for d in _cgroup_dirs(p)} | set(default_cgroups(container_id))
               ) - set(_cgroup_dirs(own))
    _kill(qemus)
    _wait_gone(qemus, starts, SHIM_EXIT_WAIT_S)
    # A live shim ends on its own once its VM is gone, a Python one undoing
    # its network mirroring (paracell-vmshim leaves it to the namespace's
    # owner, whose veth takes it along); one that does not end is killed.
    _kill(_wait_gone(sorted(shims), starts, SHIM_EXIT_WAIT_S))
    _wait_gone(victims, starts, SHIM_EXIT_WAIT_S)
    for directory in sorted(cgroups, key=lambda d: len(d.parts), reverse=True):
        with contextlib.suppress(OSError):
            directory.rmdir()  # only once empty: a cgroup others share stays
    memory.remove(ram_file)
    found = [f"qemu {p}" for p in qemus] + [f"shim {p}" for p in sorted(shims)]
    return found + [f"cgroup {d}" for d in sorted(cgroups) if not d.exists()]
