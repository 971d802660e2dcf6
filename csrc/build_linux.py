"""cffi builder for paracell._linux: the Linux ABI numbers the host side uses,
taken from the system's own headers when the package is built, so that they
are right for the architecture it is built on (syscall numbers differ between
x86-64 and arm64) and are typed nowhere. paracell/linux.py is their one home."""

from __future__ import annotations

from cffi import FFI

# Each header's names; cffi asks the compiler for every value.
NAMES = {
    "sys/mount.h": (
        "MS_RDONLY MS_NOSUID MS_NODEV MS_NOEXEC MS_SYNCHRONOUS MS_REMOUNT MS_MANDLOCK "
        "MS_DIRSYNC MS_NOSYMFOLLOW MS_NOATIME MS_NODIRATIME MS_BIND MS_REC MS_SILENT "
        "MS_POSIXACL MS_UNBINDABLE MS_PRIVATE MS_SLAVE MS_SHARED MS_RELATIME MS_I_VERSION "
        "MS_STRICTATIME MS_LAZYTIME MNT_DETACH "
        "MOUNT_ATTR_RDONLY MOUNT_ATTR_NOSUID MOUNT_ATTR_NODEV MOUNT_ATTR_NOEXEC "
        "MOUNT_ATTR__ATIME MOUNT_ATTR_RELATIME MOUNT_ATTR_NOATIME MOUNT_ATTR_STRICTATIME "
        "MOUNT_ATTR_NODIRATIME MOUNT_ATTR_NOSYMFOLLOW"),
    "fcntl.h": "AT_FDCWD AT_RECURSIVE",
    "sched.h": ("CLONE_NEWNS CLONE_NEWCGROUP CLONE_NEWUTS CLONE_NEWIPC CLONE_NEWUSER "
                "CLONE_NEWPID CLONE_NEWNET CLONE_NEWTIME"),
    "linux/nsfs.h": "NS_GET_NSTYPE",
    "sys/prctl.h": ("PR_CAPBSET_DROP PR_SET_NO_NEW_PRIVS PR_CAP_AMBIENT PR_CAP_AMBIENT_CLEAR_ALL "
                    "PR_SET_CHILD_SUBREAPER"),
    "sys/syscall.h": "SYS_mount_setattr SYS_bpf SYS_pivot_root",
    "linux/bpf.h": ("BPF_PROG_LOAD BPF_PROG_ATTACH BPF_PROG_TYPE_CGROUP_DEVICE "
                    "BPF_CGROUP_DEVICE BPF_F_ALLOW_MULTI BPF_DEVCG_DEV_BLOCK BPF_DEVCG_DEV_CHAR "
                    "BPF_DEVCG_ACC_MKNOD BPF_DEVCG_ACC_READ BPF_DEVCG_ACC_WRITE"),
    "linux/if_tun.h": "TUNSETIFF TUNSETPERSIST IFF_TAP IFF_NO_PI IFF_VNET_HDR",
    "net/if.h": "IFNAMSIZ IFF_UP",
    "linux/sockios.h": "SIOCGIFHWADDR SIOCGIFFLAGS SIOCSIFFLAGS",
}

ffibuilder = FFI()
ffibuilder.cdef("\n".join(f"static const long long {name};"
                          for names in NAMES.values() for name in names.split()))
ffibuilder.set_source("paracell._linux", "\n".join(f"#include <{h}>" for h in NAMES),
                      extra_compile_args=["-O2", "-Wall", "-Werror"])

if __name__ == "__main__":
    ffibuilder.compile(verbose=False)
