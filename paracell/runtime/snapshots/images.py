"""runc's `checkpoint --image-path` and `restore --image-path` on top of
ParaCell's checkpoints (docs/snapshots.md).

An image directory holds one self-contained checkpoint, flat:

  paracell-checkpoint.json  the manifest: format, the checkpoint's meta, digests
  hashes.bin, loc.bin       its page tables, hashed with the image's own seed
  pages.bin                 every page it needs, in one page file
  seed                      that seed (8 bytes)
  vmstate.qcow2             QEMU's device state, as one internal snapshot
  rootdisk.ext4             the root disk the checkpoint's files live on
  inventory.img             a placeholder that podman looks for (no CRIU here)

The directory is the caller's, and may be written by others meanwhile:
`export` creates every file relative to the directory's fd, new, never
through a link, and writes the manifest last; `restore_source` reads each
file once, never through a link, bounded by what that file can be, into a
private directory of the state root, and takes the root disk from
ParaCell's own cache by its content digest (or copies the image's into
the cache and checks it there). Nothing the image names is ever opened.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from paracell import safefs
from paracell.errors import ParacellError
from paracell.images import rootdisk
from paracell.runtime.snapshots.checkpoints import (
    HASHES,
    LOC,
    MAX_META_BYTES,
    MAX_VMSTATE_BYTES,
    META,
    PAGES,
    SEED,
    VMSTATE,
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    meta_json,
    parse_meta,
)

IMAGE_NAME = "image"
MARKER = "paracell-checkpoint.json"
# podman counts a checkpoint as complete when CRIU's inventory file exists
# in it; ParaCell uses no CRIU, and this file only says so.
INVENTORY = "inventory.img"
IMAGE_SEED, IMAGE_VMSTATE, IMAGE_ROOTDISK = "seed", "vmstate.qcow2", "rootdisk.ext4"
FORMAT = 2


def export(source: CheckpointStore, ckpt: Checkpoint, image_path: str) -> Path:
    """Flattens checkpoint ckpt of a container into the image directory,
    which must be empty (or new)."""
    from paracell._native import ffi, lib

    disk = rootdisk.find(ckpt.rootdisk_sha256)
    if disk is None:
        raise CheckpointError(f"checkpoint {ckpt.name}: its root disk is gone from the cache")
    with safefs.Dir.open(image_path, "--image-path", create=True) as image:
        if not image.is_empty():
            raise ParacellError(f"--image-path {image_path} is not empty")
        try:
            _flatten(source, ckpt, image, disk, ffi, lib)
        except BaseException:
            image.undo()
            raise
    return Path(os.path.abspath(image_path))


def _flatten(source: CheckpointStore, ckpt: Checkpoint, image: safefs.Dir, disk: Path,
             ffi: Any, lib: Any) -> None:
    seed = int.from_bytes(os.urandom(8), "little")
    hashes, loc = source.tables(ckpt)
    seqs, fds = source.page_files()
    fig = ffi.new("struct pc_ckpt_figures *")
    err = ffi.new("char[]", 256)
    # The checkpoint's RAM, put together from its chain, in memory of our own.
    ram = os.memfd_create("paracell-export", os.MFD_CLOEXEC)
    try:
        os.ftruncate(ram, ckpt.ram_bytes)
        if lib.pc_ckpt_materialize(ram, ckpt.ram_bytes, source.seed(), hashes, loc,
                                   ffi.new("uint32_t[]", seqs), ffi.new("int[]", fds),
                                   len(fds), fig, err, 256) != 0:
            raise CheckpointError(ffi.string(err).decode(errors="replace"))
        flat_hashes = ffi.new("uint64_t[]", ckpt.pages)
        flat_loc = ffi.new("struct pc_ckpt_loc[]", ckpt.pages)
        pages = image.create(PAGES)
        try:
            if lib.pc_ckpt_capture(ram, ffi.NULL, ckpt.ram_bytes, seed, ffi.NULL, ffi.NULL,
                                   ffi.NULL, ckpt.seq, flat_hashes, flat_loc, pages, fig, err,
                                   256) != 0:
                raise CheckpointError(ffi.string(err).decode(errors="replace"))
        finally:
            os.close(pages)
    finally:
        os.close(ram)
        for fd in fds:
            os.close(fd)
    tables = {HASHES: bytes(ffi.buffer(flat_hashes)), LOC: bytes(ffi.buffer(flat_loc))}
    for name, data in tables.items():
        image.write_new(name, data)
    image.write_new(IMAGE_SEED, seed.to_bytes(8, "little"))
    state = image.create(IMAGE_VMSTATE)
    try:
        vmstate_sha256 = source.copy_vmstate(state)
    finally:
        os.close(state)
    disk_fd = os.open(disk, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    target = image.create(IMAGE_ROOTDISK)
    try:
        safefs.sparse_copy(disk_fd, target)
    finally:
        os.close(target)
        os.close(disk_fd)
    flat = Checkpoint(name=IMAGE_NAME, seq=ckpt.seq, parent=0, created=ckpt.created,
                      key=ckpt.key, ram_bytes=ckpt.ram_bytes, pages_saved=int(fig.changed),
                      vmstate_tag=ckpt.vmstate_tag,
                      sha256={f: hashlib.sha256(d).hexdigest() for f, d in tables.items()},
                      rootdisk_sha256=ckpt.rootdisk_sha256)
    # Last: an image without its manifest is no image.
    image.write_new(MARKER, json.dumps({
        "format": FORMAT, "checkpoint": json.loads(meta_json(flat)),
        "vmstate_sha256": vmstate_sha256}).encode())
    image.write_new(INVENTORY, f"not a CRIU image: a ParaCell VM checkpoint (see {MARKER})\n"
                    .encode())


def _manifest(image: safefs.Dir, image_path: str) -> tuple[Checkpoint, str]:
    """The image's checkpoint and the SHA-256 of its device states."""
    if MARKER not in image.names():
        raise ParacellError(f"--image-path {image_path} holds no ParaCell checkpoint")
    raw = image.read(MARKER, MAX_META_BYTES)
    try:
        manifest: Any = json.loads(raw)
    except (ValueError, RecursionError):
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT \
            or not isinstance(manifest.get("checkpoint"), dict) \
            or not isinstance(manifest.get("vmstate_sha256"), str):
        raise ParacellError(f"--image-path {image_path}: {MARKER} is not a format-{FORMAT} "
                            "ParaCell checkpoint")
    meta = json.dumps(manifest["checkpoint"]).encode()
    ckpt = parse_meta(meta, IMAGE_NAME)
    return ckpt, manifest["vmstate_sha256"]


def restore_source(image_path: str, staging: Path) -> tuple[CheckpointStore, Path]:
    """The image's checkpoint copied into staging (a private directory, made
    here) as a checkpoint store of its own, and the cached root disk it runs
    on. Every file is checked for what it can be before it is copied."""
    with safefs.Dir.open(image_path, "--image-path") as image:
        ckpt, vmstate_sha256 = _manifest(image, image_path)
        store = CheckpointStore(staging)
        staging.mkdir(mode=0o700)
        store.ensure()
        where = store.dir / IMAGE_NAME
        where.mkdir(mode=0o700)
        (where / META).write_bytes(meta_json(ckpt))
        exact = {HASHES: ckpt.pages * 8, LOC: ckpt.pages * 8, PAGES: ckpt.pages_saved * 4096}
        copies = [(name, where / name, size, size) for name, size in exact.items()]
        copies += [(IMAGE_SEED, store.dir / SEED, 8, 8),
                   (IMAGE_VMSTATE, store.dir / VMSTATE, MAX_VMSTATE_BYTES, None)]
        for name, target, limit, size in copies:
            _copy_in(image, name, target, limit, size)
        if store.vmstate_digest() != vmstate_sha256:
            raise CheckpointError(f"--image-path {image_path}: {IMAGE_VMSTATE} does not match "
                                  "its digest (damaged or tampered with)")
        disk = rootdisk.find(ckpt.rootdisk_sha256)
        if disk is None:
            if IMAGE_ROOTDISK not in image.names():
                raise CheckpointError("the checkpoint's root disk is not in this host's cache, "
                                      "and the image carries none")
            fd = image.open_regular(IMAGE_ROOTDISK, rootdisk.MAX_BYTES)
            try:
                disk = rootdisk.import_disk(fd, ckpt.rootdisk_sha256)
            finally:
                os.close(fd)
    return store, disk


def _copy_in(image: safefs.Dir, name: str, target: Path, limit: int, size: int | None) -> None:
    source = image.open_regular(name, limit, exact=size)
    try:
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                      | os.O_CLOEXEC, 0o600)
        try:
            # Bounded again: the file may grow after it was checked.
            safefs.sparse_copy(source, out, min(os.fstat(source).st_size, limit))
        finally:
            os.close(out)
    finally:
        os.close(source)


def discard(staging: Path) -> None:
    shutil.rmtree(staging, ignore_errors=True)


def write_log(work_path: str, name: str, text: str) -> None:
    """runc's --work-path log: replaced by a rename, never written through a link."""
    with safefs.Dir.open(work_path, "--work-path", create=True) as work:
        work.replace(name, text.encode())
