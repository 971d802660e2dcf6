"""OCI bundle validation and the agent's launch spec.

Everything in config.json is untrusted: each field is type-checked and bounded
here, on the host, and turned into the flat `key=value` records the guest agent
reads (docs/agent-protocol.md). Errors are one line, naming the field.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paracell import speckeys as K
from paracell import wire
from paracell._native import lib
from paracell.errors import ParacellError
from paracell.jsonfile import parse_json, read_regular
from paracell.linux import MS_BIND
from paracell.runtime.bundle.mountpoints import INVALID_ROOTFS, MountPoint, create_mount_points
from paracell.runtime.configcheck import expect as _expect
from paracell.runtime.configcheck import fail as _fail
from paracell.runtime.inguest import guestfields, mountopts, seccomp
from paracell.vmm import hostshare

MAX_CONFIG_BYTES = 4 << 20
GUEST_ROOTFS = wire.text("PC_ROOTFS_DIR")
GUEST_HOSTSHARE = wire.text("PC_HOSTSHARE_DIR")
MAX_ID_VALUE = 2**32 - 2
RLIM_INFINITY = 2**64 - 1

RLIMITS = {
    "RLIMIT_CPU": 0, "RLIMIT_FSIZE": 1, "RLIMIT_DATA": 2, "RLIMIT_STACK": 3,
    "RLIMIT_CORE": 4, "RLIMIT_RSS": 5, "RLIMIT_NPROC": 6, "RLIMIT_NOFILE": 7,
    "RLIMIT_MEMLOCK": 8, "RLIMIT_AS": 9, "RLIMIT_LOCKS": 10, "RLIMIT_SIGPENDING": 11,
    "RLIMIT_MSGQUEUE": 12, "RLIMIT_NICE": 13, "RLIMIT_RTPRIO": 14, "RLIMIT_RTTIME": 15,
}

CAPABILITIES = {
    name: number
    for number, name in enumerate(
        """CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP
        LINUX_IMMUTABLE NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK
        IPC_OWNER SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN
        SYS_BOOT SYS_NICE SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE
        AUDIT_CONTROL SETFCAP MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND
        AUDIT_READ PERFMON BPF CHECKPOINT_RESTORE""".split()
    )
}

# runc's list: the sysctls that live in an IPC namespace, besides fs.mqueue.*.
IPC_SYSCTLS = {
    "kernel.msgmax", "kernel.msgmnb", "kernel.msgmni", "kernel.sem", "kernel.shmall",
    "kernel.shmmax", "kernel.shmmni", "kernel.shm_rmid_forced",
}
# A sysctl as a path under /proc/sys: parts of [A-Za-z0-9_.-] (an interface
# name may hold a dot), never "." or "..", so it names a file there and
# nothing else (the agent checks the same).
SYSCTL_PART = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class HostBind:
    """A bind mount whose source is outside the rootfs: shared through
    hostshare, at `entry` (SLOT/NAME: vmm/hostshare.bind_entry)."""

    source: Path
    slot: str

    @property
    def entry(self) -> str:
        return hostshare.bind_entry(self.slot, self.source)


@dataclass(frozen=True)
class MountRecord:
    """One `mount` record of the launch spec, validated. A bind source
    outside the rootfs is an entry of the bind share (HostBind.entry), whose
    guest path (Bundle.bind_prefix) depends on the VM the container runs in."""

    dest: str
    kind: str
    source: str
    flags: int
    data: str
    propagation: int
    attr_set: int
    attr_clr: int
    copyup: bool
    host_entry: str | None = None

    def record(self, bind_prefix: str) -> tuple[str, str]:
        source = self.source if self.host_entry is None else f"{bind_prefix}/{self.host_entry}"
        return (K.MOUNT, "\x1f".join([
            self.dest, self.kind, source, str(self.flags), self.data, str(self.propagation),
            str(self.attr_set), str(self.attr_clr), "1" if self.copyup else "0"]))


@dataclass
class Bundle:
    path: Path
    config: dict[str, Any]
    rootfs: Path
    rootfs_readonly: bool
    annotations: dict[str, str]
    host_binds: list[HostBind] = field(default_factory=list)
    mount_points: list[MountPoint] = field(default_factory=list)
    # Where bind sources from outside the rootfs appear in the guest: the VM's
    # hostshare, or a pod member's directory of the pod share (runtime/pod/pod.py);
    # applied when the launch spec is encoded.
    bind_prefix: str = GUEST_HOSTSHARE
    # What runc would apply but the guest cannot, logged by create.
    warnings: list[str] = field(default_factory=list)
    # linux.namespaces, parsed once: type -> path ("" for a new one).
    namespaces: dict[str, str] = field(default_factory=dict)
    # The launch spec's parts, built once by validate: the init's process,
    # its mounts and its linux records.
    process_records: list[tuple[str, str]] = field(default_factory=list)
    mounts: list[MountRecord] = field(default_factory=list)
    linux_records: list[tuple[str, str]] = field(default_factory=list)
    # linux.seccomp compiled: the PC_SECCOMP payload sent before the init's SPEC.
    seccomp: bytes | None = None


def _str_list(value: Any, where: str, limit: int) -> list[str]:
    _expect(value, list, where)
    if len(value) > limit:
        raise _fail(f"{where} has more than {limit} entries")
    for i, item in enumerate(value):
        _expect(item, str, f"{where}[{i}]")
    return value


def _id_value(value: Any, where: str) -> int:
    _expect(value, int, where)
    if not 0 <= value <= MAX_ID_VALUE:
        raise _fail(f"{where} {value} is out of range")
    return value


def read_json_file(path: str | os.PathLike[str], limit: int) -> Any:
    """Reads at most `limit` bytes of untrusted JSON, with runc-style errors."""
    try:
        raw = read_regular(os.fspath(path), limit)
    except FileNotFoundError:
        raise ParacellError(f"open {path}: no such file or directory") from None
    if len(raw) > limit:
        raise ParacellError(f"{path} is larger than {limit} bytes")
    return parse_json(raw, str(path))


def load_bundle(bundle_dir: str | os.PathLike[str]) -> Bundle:
    path = Path(bundle_dir).absolute()
    if not path.is_dir():
        raise ParacellError(f"bundle {path} is not a directory")
    config = read_json_file(path / "config.json", MAX_CONFIG_BYTES)
    _expect(config, dict, "the top level")
    return validate(path, config)


def validate(path: Path, config: dict[str, Any]) -> Bundle:
    _expect(config.get("ociVersion", ""), str, "ociVersion")
    root = config.get("root")
    _expect(root, dict, "root")
    root_path = _expect(root.get("path"), str, "root.path")
    readonly = _expect(root.get("readonly", False), bool, "root.readonly")
    rootfs = check_rootfs(path, root_path)
    annotations = config.get("annotations") or {}
    _expect(annotations, dict, "annotations")
    for key, value in annotations.items():
        _expect(value, str, f"annotations[{key!r}]")
    # Optional: without it, create makes the container and start fails.
    process = config.get("process")
    bundle = Bundle(path, config, rootfs, readonly, annotations)
    if process is not None:
        _expect(process, dict, "process")
        bundle.process_records = _process_records(process, bundle.warnings)
    hostname = _expect(config.get(K.HOSTNAME, ""), str, "hostname")
    if len(hostname) > 64:
        raise _fail("hostname is longer than 64 characters")
    mounts = config.get("mounts") or []
    _expect(mounts, list, "mounts")
    if len(mounts) > lib.PC_SPEC_MAX_MOUNTS:
        raise _fail(f"more than {lib.PC_SPEC_MAX_MOUNTS} mounts")
    bundle.mounts = [_mount_record(bundle, mount, f"mounts[{i}]")
                     for i, mount in enumerate(mounts)]
    linux = config.get("linux") or {}
    _expect(linux, dict, "linux")
    bundle.namespaces = _namespaces(linux)
    bundle.linux_records = _linux_records(config, bundle.namespaces, bundle.warnings)
    bundle.warnings += guestfields.lsm_warnings(process or {}, config.get("linux") or {})
    bundle.seccomp = seccomp.compile_profile((config.get("linux") or {}).get("seccomp"))
    return bundle


def check_rootfs(bundle: Path, root_path: str) -> Path:
    """runc's check: root.path, made absolute against the bundle (runc works in
    the bundle's real directory), must have no symlink in it, so that the
    share cannot be pointed at the host's / or anywhere else by a link."""
    rootfs = Path(os.path.normpath(bundle.resolve() / root_path))
    if not rootfs.exists():
        raise ParacellError(f"rootfs ({rootfs}) does not exist")
    if os.path.realpath(rootfs) != str(rootfs):
        raise ParacellError(INVALID_ROOTFS)
    if not rootfs.is_dir():
        raise ParacellError(f"rootfs ({rootfs}) is not a directory")
    return rootfs


def check_process(process: dict[str, Any]) -> list[str]:
    """Validates an OCI process object (init's, or an exec's --process file);
    returns what runc would warn about."""
    warnings: list[str] = []
    _process_records(process, warnings)
    return warnings + guestfields.lsm_warnings(process, {})


def _user_records(user: Any) -> list[tuple[str, str]]:
    _expect(user, dict, "process.user")
    if "username" in user:
        raise _fail(f"process.user.username {user['username']!r}: unknown user (Windows only)")
    records = [
        (K.UID, str(_id_value(user.get(K.UID, 0), "process.user.uid"))),
        (K.GID, str(_id_value(user.get(K.GID, 0), "process.user.gid"))),
    ]
    gids = user.get("additionalGids") or []
    _expect(gids, list, "process.user.additionalGids")
    if len(gids) > lib.PC_SPEC_MAX_GIDS:
        raise _fail(f"process.user.additionalGids has more than {lib.PC_SPEC_MAX_GIDS} entries")
    records += [(K.GID_ADD, str(_id_value(g, "process.user.additionalGids[]"))) for g in gids]
    if "umask" in user:
        umask = _expect(user["umask"], int, "process.user.umask")
        if not 0 <= umask <= 0o777:
            raise _fail("process.user.umask must be between 0 and 0777")
        records.append((K.UMASK, f"{umask:o}"))
    return records


def _rlimit_records(rlimits: Any) -> list[tuple[str, str]]:
    _expect(rlimits, list, "process.rlimits")
    if len(rlimits) > lib.PC_SPEC_MAX_RLIMITS:
        raise _fail(f"process.rlimits has more than {lib.PC_SPEC_MAX_RLIMITS} entries")
    records = []
    for i, rl in enumerate(rlimits):
        _expect(rl, dict, f"process.rlimits[{i}]")
        kind = rl.get("type")
        if kind not in RLIMITS:
            raise _fail(f"process.rlimits[{i}].type {kind!r} is not a known rlimit")
        soft = _expect(rl.get("soft"), int, f"process.rlimits[{i}].soft")
        hard = _expect(rl.get("hard"), int, f"process.rlimits[{i}].hard")
        if not (0 <= soft <= RLIM_INFINITY and 0 <= hard <= RLIM_INFINITY) or soft > hard:
            raise _fail(f"process.rlimits[{i}]: need 0 <= soft <= hard")
        records.append((K.RLIMIT, f"{RLIMITS[kind]} {soft} {hard}"))
    return records


CAP_SETS = ("bounding", "effective", "permitted", "inheritable", "ambient")
MAX_CAPS_PER_SET = 64


def _cap_key(kind: str) -> str:
    return {"bounding": K.CAP_BOUNDING, "effective": K.CAP_EFFECTIVE,
            "permitted": K.CAP_PERMITTED, "inheritable": K.CAP_INHERITABLE,
            "ambient": K.CAP_AMBIENT}[kind]


def _cap_records(caps: Any, warnings: list[str]) -> list[tuple[str, str]]:
    """Every set, always: runc takes a set that is absent (or null) as empty,
    and containerd writes `"capabilities": {}` for a pod that drops ALL, so
    skipping absent sets would leave the process every capability. Unknown
    names are ignored with a warning, as runc 1.1 does."""
    _expect(caps, dict, "process.capabilities")
    records, unknown = [], []
    for kind in CAP_SETS:
        mask = 0
        names = caps.get(kind)
        for name in _str_list([] if names is None else names, f"process.capabilities.{kind}",
                              MAX_CAPS_PER_SET):
            number = CAPABILITIES.get(name[4:]) if name.startswith("CAP_") else None
            if number is None:
                if name not in unknown:
                    unknown.append(name)
                continue
            mask |= 1 << number
        records.append((_cap_key(kind), f"{mask:x}"))
    if unknown:
        shown = " ".join(repr(n[:64]) for n in unknown[:8])
        warnings.append(f"ignoring unknown or unavailable capabilities: [{shown}]")
    return records


def _oom_score_adj(value: Any) -> str:
    _expect(value, int, "process.oomScoreAdj")
    low, high = lib.PC_SPEC_OOM_SCORE_ADJ_MIN, lib.PC_SPEC_OOM_SCORE_ADJ_MAX
    if not low <= value <= high:
        raise _fail(f"process.oomScoreAdj {value} is out of range ({low} to {high})")
    return str(value)


def _process_records(process: dict[str, Any],
                     warnings: list[str] | None = None) -> list[tuple[str, str]]:
    args = _str_list(process.get("args"), "process.args", lib.PC_SPEC_MAX_ARGS)
    if not args or not args[0]:
        raise _fail("process.args must not be empty")
    records = [(K.ARG, a) for a in args]
    for i, item in enumerate(_str_list(process.get("env") or [], "process.env",
                                       lib.PC_SPEC_MAX_ENV)):
        if "=" not in item:
            raise _fail(f"process.env[{i}] {item!r} is not NAME=value")
        records.append((K.ENV, item))
    cwd = _expect(process.get(K.CWD, "/"), str, "process.cwd")
    if not cwd.startswith("/"):
        raise _fail(f"process.cwd {cwd!r} must be an absolute path")
    records.append((K.CWD, cwd))
    records += _user_records(process.get("user") or {})
    records += _rlimit_records(process.get("rlimits") or [])
    if _expect(process.get("noNewPrivileges", False), bool, "process.noNewPrivileges"):
        records.append((K.NNP, "1"))
    # As runc: no capabilities object (or null) is no capability at all, in
    # every set; the agent is always told all five.
    caps = process.get("capabilities")
    records += _cap_records({} if caps is None else caps, [] if warnings is None else warnings)
    if process.get("oomScoreAdj") is not None:
        records.append((K.OOM_SCORE_ADJ, _oom_score_adj(process["oomScoreAdj"])))
    records += guestfields.ioprio_record(process)
    if _expect(process.get(K.TERMINAL, False), bool, "process.terminal"):
        records.append((K.TERMINAL, "1"))
        size = process.get("consoleSize") or {}
        _expect(size, dict, "process.consoleSize")
        for key, rec in (("height", K.ROWS), ("width", K.COLS)):
            if key in size:
                value = _expect(size[key], int, f"process.consoleSize.{key}")
                records.append((rec, str(max(0, min(value, 65535)))))
    return records


def _namespaces(linux: dict[str, Any]) -> dict[str, str]:
    """linux.namespaces as type -> path ("" for a new one)."""
    entries = linux.get("namespaces") or []
    _expect(entries, list, "linux.namespaces")
    found = {}
    for i, ns in enumerate(entries):
        _expect(ns, dict, f"linux.namespaces[{i}]")
        kind = _expect(ns.get("type"), str, f"linux.namespaces[{i}].type")
        if kind in found:
            # runc's wording; a later entry silently winning hides a bad spec.
            path = ns.get("path") or ""
            # runc's wording, Go's %q of the entry: duplicated ns {"pid" ""}.
            raise ParacellError("malformed spec file: duplicated ns "
                                f"{{{json.dumps(kind[:32])} {json.dumps(str(path)[:200])}}}")
        found[kind] = _expect(ns.get("path") or "", str, f"linux.namespaces[{i}].path")
    return found


def is_host_netns(path: str) -> bool:
    """runc's test: "host" is the runtime's own network namespace."""
    try:
        given, own = os.stat(path), os.stat("/proc/self/ns/net")
    except OSError as err:
        raise ParacellError(f"invalid netns path: stat {path}: {err.strerror}") from None
    return (given.st_dev, given.st_ino) == (own.st_dev, own.st_ino)


def _check_sysctl_namespace(name: str, namespaces: dict[str, str]) -> None:
    """runc's rule, with its wording: only sysctls of a namespace the container
    has of its own. The guest writes them in the container's namespaces, so
    none reaches the host, but a spec runc refuses is refused here too."""
    if name in IPC_SYSCTLS or name.startswith("fs.mqueue."):
        if "ipc" in namespaces:
            return
        raise ParacellError(f'sysctl "{name}" is not allowed in the hosts ipc namespace')
    if name.startswith("net."):
        if "network" in namespaces and not (
                namespaces["network"] and is_host_netns(namespaces["network"])):
            return
        raise ParacellError(f'sysctl "{name}" not allowed in host network namespace')
    if "uts" in namespaces and name == "kernel.domainname":
        return
    if "uts" in namespaces and name == "kernel.hostname":
        raise ParacellError(
            f'sysctl "{name}" is not allowed as it conflicts with the OCI "hostname" field')
    raise ParacellError(f'sysctl "{name}" is not in a separate kernel namespace')


def _sysctl_records(linux: dict[str, Any], namespaces: dict[str, str]
                    ) -> list[tuple[str, str]]:
    sysctls = linux.get("sysctl") or {}
    _expect(sysctls, dict, "linux.sysctl")
    if len(sysctls) > lib.PC_SPEC_MAX_SYSCTLS:
        raise _fail(f"linux.sysctl has more than {lib.PC_SPEC_MAX_SYSCTLS} entries")
    records = []
    for key, value in sysctls.items():
        name, path = _sysctl_name_and_path(key)
        _expect(value, str, f"linux.sysctl[{key!r}]")
        if len(value.encode()) > lib.PC_SPEC_MAX_SYSCTL_VALUE:
            raise _fail(f"linux.sysctl[{key!r}] is longer than "
                        f"{lib.PC_SPEC_MAX_SYSCTL_VALUE} bytes")
        _check_sysctl_namespace(name, namespaces)
        records.append((K.SYSCTL, f"{path}={value}"))
    return records


def _sysctl_name_and_path(key: str) -> tuple[str, str]:
    """The dotted name runc's rules and messages use, and the path under
    /proc/sys. As runc does, a key whose first separator is a slash is a path
    already ("net/ipv4/conf/eth0.100/forwarding"), its dots part of names."""
    first = re.search(r"[./]", key)
    if first and first.group() == "/":
        name, path = key.translate(str.maketrans("./", "/.")), key
    else:
        name, path = key, key.replace(".", "/")
    parts = path.split("/")
    if (len(path) > lib.PC_SPEC_MAX_SYSCTL_NAME or ".." in parts or "." in parts
            or not all(SYSCTL_PART.fullmatch(p) for p in parts)):
        raise _fail(f"linux.sysctl key {key[:64]!r} is not a sysctl name")
    return name, path


def _path_records(linux: dict[str, Any], field_name: str, key: str) -> list[tuple[str, str]]:
    where = f"linux.{field_name}"
    paths = _str_list(linux.get(field_name) or [], where, lib.PC_SPEC_MAX_PATHS)
    for i, path in enumerate(paths):
        if not path.startswith("/"):
            raise _fail(f"{where}[{i}] {path[:64]!r} must be an absolute path")
        if len(path.encode()) > lib.PC_SPEC_MAX_PATH_LEN:
            raise _fail(f"{where}[{i}] is longer than {lib.PC_SPEC_MAX_PATH_LEN} bytes")
    return [(key, path) for path in paths]


def _has_dev_mount(config: dict[str, Any]) -> bool:
    return any(isinstance(m, dict) and isinstance(m.get("destination"), str)
               and posixpath.normpath(m["destination"]) == "/dev"
               for m in config.get("mounts") or [])


def _linux_records(config: dict[str, Any], namespaces: dict[str, str],
                   warnings: list[str]) -> list[tuple[str, str]]:
    """The init-only records of linux: sysctls, then read-only and masked
    paths, which the agent applies in that order, as runc does; then devices,
    the propagation of /, the user namespace and the personality."""
    linux = config.get("linux") or {}
    _expect(linux, dict, "linux")
    userns, userns_warnings = guestfields.userns_records(linux, namespaces)
    personality, personality_warnings = guestfields.personality_records(linux)
    warnings += userns_warnings + personality_warnings
    # Says that a PC_SECCOMP frame goes with this SPEC (compiled in validate).
    has_seccomp = _expect(linux.get("seccomp"), (dict, type(None)), "linux.seccomp") is not None
    return [*_sysctl_records(linux, namespaces),
            *_path_records(linux, "readonlyPaths", K.PATH_READONLY),
            *_path_records(linux, "maskedPaths", K.PATH_MASKED),
            *guestfields.device_records(linux, _has_dev_mount(config)),
            *guestfields.rootfs_propagation_records(linux),
            *userns, *personality, *([(K.SECCOMP, "1")] if has_seccomp else [])]


def _escapes_root(dest: str) -> bool:
    depth = 0
    for part in dest.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        elif part not in ("", "."):
            depth += 1
    return False


def _mount_record(bundle: Bundle, mount: Any, where: str) -> MountRecord:
    _expect(mount, dict, where)
    dest = _expect(mount.get("destination"), str, f"{where}.destination")
    if not dest.startswith("/"):
        raise _fail(f"{where}.destination {dest!r} must be an absolute path")
    if _escapes_root(dest):
        raise _fail(f"{where}.destination {dest!r} escapes the container's rootfs")
    dest = posixpath.normpath(dest)
    kind = _expect(mount.get("type", "none"), str, f"{where}.type")
    source = _expect(mount.get("source", kind), str, f"{where}.source")
    options = _str_list(mount.get("options") or [], f"{where}.options",
                        lib.PC_SPEC_MAX_MOUNT_OPTIONS)
    opts = mountopts.parse(options, where)
    mountopts.check_type(kind, opts, where)
    data = opts.data or []
    entry = None
    if kind == "bind" or opts.flags & MS_BIND:
        kind = "bind"
        source, entry = _bind_source(bundle, source, where, dest)
        opts.flags |= MS_BIND
    else:
        bundle.mount_points.append(MountPoint(dest, directory=True))
    if any("\x1f" in s or "\0" in s for s in (dest, kind, source, *data)):
        raise _fail(f"{where} contains a control character")
    # runc copies up only into a tmpfs and ignores the option elsewhere.
    copyup = opts.tmpcopyup and kind == "tmpfs"
    return MountRecord(dest, kind, source, opts.flags, ",".join(data), opts.propagation,
                       opts.attr_set, opts.attr_clr, copyup, entry)


def _bind_source(bundle: Bundle, source: str, where: str, dest: str) -> tuple[str, str | None]:
    """Guest path of a bind source inside the rootfs, or the entry of one
    outside it in the bind share. The source is a host path, resolved on the
    host with its symlinks, as runc does."""
    host = Path(source if os.path.isabs(source) else bundle.path / source)
    if not host.exists():
        raise ParacellError(f"{where}.source {source}: no such file or directory")
    real = host.resolve()
    directory = real.is_dir()
    if real == bundle.rootfs or bundle.rootfs in real.parents:
        inside = f"/{real.relative_to(bundle.rootfs)}"
        bundle.mount_points.append(MountPoint(dest, directory, posixpath.normpath(inside)))
        return f"{GUEST_ROOTFS}{inside}", None
    bundle.mount_points.append(MountPoint(dest, directory))
    bind = HostBind(real, str(len(bundle.host_binds)))
    bundle.host_binds.append(bind)
    return "", bind.entry


def prepare_rootfs(bundle: Bundle) -> None:
    """Creates the spec's missing mount points inside the rootfs, on the host,
    before it is shared (read-only, with root.readonly): see mountpoints.py."""
    create_mount_points(bundle.rootfs, bundle.mount_points)


def _encode(records: list[tuple[str, str]]) -> bytes:
    try:
        return K.encode(records)
    except K.NulInRecord as err:
        raise _fail(str(err)) from None


def init_launch_spec(container_id: str, bundle: Bundle, xgates: bool = False,
                     extra: list[tuple[str, str]] | None = None) -> bytes:
    """Records for the container's init, from the parts validate built: its
    process plus the container-wide keys. The first spec that names a
    container makes it; its process is the init. `xgates=on` switches XGates
    on for every process of the container; `extra` are a pod member's
    records (runtime/pod/pod.py)."""
    config = bundle.config
    if config.get("process") is None:
        return b""  # nothing to create in the guest until a process exists
    records = [(K.CONTAINER, container_id), (K.ROLE, "init"), *bundle.process_records]
    if config.get("hostname"):
        records.append((K.HOSTNAME, config["hostname"]))
    if bundle.rootfs_readonly:
        records.append((K.ROOT_READONLY, "1"))
    if xgates:
        records.append((K.XGATES, "on"))
    records += [m.record(bundle.bind_prefix) for m in bundle.mounts]
    records += bundle.linux_records
    records += extra or []
    return _encode(records)


def exec_launch_spec(container_id: str, process: dict[str, Any]) -> bytes:
    """Records for another process in a container that exists in the guest."""
    return _encode([(K.CONTAINER, container_id), (K.ROLE, "exec"),
                           *_process_records(process)])


def bundle_rootfs(directory: Path) -> Path | None:
    """For `paracell xgate vet`: the rootfs of an OCI bundle, or None when
    `directory` is not one (no config.json with a root object). A bundle whose
    root.path is a symlink or missing is bad input (the vet's exit status 2),
    by check_rootfs."""
    from paracell.xgate.vet import bad_input

    config_path = directory / "config.json"
    if not config_path.is_file():
        return None
    try:
        config = read_json_file(config_path, MAX_CONFIG_BYTES)
    except ParacellError as err:
        raise bad_input(str(err)) from None
    if not isinstance(config, dict) or not isinstance(config.get("root"), dict):
        return None
    root_path = config["root"].get("path")
    if not isinstance(root_path, str):
        raise bad_input(f"{config_path}: root.path must be a string")
    try:
        return check_rootfs(directory, root_path)
    except ParacellError as err:
        raise bad_input(str(err)) from None
