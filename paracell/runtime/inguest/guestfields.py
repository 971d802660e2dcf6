"""The config.json fields the guest agent applies besides mounts and sysctls:
linux.devices, the user namespace and its id maps, linux.rootfsPropagation,
linux.personality, process.ioPriority, and the LSM labels the guest kernel
cannot apply.  Each is checked as hostile input and turned into launch-spec
records (docs/agent-protocol.md); runc's wording is kept where it has one."""

from __future__ import annotations

import os
import posixpath
from typing import Any

from paracell import speckeys as K
from paracell._native import lib
from paracell.errors import ParacellError
from paracell.runtime.configcheck import entries
from paracell.runtime.configcheck import expect as _expect
from paracell.runtime.configcheck import fail as _fail
from paracell.runtime.configcheck import uint as _uint
from paracell.runtime.inguest import mountopts

Records = list[tuple[str, str]]

DEVICE_TYPES = {"c": "c", "u": "c", "b": "b", "p": "p"}
# The kernel's dev_t: 12-bit major, 20-bit minor (new_valid_dev).
MAX_MAJOR, MAX_MINOR = 4095, (1 << 20) - 1
MAX_ID = 2**32 - 1
IOPRIO_CLASSES = {
    "IOPRIO_CLASS_RT": lib.PC_SPEC_IOPRIO_CLASS_RT,
    "IOPRIO_CLASS_BE": lib.PC_SPEC_IOPRIO_CLASS_BE,
    "IOPRIO_CLASS_IDLE": lib.PC_SPEC_IOPRIO_CLASS_IDLE,
}
PERSONALITY_DOMAINS = {"LINUX": lib.PC_SPEC_PER_LINUX, "LINUX32": lib.PC_SPEC_PER_LINUX32}
ROOTFS_PROPAGATION = {
    name: bits for name, bits in mountopts.PROPAGATION.items()
}
SELINUX_REFUSED = "selinux label is specified in config, but selinux is disabled or not supported"


# ---- linux.devices ----

def device_records(linux: dict[str, Any], has_dev_mount: bool) -> Records:
    """Nodes made, as runc makes them, in the container's /dev, which must be
    a mount of the spec's own (a tmpfs): the rootfs is the host's directory
    through 9p, where a device node would be made on the host."""
    devices = entries(linux.get("devices") or [], "linux.devices", lib.PC_SPEC_MAX_DEVICES)
    if devices and not has_dev_mount:
        raise _fail("linux.devices needs a /dev mount in the spec: device nodes are made "
                    "in the container's own /dev, not in the host's rootfs directory")
    records = []
    for where, dev in devices:
        path = _expect(dev.get("path"), str, f"{where}.path")
        norm = posixpath.normpath(path) if path.startswith("/") else ""
        if (not norm.startswith("/dev/") or len(norm.encode()) > lib.PC_SPEC_MAX_PATH_LEN
                or any(c in norm for c in "\0\x1f")):
            raise _fail(f"{where}.path {path[:64]!r} must be an absolute path under /dev")
        kind = _expect(dev.get("type"), str, f"{where}.type")
        if kind not in DEVICE_TYPES:
            raise _fail(f"{where}.type {kind[:8]!r} is not one of c, b, u, p")
        major = minor = 0
        if kind != "p":
            major = _uint(dev.get("major"), f"{where}.major", MAX_MAJOR)
            minor = _uint(dev.get("minor"), f"{where}.minor", MAX_MINOR)
        mode = dev.get("fileMode")
        # podman sends the file type bits too (0o20666); runc keeps the permissions.
        mode = 0o666 if mode is None else _uint(mode, f"{where}.fileMode", 0o177777) & 0o7777
        uid = _uint(dev.get(K.UID, 0) or 0, f"{where}.uid", MAX_ID - 1)
        gid = _uint(dev.get(K.GID, 0) or 0, f"{where}.gid", MAX_ID - 1)
        fields = [norm, DEVICE_TYPES[kind], str(major), str(minor), f"{mode:o}", str(uid), str(gid)]
        records.append((K.DEVICE, "\x1f".join(fields)))
    return records


# ---- the user namespace ----

def _id_map(value: Any, where: str) -> list[str]:
    lines = []
    for at, m in entries(value, where, lib.PC_SPEC_MAX_ID_MAPS):
        inside = _uint(m.get("containerID"), f"{at}.containerID", MAX_ID - 1)
        outside = _uint(m.get("hostID"), f"{at}.hostID", MAX_ID - 1)
        size = _uint(m.get("size"), f"{at}.size", MAX_ID)
        if not size or inside + size > MAX_ID or outside + size > MAX_ID:
            raise _fail(f"{at}: size must be at least 1 and the range within 32 bits")
        lines.append(f"{inside} {outside} {size}")
    if sum(len(ln) + 1 for ln in lines) > lib.PC_SPEC_MAX_ID_MAP_TEXT:
        raise _fail(f"{where} is longer than the kernel takes in one write "
                    f"({lib.PC_SPEC_MAX_ID_MAP_TEXT} bytes of text)")
    return lines


# Every id the kernel has (0 .. 2^32-2) onto itself: a user namespace that
# changes no id, only what "root" may do outside it.
IDENTITY_ID_MAP = "0 0 4294967295"


def userns_records(linux: dict[str, Any], namespaces: dict[str, str]) -> tuple[Records, list[str]]:
    """A new user namespace in the guest with the spec's maps; warnings for
    what runc ignores.  A path cannot name a namespace of the guest's kernel."""
    warnings = []
    uid_map = _id_map(linux.get("uidMappings") or [], "linux.uidMappings")
    gid_map = _id_map(linux.get("gidMappings") or [], "linux.gidMappings")
    if "user" not in namespaces:
        if uid_map or gid_map:
            warnings.append("linux.uidMappings/gidMappings are ignored without a user "
                            "namespace in linux.namespaces, as runc ignores them")
        return [], warnings
    if namespaces["user"]:
        raise ParacellError(f"cannot join user namespace {namespaces['user'][:200]}: the "
                            "container runs in its own VM, whose kernel has no such namespace")
    if not uid_map and not gid_map:
        # The OCI spec: an entry without a path is a new namespace. runc 1.1
        # refuses it without maps; here the VM's whole id range maps onto
        # itself, so ids stay as they are while privilege is the namespace's
        # (docs/runtime.md).
        uid_map = gid_map = [IDENTITY_ID_MAP]
    if not uid_map:
        raise ParacellError("User namespaces enabled, but no uid mappings found.")
    if not gid_map:
        raise ParacellError("User namespaces enabled, but no gid mappings found.")
    records = [(K.USERNS, "1")]
    records += [(K.UIDMAP, ln) for ln in uid_map]
    records += [(K.GIDMAP, ln) for ln in gid_map]
    return records, warnings


# ---- propagation of /, personality ----

def rootfs_propagation_records(linux: dict[str, Any]) -> Records:
    value = _expect(linux.get("rootfsPropagation") or "", str, "linux.rootfsPropagation")
    if not value:
        return []
    if value not in ROOTFS_PROPAGATION:
        raise _fail(f"linux.rootfsPropagation {value[:32]!r} is not one of "
                    f"{', '.join(sorted(ROOTFS_PROPAGATION))}")
    return [(K.ROOT_PROPAGATION, str(ROOTFS_PROPAGATION[value]))]


def personality_records(linux: dict[str, Any]) -> tuple[Records, list[str]]:
    persona = linux.get("personality")
    if persona is None:
        return [], []
    _expect(persona, dict, "linux.personality")
    domain = _expect(persona.get("domain"), str, "linux.personality.domain")
    if domain not in PERSONALITY_DOMAINS:
        raise _fail(f"linux.personality.domain {domain[:32]!r} is not LINUX or LINUX32")
    flags = _expect(persona.get("flags") or [], list, "linux.personality.flags")
    warnings = []
    if flags:
        # runc 1.2's wording and behaviour: flags are logged and not applied.
        warnings.append(f"ignoring unsupported personality flags: {flags[:8]!r}")
    return [(K.PERSONALITY, str(PERSONALITY_DOMAINS[domain]))], warnings


# ---- process fields ----

def ioprio_record(process: dict[str, Any]) -> Records:
    prio = process.get("ioPriority")
    if prio is None:
        return []
    _expect(prio, dict, "process.ioPriority")
    cls = _expect(prio.get("class"), str, "process.ioPriority.class")
    if cls not in IOPRIO_CLASSES:
        raise _fail(f"process.ioPriority.class {cls[:32]!r} is not one of "
                    f"{', '.join(IOPRIO_CLASSES)}")
    level = _uint(prio.get("priority", 0), "process.ioPriority.priority",
                  lib.PC_SPEC_IOPRIO_MAX_LEVEL)
    return [(K.IOPRIO, f"{IOPRIO_CLASSES[cls]} {level}")]


def _host_has_apparmor() -> bool:
    try:
        with open("/sys/module/apparmor/parameters/enabled") as f:
            return f.read(1) == "Y"
    except OSError:
        return False


def _host_has_selinux() -> bool:
    return os.path.exists("/sys/fs/selinux/enforce")


def lsm_warnings(process: dict[str, Any], linux: dict[str, Any]) -> list[str]:
    """The guest kernel has neither AppArmor nor SELinux.  Where runc would
    apply the label (the host has the LSM), the container runs without it,
    its VM being the isolation, and a warning says so; where runc would fail
    (the host lacks it), this fails as runc does."""
    warnings = []
    profile = _expect(process.get("apparmorProfile") or "", str, "process.apparmorProfile")
    if profile:
        if not _host_has_apparmor():
            raise ParacellError(f"apparmor profile {profile[:128]!r} cannot be applied: "
                                "AppArmor is not enabled on this host (nor in the guest kernel)")
        warnings.append(f"apparmor profile {profile[:128]!r} is not applied: the guest kernel "
                        "has no AppArmor; the VM is the container's isolation")
    labels = [(_expect(process.get("selinuxLabel") or "", str, "process.selinuxLabel"),
               "process.selinuxLabel"),
              (_expect(linux.get("mountLabel") or "", str, "linux.mountLabel"),
               "linux.mountLabel")]
    for label, where in labels:
        if not label:
            continue
        if not _host_has_selinux():
            raise ParacellError(SELINUX_REFUSED)
        warnings.append(f"{where} {label[:128]!r} is not applied: the guest kernel has no "
                        "SELinux; the VM is the container's isolation")
    return warnings
