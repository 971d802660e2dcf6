"""What the pool runs in its VMs: their bundles, and the two programs in them.

A pooled VM is a pod VM whose sandbox process is `pause` (as a Kubernetes
pod's is): the agent powers a VM off once every container in it has ended
(guest/agent/agent.c), and the sandbox's never ends, so a VM waits for as
long as the pool holds it. Its container joins it as a pod member, in PID,
IPC, UTS and mount namespaces of its own, and never sees it.

Before a VM waits, the pool runs one throwaway member in it, `true`, and
deletes it: the warm-up. A VM restored from a template has translated none
of its guest's code yet (TCG), so the first container created in it pays
for the agent's create path and the kernel's clone, mount, pivot_root,
execve and exit paths: measured, a pod VM's first member took 0.30-0.39 s
from create to delete and the next ones 0.20-0.24 s. No process, file or
mount of the warm-up is left in the VM, and no container ever ran in it
before.

Both programs are static x86-64 executables of a few instructions, written
here, so the pool needs no image.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from paracell.errors import ParacellError
from paracell.runtime.context import Context

# xor edi, edi; mov eax, 60 (SYS_exit); syscall
TRUE = ("true", b"\x31\xff\xb8\x3c\x00\x00\x00\x0f\x05")
# mov eax, 34 (SYS_pause); syscall; jmp back to the mov
PAUSE = ("pause", b"\xb8\x22\x00\x00\x00\x0f\x05\xeb\xf7")
_BASE = 0x400000
_EHDR, _PHDR = 64, 56


def static_program(code: bytes) -> bytes:
    """An ELF executable of one read-and-execute segment that runs `code`:
    no libc and no interpreter."""
    size = _EHDR + _PHDR + len(code)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)  # 64-bit, little-endian, SysV
    header = struct.pack("<16sHHIQQQIHHHHHH", ident, 2, 0x3E, 1, _BASE + _EHDR + _PHDR,
                         _EHDR, 0, 0, _EHDR, _PHDR, 1, 0, 0, 0)
    segment = struct.pack("<IIQQQQQQ", 1, 5, 0, _BASE, _BASE, size, size, 0x1000)
    return header + segment + code


def _write(path: Path, data: bytes, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    os.replace(tmp, path)


def _config(rootfs: Path, program: str, annotations: dict[str, str],
            namespaces: tuple[str, ...] = ()) -> bytes:
    from paracell.runtime.bundle import defaultspec

    config = defaultspec.default_config([f"/{program}"])
    config["root"] = {"path": str(rootfs), "readonly": True}
    config["annotations"] = annotations
    for kind in namespaces:
        if {"type": kind} not in config["linux"]["namespaces"]:
            config["linux"]["namespaces"].append({"type": kind})
    return json.dumps(config).encode() + b"\n"


VM_BUNDLE_PREFIX = "bundle-"


def vm_bundle(pool_dir: Path, memory_mib: int) -> Path:
    return pool_dir / f"{VM_BUNDLE_PREFIX}{memory_mib}"


def vm_bundles(pool_dir: Path) -> list[Path]:
    """The VM bundles' directories in pool_dir, one per size: directories
    only, never a link to elsewhere."""
    try:
        names = os.listdir(pool_dir)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        size = name.removeprefix(VM_BUNDLE_PREFIX)
        path = pool_dir / name
        if size != name and size.isdigit() and path.is_dir() and not path.is_symlink():
            found.append(path)
    return found


def write_vm_bundle(pool_dir: Path, memory_mib: int) -> Path:
    """A pooled VM's bundle (a pod sandbox running pause, of memory_mib),
    and the rootfs it shares with the warm-up and the other sizes."""
    from paracell.runtime.bundle.podrole import CONTAINER_TYPE, SANDBOX_MEMORY

    rootfs = pool_dir / "rootfs"
    rootfs.mkdir(mode=0o755, exist_ok=True)
    for name, code in (TRUE, PAUSE):
        _write(rootfs / name, static_program(code), 0o755)
    bundle = vm_bundle(pool_dir, memory_mib)
    bundle.mkdir(mode=0o755, exist_ok=True)
    _write(bundle / "config.json", _config(
        rootfs, PAUSE[0], {CONTAINER_TYPE: "sandbox",
                           SANDBOX_MEMORY: str(memory_mib << 20)},
        ("network",)))
    return bundle


def warm_up_id(vm_id: str) -> str:
    return f"{vm_id}-warm-up"


def warm_up(ctx: Context, pool_dir: Path, vm_id: str) -> None:
    """Runs the warm-up in the pooled VM to its end, and deletes it."""
    from paracell.runtime.bundle.podrole import CONTAINER_TYPE, SANDBOX_ID
    from paracell.runtime.verbs import lifecycle

    bundle = pool_dir / "warm-up"
    bundle.mkdir(mode=0o755, exist_ok=True)
    _write(bundle / "config.json", _config(pool_dir / "rootfs", TRUE[0],
                                           {CONTAINER_TYPE: "container", SANDBOX_ID: vm_id}))
    status = lifecycle.run(ctx, warm_up_id(vm_id), str(bundle), None, None,
                           detach=False, keep=False, pool_vm=True)
    if status != 0:
        raise ParacellError(f"the warm-up exited with {status}")
