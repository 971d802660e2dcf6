"""The container's host cgroup: where the shim and QEMU are accounted and limited.

`create` makes it at cgroupsPath and writes linux.resources there before the
shim exists; the shim joins it before it starts QEMU; `delete` kills whatever
is left in it and removes it. Its directories are recorded in the state (the
VM record's `host.cgroups`) before they exist, so that a create
killed half-way or a crashed shim leaves nothing `delete --force` cannot find.

v1 (each controller its own hierarchy) and v2 (one hierarchy) are both
handled; on a hybrid host (v1 plus v2 at /sys/fs/cgroup/unified) the v1
hierarchies take every controller they have and the v2 one the rest (here:
hugetlb). docs/host-isolation.md has the whole mapping.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from paracell.errors import ParacellError
from paracell.runtime.host.cgroups import hierarchy

# `delete` only reclaims: the resource parser and the file mapping stay out
# of its imports.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from paracell.runtime.bundle.resources import Resources

RMDIR_WAIT_S = 2.0
# What the VM costs the host beyond guest RAM, charged to the same cgroup:
# QEMU itself, TCG's translation cache (64 MiB, paracell/vmm/builder.py), the
# shim (a Python process) and page tables. Measured under TCG in
# docs/host-isolation.md; Kubernetes users declare it as RuntimeClass
# overhead.podFixed.memory.
VMM_OVERHEAD_MIB = {"tcg": 192, "kvm": 128}


@dataclass(frozen=True)
class CgroupDir:
    path: str
    version: int
    controllers: tuple[str, ...]
    # How deep the levels that this create made go: removed again on delete.
    made_from: str = ""

    def facts(self) -> dict[str, Any]:
        return {"path": self.path, "version": self.version,
                "controllers": list(self.controllers), "made_from": self.made_from}


def _place(cgroups_path: str, container_id: str, systemd: bool) -> list[CgroupDir]:
    if systemd:
        if not hierarchy.systemd_running():
            raise ParacellError(
                "--systemd-cgroup: systemd is not running on this host (PID 1 is "
                f"{_pid1_name()!r}); it works only where systemd is PID 1: use a cgroupfs "
                "cgroupsPath here")
        cgroups_path = hierarchy.systemd_path(cgroups_path)
    found = hierarchy.discover()
    if not found:
        raise ParacellError("no cgroup hierarchy is mounted on this host")
    v1_taken = set().union(*(h.controllers for h in found if h.version == 1))
    dirs = []
    for h in found:
        controllers = h.controllers if h.version == 1 else h.controllers - v1_taken
        path = hierarchy.directory(h, cgroups_path, container_id)
        dirs.append(CgroupDir(path, h.version, tuple(sorted(controllers)), _first_missing(path)))
    return dirs


def adopt_parents(dirs: list[CgroupDir], others: list[CgroupDir]) -> list[CgroupDir]:
    """dirs, taking on the levels `others` made above them: a pod's members
    sit under the parent its sandbox's create made, and whichever of them is
    deleted last must remove it (containerd may delete the sandbox first)."""
    from dataclasses import replace

    adopted = []
    for d in dirs:
        for o in others:
            if (o.version == d.version and o.made_from and d.made_from
                    and d.made_from.startswith(o.made_from + "/")):
                d = replace(d, made_from=o.made_from)
                break
        adopted.append(d)
    return adopted


def _first_missing(path: str) -> str:
    """The top level of `path` that does not exist yet: decided before the
    record is written, so that delete removes the parents this create makes."""
    first = ""
    while not os.path.isdir(path):
        first, path = path, os.path.dirname(path)
    return first


def _pid1_name() -> str:
    try:
        with open("/proc/1/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def host_resources(res: Resources, guest_memory_mib: int, engine: str) -> Resources:
    """The limits as the host applies them: the memory the VM needs beyond
    guest RAM is added to memory.limit (and to memory+swap), or QEMU would
    be OOM-killed as soon as the guest used the RAM it was promised."""
    from dataclasses import replace

    from paracell.runtime.bundle.resources import MIB

    overhead = VMM_OVERHEAD_MIB.get(engine, VMM_OVERHEAD_MIB["tcg"]) * MIB
    limit, swap = res.memory_limit, res.memory_swap
    if limit is not None and limit > 0:
        limit = max(limit, guest_memory_mib * MIB) + overhead
        if swap is not None and swap > 0:
            swap = max(swap + overhead, limit)
    return replace(res, memory_limit=limit, memory_swap=swap)


def _write(directory: str, name: str, value: str) -> None:
    # "a|b": the first of these file names that this kernel has.
    names = name.split("|")
    target = next((n for n in names if os.path.exists(os.path.join(directory, n))), names[0])
    path = os.path.join(directory, target)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except OSError as err:
        raise ParacellError(f"open {path}: {err.strerror}") from None
    try:
        os.write(fd, value.encode())
    except OSError as err:
        # runc's wording.
        raise ParacellError(f'failed to write "{value}": write {path}: {err.strerror}') from None
    finally:
        os.close(fd)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _writes_for(d: CgroupDir, res: Resources, only_v2: bool) -> list[tuple[str, str]]:
    """This directory's share of the writes."""
    from paracell.runtime.host.cgroups import files

    if d.version == 1:
        memsw = _read(os.path.join(d.path, "memory.memsw.limit_in_bytes"))
        writes = files.v1(res, int(memsw) if memsw and memsw.lstrip("-").isdigit() else None)
    else:
        period = (_read(os.path.join(d.path, "cpu.max")) or "").split()
        writes = files.v2(res, int(period[1]) if len(period) == 2 else None,
                          None if only_v2 else d.controllers)
    return [(name, value) for controller, name, value in writes if controller in d.controllers]


def _all_writes(dirs: list[CgroupDir], res: Resources,
                log: Any) -> list[tuple[CgroupDir, str, str]]:
    """Every write, refusing one whose controller no hierarchy has."""
    from paracell.runtime.host.cgroups import files

    available = {c for d in dirs for c in d.controllers}
    v2_only = all(d.version == 2 for d in dirs)
    out = []
    for d in dirs:
        for name, value in _writes_for(d, res, v2_only):
            out.append((d, name, value))
    # What a hierarchy-less controller would have received: refuse, naming it.
    probe = files.v2(res) if v2_only else files.v1(res)
    for controller, name, _ in probe:
        if controller not in available:
            raise ParacellError(f"linux.resources: {name.split('|')[0]} needs the {controller} "
                                "cgroup controller, which this host does not have")
    return out


def _make(path: str, version: int) -> None:
    """mkdir -p, with cpuset levels made usable."""
    missing = []
    cur = path
    while not os.path.isdir(cur):
        missing.append(cur)
        cur = os.path.dirname(cur)
    for level in reversed(missing):
        try:
            os.mkdir(level, 0o755)
        except FileExistsError:
            if os.path.isdir(level):
                continue  # a concurrent create made it
            raise ParacellError(f"mkdir {level}: file exists and is not a cgroup "
                                "(cgroupsPath names a control file)") from None
        except OSError as err:
            raise ParacellError(f"mkdir {level}: {err.strerror}") from None
        if version == 1:
            # A new cpuset cgroup starts with no CPUs and no memory nodes: no
            # process could join it. runc copies them from the parent.
            for name in ("cpuset.cpus", "cpuset.mems"):
                own = os.path.join(level, name)
                if os.path.exists(own) and not _read(own):
                    parent = _read(os.path.join(os.path.dirname(level), name))
                    if parent:
                        _write(level, name, parent)


def _enable_v2(d: CgroupDir, mount: str) -> None:
    """Each ancestor must delegate the controllers to its children."""
    if not d.controllers:
        return
    levels = []
    cur = os.path.dirname(d.path)
    while cur.startswith(mount) and len(cur) >= len(mount):
        levels.append(cur)
        if cur == mount:
            break
        cur = os.path.dirname(cur)
    wanted = " ".join(f"+{c}" for c in d.controllers)
    for level in reversed(levels):
        _write(level, "cgroup.subtree_control", wanted)


def _check_existing(d: CgroupDir) -> None:
    """A cgroup that exists already must be a leaf: limits written into one
    with sub-cgroups would bind every container below it."""
    try:
        subdirs = [e.name for e in os.scandir(d.path) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    if subdirs:
        raise ParacellError(f"cgroupsPath names {d.path}, an existing cgroup with sub-cgroups: "
                            "a container needs a cgroup of its own")


def _procs(d: CgroupDir) -> list[int]:
    text = _read(os.path.join(d.path, "cgroup.procs")) or ""
    return [int(p) for p in text.split() if p.isdigit()]


def place(cgroups_path: str, container_id: str, systemd: bool) -> list[CgroupDir]:
    """Plans the directories (for the state record) without touching them."""
    return _place(cgroups_path, container_id, systemd)


def setup(dirs: list[CgroupDir], res: Resources, log: Any) -> None:
    """Makes the directories and writes the limits; on failure the caller's
    reclaim removes them."""
    writes = _all_writes(dirs, res, log)
    mounts = {h.mount for h in hierarchy.discover()}
    for d in dirs:
        if not d.made_from:
            _check_existing(d)
        _make(d.path, d.version)
        busy = _procs(d)
        if busy:
            raise ParacellError(f"container's cgroup is not empty: {len(busy)} process(es) "
                                f"found in {d.path}")
        if d.version == 2:
            mount = next((m for m in mounts if d.path.startswith(m + "/")), "")
            _enable_v2(d, mount)
    for d, name, value in writes:
        _write(d.path, name, value)
    if res.devices and all(d.version == 2 for d in dirs):
        # v2 has no devices files: a BPF program on the cgroup filters instead.
        from paracell.runtime.host.cgroups import devicebpf, files

        for d in dirs:
            devicebpf.attach(d.path, [*res.devices, *files.VMM_DEVICES])


def update(dirs: list[CgroupDir], res: Resources) -> None:
    for d, name, value in _all_writes(dirs, res, None):
        _write(d.path, name, value)


def join(paths: list[str], pid: int = 0) -> None:
    """The calling process (and so everything it forks), or process `pid`
    with all its threads (a QEMU that is libvirtd's child), joins the cgroup."""
    for path in paths:
        _write(path, "cgroup.procs", str(pid))


def facts(dirs: list[CgroupDir]) -> list[dict[str, Any]]:
    """As the state records them (HostRecord.cgroups)."""
    return [d.facts() for d in dirs]


def from_facts(recorded: list[dict[str, Any]]) -> list[CgroupDir]:
    return [CgroupDir(str(d["path"]), int(d["version"]), tuple(d["controllers"]),
                      str(d.get("made_from", ""))) for d in recorded]


def reclaim(recorded: list[dict[str, Any]]) -> None:
    """delete: kill what is left in the cgroup (a shim that crashed leaves
    nothing, but a create killed at the wrong moment might), then remove
    the directories, and the parents this create made if they are empty.
    A cgroup that was there before create is only removed if empty."""
    dirs = from_facts(recorded)
    for d in dirs:
        _kill_all(d)
    for d in dirs:
        _remove(d)


def _kill_all(d: CgroupDir) -> None:
    """Only in a cgroup this create made: one that existed before (refused
    because busy, say) holds processes that are not the container's."""
    if not d.made_from:
        return
    for pid in _procs(d):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _remove(d: CgroupDir) -> None:
    """The leaf, then the levels this create made, up to the first that is
    not empty: another container's cgroup lives there. While the leaf is
    busy, what is in it is killed again: a create interrupted as its shim
    starts has a shim, and then a QEMU, that join after the first kill."""
    if not _rmdir(d.path, wait_busy=True, meanwhile=lambda: _kill_all(d)):
        return
    if d.made_from:
        cur = os.path.dirname(d.path)
        stop = os.path.dirname(d.made_from)
        while cur != stop and cur.startswith(d.made_from):
            if not _rmdir(cur, wait_busy=False):
                return
            cur = os.path.dirname(cur)


# rmdir's answers for a level that is not there to remove: never made (its
# name ran past NAME_MAX or PATH_MAX), or a control file of the parent.
_NOT_A_LEVEL = (errno.ENOENT, errno.ENOTDIR, errno.ENAMETOOLONG)


def _rmdir(path: str, wait_busy: bool, meanwhile: Callable[[], None] | None = None) -> bool:
    """Whether the level is gone (or never was), so the one above may go too."""
    deadline = time.monotonic() + RMDIR_WAIT_S
    while True:
        try:
            os.rmdir(path)
            return True
        except OSError as err:
            if err.errno in _NOT_A_LEVEL:
                return True
            # EBUSY while the killed processes finish exiting.
            if not wait_busy or err.errno != errno.EBUSY or time.monotonic() > deadline:
                return False
            if meanwhile is not None:
                meanwhile()
            time.sleep(0.02)
