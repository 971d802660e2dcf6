"""Linux ABI numbers, and the one handle on libc for the calls Python's os
module lacks (mount, setns, unshare, mount_setattr, pivot_root, bpf).

The numbers are not typed here: paracell._linux (csrc/build_linux.py) takes
them from the system's headers at build time, so they are right for the
architecture the package is built on; syscall numbers differ between x86-64
and arm64."""

from __future__ import annotations

import ctypes
import os

from paracell._linux import lib as _abi

# <sys/mount.h>: mount(2), umount2(2) and mount_setattr(2)
MS_RDONLY = int(_abi.MS_RDONLY)
MS_NOSUID = int(_abi.MS_NOSUID)
MS_NODEV = int(_abi.MS_NODEV)
MS_NOEXEC = int(_abi.MS_NOEXEC)
MS_SYNCHRONOUS = int(_abi.MS_SYNCHRONOUS)
MS_REMOUNT = int(_abi.MS_REMOUNT)
MS_MANDLOCK = int(_abi.MS_MANDLOCK)
MS_DIRSYNC = int(_abi.MS_DIRSYNC)
MS_NOSYMFOLLOW = int(_abi.MS_NOSYMFOLLOW)
MS_NOATIME = int(_abi.MS_NOATIME)
MS_NODIRATIME = int(_abi.MS_NODIRATIME)
MS_BIND = int(_abi.MS_BIND)
MS_REC = int(_abi.MS_REC)
MS_SILENT = int(_abi.MS_SILENT)
MS_POSIXACL = int(_abi.MS_POSIXACL)
MS_UNBINDABLE = int(_abi.MS_UNBINDABLE)
MS_PRIVATE = int(_abi.MS_PRIVATE)
MS_SLAVE = int(_abi.MS_SLAVE)
MS_SHARED = int(_abi.MS_SHARED)
MS_RELATIME = int(_abi.MS_RELATIME)
MS_I_VERSION = int(_abi.MS_I_VERSION)
MS_STRICTATIME = int(_abi.MS_STRICTATIME)
MS_LAZYTIME = int(_abi.MS_LAZYTIME)
MNT_DETACH = int(_abi.MNT_DETACH)
MOUNT_ATTR_RDONLY = int(_abi.MOUNT_ATTR_RDONLY)
MOUNT_ATTR_NOSUID = int(_abi.MOUNT_ATTR_NOSUID)
MOUNT_ATTR_NODEV = int(_abi.MOUNT_ATTR_NODEV)
MOUNT_ATTR_NOEXEC = int(_abi.MOUNT_ATTR_NOEXEC)
MOUNT_ATTR__ATIME = int(_abi.MOUNT_ATTR__ATIME)
MOUNT_ATTR_RELATIME = int(_abi.MOUNT_ATTR_RELATIME)
MOUNT_ATTR_NOATIME = int(_abi.MOUNT_ATTR_NOATIME)
MOUNT_ATTR_STRICTATIME = int(_abi.MOUNT_ATTR_STRICTATIME)
MOUNT_ATTR_NODIRATIME = int(_abi.MOUNT_ATTR_NODIRATIME)
MOUNT_ATTR_NOSYMFOLLOW = int(_abi.MOUNT_ATTR_NOSYMFOLLOW)

# <fcntl.h>: *at() calls
AT_FDCWD = int(_abi.AT_FDCWD)
AT_RECURSIVE = int(_abi.AT_RECURSIVE)

# <sched.h>: namespaces (setns, unshare)
CLONE_NEWNS = int(_abi.CLONE_NEWNS)
CLONE_NEWCGROUP = int(_abi.CLONE_NEWCGROUP)
CLONE_NEWUTS = int(_abi.CLONE_NEWUTS)
CLONE_NEWIPC = int(_abi.CLONE_NEWIPC)
CLONE_NEWUSER = int(_abi.CLONE_NEWUSER)
CLONE_NEWPID = int(_abi.CLONE_NEWPID)
CLONE_NEWNET = int(_abi.CLONE_NEWNET)
CLONE_NEWTIME = int(_abi.CLONE_NEWTIME)

# <linux/nsfs.h>: namespace file ioctls
NS_GET_NSTYPE = int(_abi.NS_GET_NSTYPE)

# <sys/prctl.h>: prctl(2)
PR_CAPBSET_DROP = int(_abi.PR_CAPBSET_DROP)
PR_SET_NO_NEW_PRIVS = int(_abi.PR_SET_NO_NEW_PRIVS)
PR_CAP_AMBIENT = int(_abi.PR_CAP_AMBIENT)
PR_CAP_AMBIENT_CLEAR_ALL = int(_abi.PR_CAP_AMBIENT_CLEAR_ALL)
PR_SET_CHILD_SUBREAPER = int(_abi.PR_SET_CHILD_SUBREAPER)

# <sys/syscall.h>: syscalls glibc has no wrapper for
SYS_mount_setattr = int(_abi.SYS_mount_setattr)
SYS_bpf = int(_abi.SYS_bpf)
SYS_pivot_root = int(_abi.SYS_pivot_root)

# <linux/bpf.h>: the cgroup devices program
BPF_PROG_LOAD = int(_abi.BPF_PROG_LOAD)
BPF_PROG_ATTACH = int(_abi.BPF_PROG_ATTACH)
BPF_PROG_TYPE_CGROUP_DEVICE = int(_abi.BPF_PROG_TYPE_CGROUP_DEVICE)
BPF_CGROUP_DEVICE = int(_abi.BPF_CGROUP_DEVICE)
BPF_F_ALLOW_MULTI = int(_abi.BPF_F_ALLOW_MULTI)
BPF_DEVCG_DEV_BLOCK = int(_abi.BPF_DEVCG_DEV_BLOCK)
BPF_DEVCG_DEV_CHAR = int(_abi.BPF_DEVCG_DEV_CHAR)
BPF_DEVCG_ACC_MKNOD = int(_abi.BPF_DEVCG_ACC_MKNOD)
BPF_DEVCG_ACC_READ = int(_abi.BPF_DEVCG_ACC_READ)
BPF_DEVCG_ACC_WRITE = int(_abi.BPF_DEVCG_ACC_WRITE)

# <linux/if_tun.h>: TAP devices
TUNSETIFF = int(_abi.TUNSETIFF)
TUNSETPERSIST = int(_abi.TUNSETPERSIST)
IFF_TAP = int(_abi.IFF_TAP)
IFF_NO_PI = int(_abi.IFF_NO_PI)
IFF_VNET_HDR = int(_abi.IFF_VNET_HDR)

# <net/if.h>: interface names, and the flag of an interface that is up
IFNAMSIZ = int(_abi.IFNAMSIZ)
IFF_UP = int(_abi.IFF_UP)
# <linux/sockios.h>: an interface's hardware address, whose family is its ARPHRD
# type; its flags, read and set without rtnetlink
SIOCGIFHWADDR = int(_abi.SIOCGIFHWADDR)
SIOCGIFFLAGS = int(_abi.SIOCGIFFLAGS)
SIOCSIFFLAGS = int(_abi.SIOCSIFFLAGS)


_libc: ctypes.CDLL | None = None


def libc() -> ctypes.CDLL:
    """Loaded once, and before any fork that needs it (QEMU's preexec)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    return _libc


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def make_readonly(path: bytes) -> int:
    """A mount and every mount below it read-only (mount_setattr(2)); 0, or -1
    with errno set. No fork-unsafe work: QEMU's jail calls it after fork."""
    attr = _MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
    return int(libc().syscall(SYS_mount_setattr, AT_FDCWD, path, AT_RECURSIVE,
                              ctypes.byref(attr), ctypes.sizeof(attr)))


def pivot_root(new_root: bytes, put_old: bytes) -> int:
    """pivot_root(2); 0, or -1 with errno set."""
    return int(libc().syscall(SYS_pivot_root, new_root, put_old))


def become_subreaper() -> None:
    """Orphaned descendants are re-parented to us, so we can reap them and
    read their exit status (containerd's shims wait on detached processes)."""
    if libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def bpf(cmd: int, attr: ctypes.Array[ctypes.c_char]) -> int:
    """bpf(2) with attr as its union bpf_attr; the result, or -1 with errno set."""
    return int(libc().syscall(SYS_bpf, cmd, attr, len(attr)))
