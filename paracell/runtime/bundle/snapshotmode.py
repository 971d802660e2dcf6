"""Snapshot mode (`io.paracell.snapshot: "on"`, docs/snapshots.md): the
container's whole state lives in what a VM snapshot captures.

Its rootfs is a read-only ext4 image of the bundle's rootfs with a writable
layer in guest RAM (paracell/images/rootdisk.py), not a 9p share, so the
bundle's rootfs on the host no longer sees the container's writes. A bind
mount from the host cannot be snapshotted and is refused at create, except
the three files that the CRI and podman bind in, which are copied in.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from paracell.errors import ParacellError
from paracell.runtime.bundle.spec import Bundle

ANNOTATION = "io.paracell.snapshot"
SWITCH = {"on": True, "off": False}
COPIED_IN = ("/etc/hosts", "/etc/resolv.conf", "/etc/hostname", "/run/.containerenv")
# podman binds a tmpfs of its own on /dev/shm: in the guest it is a tmpfs of
# the VM's, which a snapshot holds (the host's would not be shared anyway).
GUEST_TMPFS = ("/dev/shm",)
SHM_OPTIONS = "mode=1777,size=65536k"


@dataclass(frozen=True)
class SnapshotPlan:
    enabled: bool = False
    host_files: tuple[tuple[str, bytes], ...] = ()  # (bind slot, content)


def wanted(annotations: dict[str, str]) -> bool:
    value = annotations.get(ANNOTATION)
    if value is None:
        return False
    if value not in SWITCH:
        raise ParacellError(f"invalid annotation {ANNOTATION}={value[:32]!r}: expected on or off")
    return SWITCH[value]


def _read_small(path: str, dest: str) -> bytes:
    from paracell._native import lib

    limit = lib.PC_SANDBOX_HOSTFILE_MAX
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as err:
        raise ParacellError(f"snapshot mode: {path} (bound on {dest}): {err.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ParacellError(f"snapshot mode: {path} (bound on {dest}) is not a regular file")
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ParacellError(f"snapshot mode: {path} (bound on {dest}) is larger than the "
                            f"{limit} bytes a copied-in file may have")
    return data


def _guest_tmpfs_for_shm(bundle: Bundle, by_entry: dict[str | None, str]) -> None:
    """A host bind on /dev/shm becomes a tmpfs in the guest."""
    from dataclasses import replace

    from paracell.linux import MS_NODEV, MS_NOEXEC, MS_NOSUID

    moved = {entry for entry, dest in by_entry.items() if dest in GUEST_TMPFS}
    if not moved:
        return
    bundle.mounts = [replace(m, kind="tmpfs", source="shm", flags=MS_NOSUID | MS_NODEV | MS_NOEXEC,
                             data=SHM_OPTIONS, host_entry=None, copyup=False)
                     if m.host_entry in moved else m for m in bundle.mounts]
    bundle.host_binds = [b for b in bundle.host_binds if b.entry not in moved]
    for entry in moved:
        by_entry.pop(entry, None)


def plan(bundle: Bundle, pod: bool) -> SnapshotPlan:
    """Refuses what a snapshot cannot hold, in one line; reads the files it copies in."""
    if not wanted(bundle.annotations):
        return SnapshotPlan()
    if pod:
        raise ParacellError("snapshot mode is for a container in a VM of its own, not a pod's")
    by_entry = {m.host_entry: m.dest for m in bundle.mounts if m.host_entry is not None}
    _guest_tmpfs_for_shm(bundle, by_entry)
    files = []
    for bind in bundle.host_binds:
        dest = by_entry.get(bind.entry, "?")
        if dest not in COPIED_IN:
            raise ParacellError(
                f"snapshot mode: the bind mount of {bind.source} on {dest} cannot be "
                f"snapshotted (only {', '.join(COPIED_IN)} are copied in)")
        # Resolved on the host, as runc resolves a bind's source.
        files.append((bind.slot, _read_small(str(bind.source), dest)))
    _copies_at_their_slots(bundle)
    return SnapshotPlan(True, tuple(files))


def _copies_at_their_slots(bundle: Bundle) -> None:
    """A copy lies at its slot itself in the guest (HostFiles writes the file
    SLOT), not at a name in it as a shared source does."""
    from dataclasses import replace

    slots = {b.entry: b.slot for b in bundle.host_binds}
    bundle.mounts = [replace(m, host_entry=slots[m.host_entry]) if m.host_entry in slots else m
                     for m in bundle.mounts]
