"""Mount options of config.json, as runc's specconv reads them.

Every option runc 1.1 accepts (`runc features`, mountOptions) has its meaning
here: MS_* flags for mount(2), a propagation change made after the mount,
MOUNT_ATTR_* bits applied recursively with mount_setattr(2) (the r* options),
or runc's extension tmpcopyup.  Anything else is filesystem data, as in runc.
"""

from __future__ import annotations

from dataclasses import dataclass

from paracell.linux import (
    MOUNT_ATTR__ATIME,
    MOUNT_ATTR_NOATIME,
    MOUNT_ATTR_NODEV,
    MOUNT_ATTR_NODIRATIME,
    MOUNT_ATTR_NOEXEC,
    MOUNT_ATTR_NOSUID,
    MOUNT_ATTR_NOSYMFOLLOW,
    MOUNT_ATTR_RDONLY,
    MOUNT_ATTR_RELATIME,
    MOUNT_ATTR_STRICTATIME,
    MS_BIND,
    MS_DIRSYNC,
    MS_I_VERSION,
    MS_LAZYTIME,
    MS_MANDLOCK,
    MS_NOATIME,
    MS_NODEV,
    MS_NODIRATIME,
    MS_NOEXEC,
    MS_NOSUID,
    MS_NOSYMFOLLOW,
    MS_POSIXACL,
    MS_PRIVATE,
    MS_RDONLY,
    MS_REC,
    MS_RELATIME,
    MS_REMOUNT,
    MS_SHARED,
    MS_SILENT,
    MS_SLAVE,
    MS_STRICTATIME,
    MS_SYNCHRONOUS,
    MS_UNBINDABLE,
)
from paracell.runtime.configcheck import fail

# option -> (bit, set it); "defaults" sets nothing, as in runc.
FLAGS = {
    "defaults": (0, True),
    "ro": (MS_RDONLY, True), "rw": (MS_RDONLY, False),
    "nosuid": (MS_NOSUID, True), "suid": (MS_NOSUID, False),
    "nodev": (MS_NODEV, True), "dev": (MS_NODEV, False),
    "noexec": (MS_NOEXEC, True), "exec": (MS_NOEXEC, False),
    "sync": (MS_SYNCHRONOUS, True), "async": (MS_SYNCHRONOUS, False),
    "remount": (MS_REMOUNT, True),
    "mand": (MS_MANDLOCK, True), "nomand": (MS_MANDLOCK, False),
    "dirsync": (MS_DIRSYNC, True),
    "nosymfollow": (MS_NOSYMFOLLOW, True), "symfollow": (MS_NOSYMFOLLOW, False),
    "noatime": (MS_NOATIME, True), "atime": (MS_NOATIME, False),
    "nodiratime": (MS_NODIRATIME, True), "diratime": (MS_NODIRATIME, False),
    "bind": (MS_BIND, True), "rbind": (MS_BIND | MS_REC, True),
    "silent": (MS_SILENT, True), "loud": (MS_SILENT, False),
    "acl": (MS_POSIXACL, True), "noacl": (MS_POSIXACL, False),
    "relatime": (MS_RELATIME, True), "norelatime": (MS_RELATIME, False),
    "iversion": (MS_I_VERSION, True), "noiversion": (MS_I_VERSION, False),
    "strictatime": (MS_STRICTATIME, True), "nostrictatime": (MS_STRICTATIME, False),
    "lazytime": (MS_LAZYTIME, True), "nolazytime": (MS_LAZYTIME, False),
}
PROPAGATION = {
    "private": MS_PRIVATE, "rprivate": MS_PRIVATE | MS_REC,
    "shared": MS_SHARED, "rshared": MS_SHARED | MS_REC,
    "slave": MS_SLAVE, "rslave": MS_SLAVE | MS_REC,
    "unbindable": MS_UNBINDABLE, "runbindable": MS_UNBINDABLE | MS_REC,
}
# option -> (MOUNT_ATTR_* bit, clear it), runc's recAttrFlags.
RECURSIVE = {
    "rro": (MOUNT_ATTR_RDONLY, False), "rrw": (MOUNT_ATTR_RDONLY, True),
    "rnosuid": (MOUNT_ATTR_NOSUID, False), "rsuid": (MOUNT_ATTR_NOSUID, True),
    "rnodev": (MOUNT_ATTR_NODEV, False), "rdev": (MOUNT_ATTR_NODEV, True),
    "rnoexec": (MOUNT_ATTR_NOEXEC, False), "rexec": (MOUNT_ATTR_NOEXEC, True),
    "rnodiratime": (MOUNT_ATTR_NODIRATIME, False), "rdiratime": (MOUNT_ATTR_NODIRATIME, True),
    "rrelatime": (MOUNT_ATTR_RELATIME, False), "rnorelatime": (MOUNT_ATTR_RELATIME, True),
    "rnoatime": (MOUNT_ATTR_NOATIME, False), "ratime": (MOUNT_ATTR_NOATIME, True),
    "rstrictatime": (MOUNT_ATTR_STRICTATIME, False),
    "rnostrictatime": (MOUNT_ATTR_STRICTATIME, True),
    "rnosymfollow": (MOUNT_ATTR_NOSYMFOLLOW, False), "rsymfollow": (MOUNT_ATTR_NOSYMFOLLOW, True),
}
ATIME_ATTRS = (MOUNT_ATTR_RELATIME, MOUNT_ATTR_NOATIME, MOUNT_ATTR_STRICTATIME)
# Filesystems the guest kernel has (guest/kernel/paracell.config) whose
# source is not a host path; "bind" and "none" are bind mounts.
GUEST_TYPES = {"proc", "sysfs", "tmpfs", "ramfs", "devpts", "mqueue", "cgroup", "cgroup2"}
BIND_TYPES = {"bind", "none"}
# Options ParaCell does not take, with why (runc 1.2's id-mapped mounts).
REFUSED = {
    "idmap": "id-mapped mounts are not supported in the guest yet",
    "ridmap": "id-mapped mounts are not supported in the guest yet",
}


def option_names() -> list[str]:
    """What `paracell features` lists: every option runc 1.1 lists."""
    return sorted({*FLAGS, *PROPAGATION, *RECURSIVE, "tmpcopyup"})


@dataclass
class MountOptions:
    flags: int = 0
    data: list[str] | None = None
    propagation: int = 0  # MS_SHARED etc., MS_REC for the r* forms; the last one given wins
    attr_set: int = 0
    attr_clr: int = 0
    tmpcopyup: bool = False


def parse(options: list[str], where: str) -> MountOptions:
    """Options in order, later ones overriding earlier ones, as in runc."""
    out = MountOptions(data=[])
    assert out.data is not None
    for opt in options:
        if opt in FLAGS:
            bit, on = FLAGS[opt]
            out.flags = out.flags | bit if on else out.flags & ~bit
        elif opt in PROPAGATION:
            out.propagation = PROPAGATION[opt]
        elif opt in RECURSIVE:
            bit, clear = RECURSIVE[opt]
            if clear:
                out.attr_clr |= bit
            else:
                out.attr_set |= bit
                if opt in ("rrelatime", "rnoatime", "rstrictatime"):
                    # mount_setattr(2): an atime setting must also clear the old one.
                    out.attr_clr |= MOUNT_ATTR__ATIME
        elif opt == "tmpcopyup":
            out.tmpcopyup = True
        elif opt in REFUSED:
            raise fail(f"{where}.options {opt!r}: {REFUSED[opt]}")
        else:
            out.data.append(opt)
    return out


def check_type(kind: str, options: MountOptions, where: str) -> None:
    if kind not in GUEST_TYPES | BIND_TYPES and not options.flags & MS_BIND:
        raise fail(f"{where}.type {kind[:64]!r} is not supported in the guest: its kernel has "
                    f"{', '.join(sorted(GUEST_TYPES))} and bind mounts")
