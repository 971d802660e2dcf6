"""`paracell demo`: the example container in a micro-VM, with its memory figures."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path

from paracell.guest.artifacts import REPO_ROOT
from paracell.runtime.bundle import defaultspec
from paracell.runtime.context import Context
from paracell.runtime.verbs import lifecycle

EXAMPLE = REPO_ROOT / "oci" / "examples" / "hello"


class MemorySampler(threading.Thread):
    """Peak host memory of the VM while it runs: QEMU's RSS, and how much of the
    guest-RAM file is really backed by host pages."""

    def __init__(self, qemu_pid: int, memory_file: Path, memory_bytes: int,
                 state_dir: Path) -> None:
        super().__init__(daemon=True)
        self.qemu_pid, self.memory_file, self.state_dir = qemu_pid, memory_file, state_dir
        self.memory_bytes = memory_bytes
        self.peak_rss = self.peak_backed = self.last_backed = 0
        self.pager: dict | None = None
        self.done = threading.Event()

    def run(self) -> None:
        import psutil

        from paracell.pager import telemetry
        from paracell.vmm import ramview

        try:
            proc = psutil.Process(self.qemu_pid)
        except psutil.Error:
            return
        while not self.done.is_set():
            try:
                self.peak_rss = max(self.peak_rss, proc.memory_info().rss)
            except psutil.Error:
                return
            ram = ramview.view(self.memory_file, self.memory_bytes, self.qemu_pid)
            backed = ram.resident if ram else 0
            if backed:
                self.last_backed = backed
            self.peak_backed = max(self.peak_backed, backed)
            # The Pager's files go with the VM: keep the last figures seen.
            self.pager = telemetry.read(self.state_dir, ram.read if ram else None) or self.pager
            time.sleep(0.02)


def _run_once(ctx: Context, manager: str) -> dict[str, float | int | None]:
    """The example under one memory manager; the figures the host saw."""
    run_ctx = dataclasses.replace(ctx, memory_manager=manager)
    container_id = f"paracell-demo-{os.getpid()}-{manager}"
    began = time.monotonic()
    state = lifecycle.create(run_ctx, container_id, str(EXAMPLE), None, None, detach=False)
    sampler = MemorySampler(state.vm.qemu_pid, Path(state.vm.config.ram_file),
                            state.vm.config.memory_mib << 20,
                            ctx.store.dir(container_id))
    sampler.start()
    try:
        lifecycle.start(run_ctx, container_id)
        status = lifecycle.wait_child(state.shim_pid)
    finally:
        sampler.done.set()
        sampler.join()
        lifecycle.delete(run_ctx, container_id, force=True)
    pager = sampler.pager
    return {"status": status, "elapsed": time.monotonic() - began, "peak": sampler.peak_backed,
            "last": sampler.last_backed, "rss": sampler.peak_rss,
            "unbound": pager["host"]["unbind_pages"] * 4096 if pager else None,
            "reclaim_ms": pager["host"]["last_reclaim_ms"] if pager else None}


def run_demo(ctx: Context) -> int:
    from paracell import settings

    defaultspec.busybox_rootfs(EXAMPLE / "rootfs")
    # The example's own output comes first, from the Pager run: the default.
    runs = {"pager": _run_once(ctx, "pager"), "none": _run_once(ctx, "none")}
    mib = 1 << 20

    def row(label: str, key: str, fmt: str) -> str:
        cells = [format(r[key] / mib if fmt.endswith("MiB") else r[key], fmt.split()[0])
                 if r[key] is not None else "-" for r in runs.values()]
        unit = fmt.split()[1] if " " in fmt else ""
        return f"{label:<28}" + "".join(f"{c + ' ' + unit:>16}" for c in cells)

    print("--- paracell demo ---")
    print(f"guest RAM (configured):     {settings.guest_memory_mib()} MiB")
    print(f"{'':<28}{'Pager':>16}{'none (RunV)':>16}")
    print(row("exit status", "status", "d"))
    print(row("create to exit", "elapsed", ".2f s"))
    print(row("guest RAM backed, peak", "peak", ".1f MiB"))
    print(row("guest RAM backed, at exit", "last", ".1f MiB"))
    print(row("QEMU resident set, peak", "rss", ".1f MiB"))
    print(row("free memory reported", "unbound", ".1f MiB"))
    print(row("last reclaim", "reclaim_ms", ".2f ms"))
    return int(runs["pager"]["status"] or runs["none"]["status"])
