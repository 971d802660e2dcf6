"""Where the host's cgroup hierarchies are and where a container's cgroup goes.

cgroupsPath follows runc's fs driver: an absolute path is taken from the root
of each hierarchy, a relative one from this process's own cgroup in it, and
an unset one is the container's ID, relative. The path is cleaned the way
runc's CleanPath does it, so "../../x" stays below that root and never
escapes it.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass

from paracell.errors import ParacellError

CGROUP_ROOT = "/sys/fs/cgroup"
MAX_PATH = 4096
# v1 controllers the runtime writes; named hierarchies (name=systemd) are left alone.
V1_CONTROLLERS = frozenset({"cpu", "cpuacct", "cpuset", "memory", "devices", "freezer",
                            "blkio", "pids", "hugetlb", "net_cls", "net_prio", "perf_event"})


@dataclass(frozen=True)
class Hierarchy:
    mount: str
    version: int  # 1 or 2
    controllers: frozenset[str]  # v1: bound controllers; v2: those cgroup.controllers lists
    own: str  # this process's cgroup in it, relative to the mount's root


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as \\ooo."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit() and len(field[i + 1:i + 4]) == 3:
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _own_paths(text: str) -> dict[str, str]:
    """/proc/self/cgroup: controller (or "" for v2) -> path."""
    own: dict[str, str] = {}
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            own[name] = path
    return own


def parse(mountinfo: str, self_cgroup: str, v2_controllers: dict[str, str] | None = None
          ) -> list[Hierarchy]:
    """The cgroup mounts of a mountinfo text, first mount of each hierarchy only."""
    own = _own_paths(self_cgroup)
    found: list[Hierarchy] = []
    seen: set[frozenset[str] | str] = set()
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        root, mount = _unescape(fields[3]), _unescape(fields[4])
        if tail[0] == "cgroup2":
            if "v2" in seen:
                continue
            seen.add("v2")
            controllers = frozenset((v2_controllers or {}).get(mount, "").split())
            path = own.get("", "/")
            version = 2
        else:
            controllers = frozenset(tail[2].split(",")) & V1_CONTROLLERS
            if not controllers or controllers in seen:
                continue
            seen.add(controllers)
            path = own.get(sorted(controllers)[0], "/")
            version = 1
        # A mount of a subtree (inside a container) shows paths from its root.
        if root != "/" and (path == root or path.startswith(root + "/")):
            path = path[len(root):] or "/"
        found.append(Hierarchy(mount, version, controllers, path))
    return found


def discover() -> list[Hierarchy]:
    with open("/proc/self/mountinfo") as f:
        mountinfo = f.read()
    with open("/proc/self/cgroup") as f:
        self_cgroup = f.read()
    v2: dict[str, str] = {}
    for h in parse(mountinfo, self_cgroup):
        if h.version == 2:
            try:
                with open(os.path.join(h.mount, "cgroup.controllers")) as f:
                    v2[h.mount] = f.read()
            except OSError:
                v2[h.mount] = ""
    return parse(mountinfo, self_cgroup, v2)


def clean_path(path: str) -> str:
    """runc's CleanPath: a relative path is cleaned as if it hung from "/", so
    no number of ".." takes it above its starting point."""
    if not path:
        return ""
    path = posixpath.normpath(path)
    if not path.startswith("/"):
        path = posixpath.relpath(posixpath.normpath("/" + path), "/")
    cleaned = posixpath.normpath(path)
    # normpath keeps a leading "//"; one slash is the same path.
    return "/" + cleaned.lstrip("/") if cleaned.startswith("/") else cleaned


def check_cgroups_path(value: object) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ParacellError("invalid config.json: linux.cgroupsPath must be of type str")
    if len(value) > MAX_PATH or "\0" in value:
        raise ParacellError("invalid config.json: linux.cgroupsPath is not a usable path")
    if any(ord(c) < 0x20 or c == "\x7f" for c in value):
        # Quoted, so that the error stays one line.
        raise ParacellError(f"invalid config.json: linux.cgroupsPath {value[:128]!r} contains "
                            "a control character")
    return value


def directory(h: Hierarchy, cgroups_path: str, container_id: str) -> str:
    """The container's cgroup directory in one hierarchy."""
    inner = clean_path(cgroups_path) if cgroups_path else container_id
    if inner.startswith("/"):
        target = posixpath.join(h.mount, inner.lstrip("/"))
    else:
        target = posixpath.join(h.mount, h.own.lstrip("/"), inner)
    target = posixpath.normpath(target)
    own = posixpath.normpath(posixpath.join(h.mount, h.own.lstrip("/")))
    # Belt and braces: whatever the path said, the cgroup is below the mount.
    if target == h.mount or not target.startswith(h.mount.rstrip("/") + "/"):
        raise ParacellError(f"cgroupsPath {cgroups_path!r} names the root of {h.mount}, "
                            "which a container cannot own")
    if target == own or own.startswith(target + "/"):
        raise ParacellError(f"cgroupsPath {cgroups_path!r} names the runtime's own cgroup "
                            f"{target} or one above it, which a container cannot own")
    return target


def systemd_path(value: str) -> str:
    """"slice:prefix:name" as systemd lays it out: a-b.slice nests under
    a.slice, and the unit is prefix-name.scope."""
    parts = value.split(":")
    if len(parts) != 3:
        raise ParacellError(f"expected cgroupsPath to be of format \"slice:prefix:name\" "
                            f"for systemd cgroups, got {value!r} instead")
    slice_name, prefix, name = parts
    slice_name = slice_name or "system.slice"
    if not slice_name.endswith(".slice") or "/" in slice_name or "/" in prefix + name \
            or not name:
        raise ParacellError(f"invalid systemd cgroupsPath {value!r}")
    path = ""
    if slice_name != "-.slice":
        stem = slice_name[:-len(".slice")]
        if not stem or stem.startswith("-") or stem.endswith("-") or "--" in stem:
            raise ParacellError(f"invalid slice name {slice_name!r}")
        words = stem.split("-")
        for i in range(len(words)):
            path += "/" + "-".join(words[:i + 1]) + ".slice"
    unit = name if name.endswith(".slice") else f"{prefix}-{name}.scope" if prefix else \
        f"{name}.scope"
    return f"{path}/{unit}"


def systemd_running() -> bool:
    """sd_booted()'s test."""
    return os.path.isdir("/run/systemd/system")
