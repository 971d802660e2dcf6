"""runc's `checkpoint --image-path` and `restore --image-path` on top of
ParaCell's checkpoints (docs/snapshots.md).

An image directory is a checkpoint store of its own, holding one
self-contained checkpoint: the container's checkpoint is taken as usual,
then flattened into the image (every page it needs in one page file, with
the image's own seed, and the device states' qcow2). `restore` makes a new
container that goes on from it, as a fork does from a parent's checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

from paracell.errors import ParacellError
from paracell.sandbox.checkpoints import (
    HASHES,
    LOC,
    META,
    PAGES,
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    digest,
)

IMAGE_NAME = "image"
MARKER = "paracell-checkpoint.json"
# podman counts a checkpoint as complete when CRIU's inventory file exists
# in it; ParaCell uses no CRIU, and this file only says so.
INVENTORY = "inventory.img"
FORMAT = 1


def directory(path: str, what: str, create: bool) -> Path:
    """A real directory, never through a link at its last component."""
    where = Path(os.path.abspath(path))
    if create:
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        st = os.lstat(where)
    except FileNotFoundError:
        raise ParacellError(f"{what} {path}: no such directory") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ParacellError(f"{what} {path} is not a directory (a link is not followed)")
    return where


def export(source: CheckpointStore, ckpt: Checkpoint, image_path: str) -> Path:
    """Flattens checkpoint ckpt of a container into the image directory."""
    from paracell._native import ffi, lib

    image = directory(image_path, "--image-path", create=True)
    if any(os.scandir(image)):
        raise ParacellError(f"--image-path {image_path} is not empty")
    target = CheckpointStore(image)
    target.ensure()
    seed = target.seed()
    hashes, loc = source.tables(ckpt)
    seqs, fds = source.page_files()
    staging = target.staging()
    ram_copy = staging / "ram"
    fig = ffi.new("struct pc_ckpt_figures *")
    err = ffi.new("char[]", 256)
    try:
        out = os.open(ram_copy, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            if lib.pc_ckpt_materialize(out, ckpt.ram_bytes, source.seed(), hashes, loc,
                                       ffi.new("uint32_t[]", seqs), ffi.new("int[]", fds),
                                       len(fds), fig, err, 256) != 0:
                raise CheckpointError(ffi.string(err).decode(errors="replace"))
            flat_hashes = ffi.new("uint64_t[]", ckpt.pages)
            flat_loc = ffi.new("struct pc_ckpt_loc[]", ckpt.pages)
            pages = os.open(staging / PAGES, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                            0o600)
            try:
                if lib.pc_ckpt_capture(out, ckpt.ram_bytes, seed, ffi.NULL, ffi.NULL, ckpt.seq,
                                       flat_hashes, flat_loc, pages, fig, err, 256) != 0:
                    raise CheckpointError(ffi.string(err).decode(errors="replace"))
            finally:
                os.close(pages)
        finally:
            os.close(out)
            ram_copy.unlink(missing_ok=True)
        for file, data in ((HASHES, flat_hashes), (LOC, flat_loc)):
            (staging / file).write_bytes(ffi.buffer(data))
        flat = Checkpoint(name=IMAGE_NAME, seq=ckpt.seq, parent=0, created=ckpt.created,
                          key=ckpt.key, ram_bytes=ckpt.ram_bytes, pages_saved=int(fig.changed),
                          vmstate_tag=ckpt.vmstate_tag,
                          sha256={f: digest(staging / f) for f in (HASHES, LOC)},
                          rootdisk=ckpt.rootdisk)
        shutil.copyfile(source.vmstate, target.vmstate)
        target.commit(staging, flat)
    except BaseException:
        target.discard(staging)
        raise
    finally:
        for fd in fds:
            os.close(fd)
    (image / MARKER).write_text(json.dumps({"format": FORMAT, "checkpoint": IMAGE_NAME}))
    (image / INVENTORY).write_text("not a CRIU image: a ParaCell VM checkpoint "
                                   f"(see {MARKER})\n")
    return image


def image_store(image_path: str) -> CheckpointStore:
    """The store of an image directory, checked to be one."""
    image = directory(image_path, "--image-path", create=False)
    marker = image / MARKER
    try:
        st = os.lstat(marker)
    except FileNotFoundError:
        raise ParacellError(f"--image-path {image_path} holds no ParaCell checkpoint") from None
    if not stat.S_ISREG(st.st_mode) or st.st_size > 4096:
        raise ParacellError(f"--image-path {image_path}: {MARKER} is not a small regular file")
    try:
        meta: Any = json.loads(marker.read_text())
    except ValueError:
        meta = None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT \
            or meta.get("checkpoint") != IMAGE_NAME:
        raise ParacellError(f"--image-path {image_path}: {MARKER} is not format {FORMAT}")
    store = CheckpointStore(image)
    if not (store.dir / IMAGE_NAME / META).is_file():
        raise ParacellError(f"--image-path {image_path}: its checkpoint is missing")
    return store
