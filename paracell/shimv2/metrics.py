"""A container's stats, as runc's JSON names them (runtime/verbs/events.py),
in the cgroups v1 Metrics message containerd's CRI plugin decodes for
`crictl stats` and `kubectl top`."""

from __future__ import annotations

from typing import Any

from paracell.shimv2.messages import cgroups_v1

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
