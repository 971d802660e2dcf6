"""`paracell demo`: the example container in a micro-VM, with its memory figures."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from paracell.guest.artifacts import REPO_ROOT
from paracell.runtime import defaultspec, lifecycle
from paracell.runtime.lifecycle import Context
from paracell.vmm.devices import GuestRam

EXAMPLE = REPO_ROOT / "oci" / "examples" / "hello"


class MemorySampler(threading.Thread):
    """Peak host memory of the VM while it runs: QEMU's RSS, and how much of the
    guest-RAM file is really backed by host pages."""

    def __init__(self, qemu_pid: int, memory_file: Path) -> None:
        super().__init__(daemon=True)
        self.qemu_pid, self.memory_file = qemu_pid, memory_file
        self.peak_rss = self.peak_backed = 0
        self.done = threading.Event()

    def run(self) -> None:
        import psutil

        from paracell.vmm import memory

        try:
            proc = psutil.Process(self.qemu_pid)
        except psutil.Error:
            return
        while not self.done.is_set():
            try:
                self.peak_rss = max(self.peak_rss, proc.memory_info().rss)
            except psutil.Error:
                return
            self.peak_backed = max(self.peak_backed, memory.resident_bytes(self.memory_file))
            time.sleep(0.02)


def run_demo(ctx: Context) -> int:
    from paracell import settings

    defaultspec.busybox_rootfs(EXAMPLE / "rootfs")
    container_id = f"paracell-demo-{os.getpid()}"
    began = time.monotonic()
    state = lifecycle.create(ctx, container_id, str(EXAMPLE), None, None, detach=False)
    ram = state.vm.device(GuestRam.kind)
    sampler = MemorySampler(state.vm.qemu_pid, Path(ram["path"]))
    sampler.start()
    try:
        lifecycle.start(ctx, container_id)
        status = lifecycle.wait_child(state.shim_pid)
    finally:
        sampler.done.set()
        lifecycle.delete(ctx, container_id, force=True)
    elapsed = time.monotonic() - began
    mib = 1 << 20
    print("--- paracell demo ---")
    print(f"exit status:              {status}")
    print(f"create to exit:           {elapsed:.2f} s")
    print(f"guest RAM (configured):   {settings.guest_memory_mib()} MiB")
    print(f"guest RAM backed on host: {sampler.peak_backed / mib:.1f} MiB (peak)")
    print(f"QEMU resident set:        {sampler.peak_rss / mib:.1f} MiB (peak)")
    return status
