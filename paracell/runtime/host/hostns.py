"""The host side of the container's namespaces: where the shim and its QEMU live.

From the host, the container is the shim and its QEMU. So `linux.namespaces`
applies to them, the way runc applies it to the container's init:
- a type with no path gets a new namespace; a path is joined with setns(2);
- the PID namespace is entered by the fork that makes the shim, which is then
  PID 1 there: when it dies the kernel kills QEMU, so the VM can never
  outlive the pid that clients wait on;
- the mount namespace is the jail, in the spirit of Firecracker's jailer:
  made after the devices' host resources exist (the guest-RAM tmpfs and the
  host-share binds must be visible to `events` and `delete` on the host),
  slave to the host so nothing mounted inside leaks out, with a /proc of the
  new PID namespace and the host's system trees read-only; QEMU is then
  pivoted into a root of its own holding only what it needs (vmm/qemu/jail.py);
- QEMU runs with no_new_privs and a capability bounding set cut down to what
  its 9p server needs.

Order in the shim (shim.boot): cgroup join, then IPC, UTS and the cgroup
namespace (enter); the control socket; the network namespace
(paracell/net/netns.enter, once the cgroup namespace is set, so its root is
the container's cgroup either way); devices prepared, their TAPs in that
network namespace; then the mount namespace (jail); then QEMU with its
privileges dropped.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from paracell.errors import ParacellError
from paracell.linux import (
    CLONE_NEWCGROUP,
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWTIME,
    CLONE_NEWUSER,
    CLONE_NEWUTS,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_REC,
    MS_SLAVE,
    NS_GET_NSTYPE,
    PR_CAP_AMBIENT,
    PR_CAP_AMBIENT_CLEAR_ALL,
    PR_CAPBSET_DROP,
    PR_SET_NO_NEW_PRIVS,
    libc,
    make_readonly,
)

# Host trees that neither the shim nor QEMU writes once the VM runs: read-only
# in the jail, so a compromised QEMU (root, with CAP_DAC_OVERRIDE) cannot
# change host binaries, configuration or keys. A tree that holds a path the
# VM must write (its state, guest RAM, a writable rootfs, the log) is left as is.
READONLY_TREES = ("/usr", "/etc", "/boot", "/bin", "/sbin", "/lib", "/lib32", "/lib64",
                  "/libx32", "/opt", "/srv", "/root", "/home", "/var")

# OCI type -> (clone flag, the name runc's nsexec uses in its messages).
TYPES: dict[str, tuple[int, str]] = {
    "pid": (CLONE_NEWPID, "pid"), "network": (CLONE_NEWNET, "net"),
    "mount": (CLONE_NEWNS, "mnt"), "ipc": (CLONE_NEWIPC, "ipc"),
    "uts": (CLONE_NEWUTS, "uts"), "user": (CLONE_NEWUSER, "user"),
    "cgroup": (CLONE_NEWCGROUP, "cgroup"), "time": (CLONE_NEWTIME, "time"),
}
NAME_OF_FLAG = {flag: name for flag, name in TYPES.values()}
# Applied to the shim and QEMU on the host. network is the net helper's
# (paracell/net); user and time are the guest's business (a user namespace on
# the host would take QEMU's right to serve the rootfs with the container's uids).
HOST_TYPES = ("pid", "mount", "ipc", "uts", "cgroup")

# What QEMU keeps: its 9p server creates files with the container's owners
# and modes (chown, fowner, fsetid, mknod, setfcap) and reads any of them
# (dac_override, dac_read_search). Everything else goes from its bounding set.
QEMU_CAPS = frozenset({0, 1, 2, 3, 4, 27, 31})
CAP_LAST_CAP_FILE = "/proc/sys/kernel/cap_last_cap"


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise ParacellError(f"{what}: {os.strerror(err)}")


@dataclass
class NamespacePlan:
    """linux.namespaces for the host side: types to make, paths to join."""

    new: set[str] = field(default_factory=set)
    join: dict[str, str] = field(default_factory=dict)

    def wants(self, kind: str) -> bool:
        return kind in self.new or kind in self.join


def ns_type_of(fd: int) -> int:
    return fcntl.ioctl(fd, NS_GET_NSTYPE)


def plan(namespaces: dict[str, str]) -> NamespacePlan:
    """Checks every path now, before anything exists, with runc's wording for
    a path of the wrong type (nsexec: 'failed to setns into X namespace')."""
    result = NamespacePlan()
    for kind, path in namespaces.items():
        if kind not in TYPES:
            raise ParacellError(f"invalid config.json: unknown namespace type {kind!r}")
        if kind not in HOST_TYPES:
            continue
        if not path:
            result.new.add(kind)
            continue
        os.close(_open_ns(path, kind))
        result.join[kind] = path
    return result


def _open_ns(path: str, kind: str) -> int:
    """An fd of the namespace at a hostile path, checked to be of `kind`.
    Looked at with O_PATH first: an open for reading could block on a FIFO or
    act on a device (arming a watchdog); namespace files, /proc's and
    bind-mounted ones, are regular files."""
    import stat

    flag, name = TYPES[kind]
    try:
        probe = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as err:
        raise ParacellError(f"failed to open {path}: {err.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(probe).st_mode):
            raise ParacellError(f"failed to setns into {name} namespace: Invalid argument "
                                f"({path} is not a namespace)")
        fd = os.open(f"/proc/self/fd/{probe}", os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    finally:
        os.close(probe)
    try:
        actual = ns_type_of(fd)
    except OSError:
        os.close(fd)
        raise ParacellError(f"failed to setns into {name} namespace: Invalid argument "
                            f"({path} is not a namespace)") from None
    if actual != flag:
        os.close(fd)
        raise ParacellError(f"failed to setns into {name} namespace: Invalid argument "
                            f"({path} is a {NAME_OF_FLAG.get(actual, '?')} namespace)")
    return fd


def _setns(path: str, kind: str) -> None:
    """Checked again here: the path may have changed since create looked."""
    fd = _open_ns(path, kind)
    try:
        _check(libc().setns(fd, TYPES[kind][0]), f"failed to setns into {TYPES[kind][1]} "
               "namespace")
    finally:
        os.close(fd)


def _unshare(flags: int, what: str) -> None:
    _check(libc().unshare(flags), f"unshare {what}")


@dataclass
class HostIsolation:
    """Everything the shim applies to itself and QEMU on the host."""

    namespaces: NamespacePlan
    # The container's cgroup directories: the shim joins them first thing.
    cgroup_dirs: list[str] = field(default_factory=list)
    # An fd of the host's /proc, opened before the jail mounts its own.
    host_proc: int = -1
    # What the shim and QEMU write after the jail is made: their trees stay writable.
    writable: list[str] = field(default_factory=list)
    # The trees the jail made read-only (for the log and the tests).
    readonly: list[str] = field(default_factory=list)
    # QEMU's own root (vmm/qemu/jail.py), planned once the shim is jailed.
    qemu_root: Any = None
    _shim_jailed: bool = False

    # -- in the process that forks the shim ---------------------------------

    @contextmanager
    def pid_namespace_for_child(self) -> Iterator[None]:
        """Around the fork that makes the shim: the child is born in the PID
        namespace (PID 1 of a new one). The caller's own children after it
        are born in the caller's namespace again."""
        ns = self.namespaces
        if not ns.wants("pid"):
            yield
            return
        own = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        forker = os.getpid()
        try:
            if "pid" in ns.join:
                _setns(ns.join["pid"], "pid")
            else:
                _unshare(CLONE_NEWPID, "pid namespace")
            try:
                yield
            finally:
                # Only the forking process goes back: the child, born in the
                # new namespace, could not enter its ancestor's anyway.
                if os.getpid() == forker:
                    _check(libc().setns(own, CLONE_NEWPID), "restoring the pid namespace")
        finally:
            os.close(own)

    # -- in the shim ---------------------------------------------------------

    def enter(self) -> None:
        """Cgroup, then the namespaces that need no mounts of their own."""
        from paracell.runtime.host import cgroups

        self.host_proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        cgroups.join(self.cgroup_dirs)
        ns = self.namespaces
        for kind in ("ipc", "uts"):
            if kind in ns.join:
                _setns(ns.join[kind], kind)
        flags = sum(TYPES[k][0] for k in ("ipc", "uts") if k in ns.new)
        if flags:
            _unshare(flags, "ipc/uts namespaces")
        # After the cgroup join, so the namespace's root is the container's
        # cgroup. The network namespace comes after this, in shim.boot.
        if "cgroup" in ns.join:
            _setns(ns.join["cgroup"], "cgroup")
        elif "cgroup" in ns.new:
            _unshare(CLONE_NEWCGROUP, "cgroup namespace")

    def jail(self, qemu_paths: dict[str, bool], state_dir: str) -> None:
        """The mount namespace, the first time, once the devices' host
        resources exist; and for each QEMU launched, the plan of its own root
        inside it, from the paths it opens (a cold boot after a failed
        copy-on-write restore opens a RAM file that one did not)."""
        from paracell.vmm.qemu import jail

        if not self._shim_jailed:
            self._jail_shim()
            self._shim_jailed = True
        if "mount" in self.namespaces.new:
            self.qemu_root = jail.plan_for(qemu_paths, state_dir)

    def _jail_shim(self) -> None:
        ns = self.namespaces
        if "mount" in ns.join:
            _setns(ns.join["mount"], "mount")
            return
        if "mount" not in ns.new:
            return
        lib = libc()
        _unshare(CLONE_NEWNS, "mount namespace")
        # Slave, not private: the host's unmounts still reach us, so the jail
        # never pins a mount (an overlay rootfs) the host wants to remove.
        _check(lib.mount(None, b"/", None, MS_REC | MS_SLAVE, None), "making / a slave mount")
        if "pid" in ns.new:
            _check(lib.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None),
                   "mounting /proc of the pid namespace")
        self.readonly = _readonly_trees(self.writable)



    def host_pids(self, qemu_pid: int, child: bool = True) -> tuple[int, int, int]:
        """The shim's pid, QEMU's pid and QEMU's start time as the host sees
        them: os.getpid() is 1 in a new PID namespace, and clients wait on
        and signal host pids. A QEMU that is not our child (libvirt's) comes
        with its host pid already."""
        from paracell.procfs import process_start_time

        if self.host_proc < 0:
            return os.getpid(), qemu_pid, process_start_time(qemu_pid) or 0
        me = int(os.readlink("self", dir_fd=self.host_proc))
        if child and self.namespaces.wants("pid"):
            qemu_pid = next((int(name) for name in os.listdir(self.host_proc)
                             if name.isdigit() and _child_of(self.host_proc, name, me, qemu_pid)),
                            0)
            if not qemu_pid:
                raise ParacellError("cannot find QEMU's host pid")
        return me, qemu_pid, _start_time(self.host_proc, qemu_pid)

    def qemu_preexec(self) -> None:
        """QEMU's child before exec: its root, then its privileges. An error
        goes to QEMU's log (fd 2) before the exception ends the child."""
        try:
            if self.qemu_root is not None:
                from paracell.vmm.qemu import jail

                jail.enter(self.qemu_root)
            drop_qemu_privileges()
        except BaseException as err:
            os.write(2, f"paracell: jailing QEMU: {err}\n".encode(errors="replace"))
            raise

    def close(self) -> None:
        if self.host_proc >= 0:
            os.close(self.host_proc)
            self.host_proc = -1


def _inside(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree + "/")


def _readonly_trees(writable: list[str]) -> list[str]:
    """Binds each of READONLY_TREES onto itself and makes it read-only,
    submounts included (mount_setattr), unless the VM writes below it."""
    keep = [os.path.realpath(p) for p in writable]
    lib = libc()
    done = []
    for tree in READONLY_TREES:
        # A symlink (/bin -> usr/bin) is covered by its target; a tree that
        # holds, or lies inside, a path the VM writes is left writable.
        if os.path.islink(tree) or not os.path.isdir(tree) \
                or any(_inside(p, tree) or _inside(tree, p) for p in keep):
            continue
        path = tree.encode()
        _check(lib.mount(path, path, None, MS_BIND | MS_REC, None), f"binding {tree}")
        _check(make_readonly(path), f"making {tree} read-only")
        done.append(tree)
    return done


def _read_at(proc_fd: int, path: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc_fd)
    except OSError:
        return ""
    try:
        return os.read(fd, 16384).decode(errors="replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def _start_time(proc_fd: int, pid: int) -> int:
    """Field 22 of /proc/PID/stat, as paracell.procfs reads it."""
    stat = _read_at(proc_fd, f"{pid}/stat")
    fields = stat[stat.rfind(")") + 2:].split()
    return int(fields[19]) if len(fields) > 19 else 0


def _child_of(proc_fd: int, name: str, parent: int, ns_pid: int) -> bool:
    """Whether host pid `name` is `parent`'s child with pid `ns_pid` in its namespace."""
    text = _read_at(proc_fd, f"{name}/status")
    fields = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
    nspids = fields.get("NSpid", "").split()
    return fields.get("PPid", "").strip() == str(parent) and bool(nspids) \
        and nspids[-1] == str(ns_pid)


def drop_qemu_privileges() -> None:
    """QEMU's preexec: no_new_privs, no ambient capabilities, and a bounding
    set of QEMU_CAPS only, so the QEMU binary runs with no more than those.
    Runs in the forked child before exec: no allocation-heavy work here."""
    lib = libc()
    _check(lib.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    lib.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    for cap in range(_last_cap() + 1):
        if cap not in QEMU_CAPS and lib.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 \
                and ctypes.get_errno() != errno.EINVAL:  # EINVAL: a cap this kernel lacks
            _check(-1, f"dropping capability {cap}")


_LAST_CAP: list[int] = []


def _last_cap() -> int:
    # Read before fork (prepare_qemu_privileges), so the child only uses it.
    if not _LAST_CAP:
        try:
            with open(CAP_LAST_CAP_FILE) as f:
                _LAST_CAP.append(int(f.read()))
        except (OSError, ValueError):
            _LAST_CAP.append(40)
    return _LAST_CAP[0]


def prepare_qemu_privileges() -> None:
    _last_cap()
    libc()
    import paracell.vmm.qemu.jail  # noqa: F401  (imported before the fork)


def describe(plan_: NamespacePlan) -> dict[str, Any]:
    return {"new": sorted(plan_.new), "join": dict(plan_.join)}
