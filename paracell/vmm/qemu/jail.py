"""QEMU's own root, in the spirit of Firecracker's jailer: a tmpfs that holds
only what this VM's QEMU needs, bound at the same paths, read-only wherever
QEMU only reads, and QEMU pivoted into it.

What QEMU needs is what the VM's devices say they open (Device.host_paths:
the guest-RAM file, the console log, the 9p shares), with the binary, the
kernel and the initramfs; sockets and the TAP come as inherited fds and
need no path.
To that come /usr (QEMU, its libraries and firmware), the loader's cache,
/sys read-only, a few device nodes and a /proc of its own. Everything else of
the host, other containers' RAM files and state included, is simply not there.

Built in QEMU's child between fork and exec (preexec), in a mount namespace
nested in the shim's jail, so the shim keeps its view: the plan is computed
before the fork, the child only makes directories and mounts.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field

from paracell.linux import (
    CLONE_NEWNS,
    MNT_DETACH,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_RDONLY,
    MS_REC,
    MS_REMOUNT,
    MS_SLAVE,
    libc,
    make_readonly,
    pivot_root,
)

JAIL_DIR = "jail"
# Read-only, whole: QEMU's binary, libraries and firmware; what it may probe.
SYSTEM_DIRS = ("/usr", "/sys")
SYSTEM_FILES = ("/etc/ld.so.cache",)
# Read-write device nodes QEMU may open: /dev/kvm, the rest for glib and TAP.
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/kvm",
           "/dev/net/tun", "/dev/vhost-net", "/dev/vhost-vsock")
# Merged-/usr hosts make these symlinks into /usr; others have directories.
ROOT_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


@dataclass
class JailPlan:
    root: str
    # (host path, is a directory, writable)
    binds: list[tuple[str, bool, bool]] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)


def plan_for(paths: dict[str, bool], state_dir: str) -> JailPlan:
    """Before the fork: what QEMU's root holds. `paths` are the host paths
    QEMU opens -> whether it writes them, as the VM's devices state them
    (VmBuilder.host_paths)."""
    root = os.path.join(state_dir, JAIL_DIR)
    os.makedirs(root, mode=0o700, exist_ok=True)
    plan = JailPlan(root)
    for name in ROOT_LINKS:
        if os.path.islink(name):
            plan.links.append((name, os.readlink(name)))
        elif os.path.isdir(name):
            plan.binds.append((name, True, False))
    plan.binds += [(d, True, False) for d in SYSTEM_DIRS if os.path.isdir(d)]
    plan.binds += [(f, False, False) for f in SYSTEM_FILES if os.path.isfile(f)]
    plan.binds += [(d, False, True) for d in DEVICES if os.path.exists(d)]
    for path, writes in paths.items():
        if path.startswith(("/usr/", "/sys/", "/dev/")) and not writes:
            continue  # in a tree bound already
        if not os.path.exists(path):
            if not writes:
                continue  # QEMU will say it is missing, as it would unjailed
            # A chardev file QEMU would create: made now, so it can be bound.
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        plan.binds.append((path, os.path.isdir(path), writes))
    return plan


def _mount(src: bytes | None, target: str, fstype: bytes | None, flags: int,
           data: bytes | None, what: str) -> None:
    lib = libc()
    if lib.mount(src, target.encode(), fstype, flags, data) != 0:
        raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")


def enter(plan: JailPlan) -> None:
    """In QEMU's child before exec: a mount namespace of its own whose root is
    the plan's tmpfs. Raises OSError; the caller reports it."""
    lib = libc()
    if lib.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare mount namespace")
    _mount(None, "/", None, MS_REC | MS_SLAVE, None, "making / a slave")
    root = plan.root
    _mount(b"paracell-qemu-root", root, b"tmpfs", MS_NOSUID | MS_NODEV,
           b"size=1m,mode=0755", "mounting QEMU's root")
    for path, is_dir, writable in plan.binds:
        target = root + path
        if is_dir:
            os.makedirs(target, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        _mount(path.encode(), target, None, MS_BIND | MS_REC, None,
               f"binding {path}")
        if not writable and make_readonly(target.encode()) != 0:
            raise OSError(ctypes.get_errno(), f"making {path} read-only")
    for name, target in plan.links:
        os.symlink(target, root + name)
    os.makedirs(root + "/proc", exist_ok=True)
    _mount(b"proc", root + "/proc", b"proc",
           MS_NOSUID | MS_NODEV | MS_NOEXEC, None, "mounting /proc")
    os.makedirs(root + "/.old", exist_ok=True)
    os.chdir(root)
    if pivot_root(b".", b".old") != 0:
        raise OSError(ctypes.get_errno(), "pivot_root")
    os.chdir("/")
    if lib.umount2(b"/.old", MNT_DETACH) != 0:
        raise OSError(ctypes.get_errno(), "detaching the old root")
    os.rmdir("/.old")
    # Nothing is ever created in QEMU's root itself.
    _mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None,
           "making QEMU's root read-only")

