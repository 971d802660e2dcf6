"""A container's stats, as runc's JSON names them (runtime/verbs/events.py),
in the cgroups v1 or v2 Metrics message containerd's CRI plugin decodes for
`crictl stats` and `kubectl top`: the one that matches the cgroup the
figures were read from, as containerd's own runc shim sends."""

from __future__ import annotations

from typing import Any

from paracell.shimv2.messages import cgroups_v1, cgroups_v2

U64_MAX = (1 << 64) - 1


def _u64(value: Any) -> int:
    """Clamped: the figures are read from files the guest or a cgroup wrote."""
    if not isinstance(value, int) or isinstance(value, bool):
        return 0
    return min(max(value, 0), U64_MAX)


def _entry(raw: Any) -> Any:
    raw = raw if isinstance(raw, dict) else {}
    return cgroups_v1.MemoryEntry(limit=_u64(raw.get("limit")), usage=_u64(raw.get("usage")),
                                  max=_u64(raw.get("max")), failcnt=_u64(raw.get("failcnt")))


def _memory_stat_key(field: str) -> str:
    """memory.stat's name for a MemoryStat field: pg_pg_in is pgpgin, and
    total_pg_pg_in is total_pgpgin."""
    total = field.startswith("total_")
    rest = field.removeprefix("total_")
    if rest.startswith("pg_"):
        rest = rest.replace("_", "")
    return f"total_{rest}" if total else rest


def _memory(data: dict[str, Any]) -> Any:
    raw = data.get("raw") if isinstance(data.get("raw"), dict) else {}
    stat = cgroups_v1.MemoryStat(usage=_entry(data.get("usage")), swap=_entry(data.get("swap")),
                                 kernel=_entry(data.get("kernel")),
                                 kernel_tcp=_entry(data.get("kernelTCP")))
    for field in stat.DESCRIPTOR.fields:
        if field.message_type is None:
            setattr(stat, field.name, _u64(raw.get(_memory_stat_key(field.name))))
    if not stat.cache:
        stat.cache = _u64(data.get("cache"))
    return stat


def v1_metrics(data: dict[str, Any]) -> Any:
    metrics = cgroups_v1.Metrics()
    cpu = data.get("cpu") if isinstance(data.get("cpu"), dict) else {}
    usage = cpu.get("usage") if isinstance(cpu.get("usage"), dict) else {}
    throttle = cpu.get("throttling") if isinstance(cpu.get("throttling"), dict) else {}
    percpu = usage.get("percpu") if isinstance(usage.get("percpu"), list) else []
    metrics.cpu.usage.CopyFrom(cgroups_v1.CPUUsage(
        total=_u64(usage.get("total")), kernel=_u64(usage.get("kernel")),
        user=_u64(usage.get("user")), per_cpu=[_u64(v) for v in percpu[:1024]]))
    metrics.cpu.throttling.CopyFrom(cgroups_v1.Throttle(
        periods=_u64(throttle.get("periods")),
        throttled_periods=_u64(throttle.get("throttledPeriods")),
        throttled_time=_u64(throttle.get("throttledTime"))))
    if isinstance(data.get("memory"), dict):
        metrics.memory.CopyFrom(_memory(data["memory"]))
    pids = data.get("pids")
    if isinstance(pids, dict):
        metrics.pids.CopyFrom(cgroups_v1.PidsStat(current=_u64(pids.get("current")),
                                                  limit=_u64(pids.get("limit"))))
    return metrics


def v2_metrics(data: dict[str, Any]) -> Any:
    """runc's stats of a cgroup v2 group (memory.stat's own names in `raw`)
    as containerd's cgroups v2 Metrics, which CRI reads on a v2 host: its
    working set is usage less inactive_file."""
    metrics = cgroups_v2.Metrics()
    cpu = data.get("cpu") if isinstance(data.get("cpu"), dict) else {}
    usage = cpu.get("usage") if isinstance(cpu.get("usage"), dict) else {}
    throttle = cpu.get("throttling") if isinstance(cpu.get("throttling"), dict) else {}
    metrics.cpu.CopyFrom(cgroups_v2.CPUStat(
        usage_usec=_u64(usage.get("total")) // 1000, user_usec=_u64(usage.get("user")) // 1000,
        system_usec=_u64(usage.get("kernel")) // 1000, nr_periods=_u64(throttle.get("periods")),
        nr_throttled=_u64(throttle.get("throttledPeriods")),
        throttled_usec=_u64(throttle.get("throttledTime")) // 1000))
    memory = data.get("memory")
    if isinstance(memory, dict):
        raw = memory.get("raw") if isinstance(memory.get("raw"), dict) else {}
        entry = memory.get("usage") if isinstance(memory.get("usage"), dict) else {}
        swap = memory.get("swap") if isinstance(memory.get("swap"), dict) else {}
        stat = cgroups_v2.MemoryStat(usage=_u64(entry.get("usage")),
                                     usage_limit=_u64(entry.get("limit")),
                                     swap_usage=_u64(swap.get("usage")),
                                     swap_limit=_u64(swap.get("limit")))
        for field in stat.DESCRIPTOR.fields:
            if field.name in raw:
                setattr(stat, field.name, _u64(raw[field.name]))
        metrics.memory.CopyFrom(stat)
    section = data.get("paracell") if isinstance(data.get("paracell"), dict) else {}
    events = section.get("memory_events")
    if isinstance(events, dict):
        metrics.memory_events.CopyFrom(cgroups_v2.MemoryEvents(
            **{name: _u64(events.get(name)) for name in ("low", "high", "max", "oom",
                                                          "oom_kill")}))
    pids = data.get("pids")
    if isinstance(pids, dict):
        metrics.pids.CopyFrom(cgroups_v2.PidsStat(current=_u64(pids.get("current")),
                                                  limit=_u64(pids.get("limit"))))
    return metrics
