"""`paracell events`: runc's stats events, with memory figures the host really
holds for the guest, plus a `paracell` section for the memory manager."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from paracell.errors import ParacellError
from paracell.procfs import same_process
from paracell.runtime.context import Context
from paracell.runtime.state import status
from paracell.runtime.state.store import ContainerState

PAGE = 4096


def _qemu_figures(state: ContainerState) -> dict[str, int]:
    import psutil

    vm = state.vm
    if vm is None or not vm.qemu_pid or not same_process(vm.qemu_pid, vm.qemu_start):
        return {}
    try:
        proc = psutil.Process(vm.qemu_pid)
        with proc.oneshot():
            cpu, mem = proc.cpu_times(), proc.memory_info()
    except psutil.Error:
        return {}
    return {"user_ns": int(cpu.user * 1e9), "kernel_ns": int(cpu.system * 1e9), "rss": mem.rss}


def _member_figures(state: ContainerState, sandbox_socket: Path) -> dict[str, Any]:
    """A pod member's own figures: its cgroup in the pod's VM, which holds its
    init and its execs (STATS, docs/agent-protocol.md), in runc's format on
    cgroup v2. The pod's VM, QEMU and the shims are the sandbox's figures."""
    from paracell._native import lib
    from paracell.runtime.agent import channel
    from paracell.runtime.host.cgroups.stats import UNLIMITED

    fig = channel.container_stats(sandbox_socket, state.id)
    memory_stat = channel.stat_names()[lib.PC_STAT_ANON:lib.PC_STAT_PGMAJFAULT + 1]
    return {
        "cpu": {"usage": {"total": fig["usage_usec"] * 1000, "user": fig["user_usec"] * 1000,
                          "kernel": fig["system_usec"] * 1000}},
        "memory": {"cache": fig["file"],
                   "usage": {"usage": fig["memory_current"],
                             "limit": fig["memory_max"] or UNLIMITED},
                   "raw": {name: fig[name] for name in memory_stat}},
        "pids": {"current": fig["pids_current"], "limit": fig["pids_max"] or UNLIMITED},
        "paracell": {"figures": "the container's own cgroup in its pod's VM",
                     "memory_events": {"oom": fig["oom"], "oom_kill": fig["oom_kill"]}},
    }


def figures_cgroup_version(state: ContainerState) -> int:
    """The cgroup version of stats()'s memory figures: a pod member's come
    from the guest's cgroup v2, a VM's from its host cgroup."""
    from paracell.runtime.host import cgroups
    from paracell.runtime.pod import pod

    if pod.vm_owner(state):
        return 2
    dirs = cgroups.from_facts(state.vm.host.cgroups) if state.vm else []
    return next((d.version for d in dirs if "memory" in d.controllers), 2)


def stats(ctx: Context, container_id: str) -> dict[str, Any]:
    from paracell.pager import telemetry
    from paracell.runtime.pod import pod
    from paracell.vmm import ramview

    state = ctx.store.load(container_id)
    if not status.stands_for_a_process(state.status):
        raise ParacellError(f"container {container_id} is not running")
    sandbox_socket = pod.sandbox_socket(ctx.store, state)
    if sandbox_socket is not None:
        return {"type": "stats", "id": container_id,
                "data": _member_figures(state, sandbox_socket)}
    qemu = _qemu_figures(state)
    ram = ramview.view(Path(state.vm.config.ram_file), state.vm.config.memory_mib << 20,
                       state.vm.qemu_pid if qemu else None)
    resident, limit = (ram.resident, ram.size) if ram else (0, 0)
    pager = telemetry.read(ctx.store.dir(container_id), ram.read if ram else None)
    guest = pager["guest"] if pager else {}
    # The guest's own figures: clamped, since a hostile guest may write anything.
    used = max(guest["total_pages"] - guest["free_pages"], 0) * PAGE if guest else None
    paracell: dict[str, Any] = {
        "memory_manager": state.vm.config.memory_manager,
        "guest_ram_bytes": limit,
        "host_resident_bytes": resident,
        "guest_used_bytes": used,
        # Bound guest RAM is by definition what the host holds; named as the
        # Pager's docs name it, next to unbound.
        "bound_bytes": resident,
        "unbound_bytes": max(limit - resident, 0),
        "qemu_rss_bytes": qemu.get("rss"),
        # Copy-on-write from a template: resident counts the VM's own pages only.
        "template_shared": bool(ram and ram.shared),
    }
    if pager:
        host = pager["host"]
        paracell |= {
            "guest_unbound_free_bytes": guest["unbound_pages"] * PAGE,
            "unbind_batches": host["unbind_batches"],
            "bind_batches": host["bind_batches"],
            "unbound_total_bytes": host["unbind_pages"] * PAGE,
            "bound_total_bytes": host["bind_pages"] * PAGE,
            # Of those, mapped into QEMU's own page tables as they were bound.
            "prefaulted_total_bytes": host["vmm_prefault_pages"] * PAGE,
            "bind_ms": host["bind_ms"],
            "last_reclaim_ms": host["last_reclaim_ms"],
            "guest": guest,
        }
    total_ns = qemu.get("user_ns", 0) + qemu.get("kernel_ns", 0)
    data: dict[str, Any] = {
        "cpu": {"usage": {"total": total_ns, "user": qemu.get("user_ns", 0),
                          "kernel": qemu.get("kernel_ns", 0)}},
        "memory": {"usage": {"usage": resident, "limit": limit}},
    }
    # The host cgroup holds the shim and QEMU: runc's figures, read as runc reads them.
    from paracell.runtime.host import cgroups
    from paracell.runtime.host.cgroups import stats as cgroup_stats

    data |= cgroup_stats.read(cgroups.from_facts(state.vm.host.cgroups))
    data["paracell"] = paracell
    return {"type": "stats", "id": container_id, "data": data}


def oom_kills(ctx: Context, container_id: str) -> int:
    """OOM kills of the container so far (-1: none to read): in its group in
    its VM, where the guest's OOM killer counts them (a pod member's, even
    after it ended), and, for a VM of its own, in its host cgroup, where the
    host's killed QEMU or the shim."""
    from paracell.runtime.agent import channel
    from paracell.runtime.host import cgroups
    from paracell.runtime.host.cgroups import stats as cgroup_stats
    from paracell.runtime.pod import pod
    from paracell.runtime.state.store import CONTROL_SOCKET

    try:
        state = ctx.store.load(container_id)
    except ParacellError:
        return -1
    member_of = pod.sandbox_socket(ctx.store, state)
    try:
        guest = channel.container_stats(
            member_of or ctx.store.dir(container_id) / CONTROL_SOCKET, container_id)["oom_kill"]
    except ParacellError:
        guest = -1  # its VM is gone, or never held it
    host = -1 if member_of else cgroup_stats.oom_kills(cgroups.from_facts(state.vm.host.cgroups))
    counted = [n for n in (guest, host) if n >= 0]
    return sum(counted) if counted else -1


def stream(ctx: Context, container_id: str, interval_s: float) -> Iterator[str]:
    """One stats event per interval while the container runs, as `runc events`
    does, and an `oom` event when an OOM killer struck the container: the
    guest's in its group, or the host's on QEMU or the shim (oom_kills)."""
    kills = oom_kills(ctx, container_id)
    while True:
        now = oom_kills(ctx, container_id)
        if kills >= 0 and now > kills:
            yield json.dumps({"type": "oom", "id": container_id})
        kills = max(kills, now)
        try:
            event = json.dumps(stats(ctx, container_id))
        except ParacellError:
            return
        yield event
        time.sleep(interval_s)
