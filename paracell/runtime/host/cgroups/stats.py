"""The container's cgroup figures in runc's stats format (runc's types/events.go):
cpu, memory, pids, blkio and hugetlb, from v1 or v2 files."""

from __future__ import annotations

import os
from typing import Any

from paracell.runtime.host.cgroups import CgroupDir

UNLIMITED = (1 << 63) - 1  # what runc reports for "max"


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _int(text: str) -> int:
    text = text.strip()
    if text == "max":
        return UNLIMITED
    try:
        return max(int(text), 0)
    except ValueError:
        return 0


def _keyed(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            out[parts[0]] = _int(parts[1])
    return out


def _v1_cpu(d: str, cpuacct: str) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "total": _int(_read(f"{cpuacct}/cpuacct.usage")),
        "percpu": [int(v) for v in _read(f"{cpuacct}/cpuacct.usage_percpu").split()],
    }
    # cpuacct.stat is in USER_HZ ticks; runc converts to nanoseconds.
    ticks = _keyed(_read(f"{cpuacct}/cpuacct.stat"))
    hz = os.sysconf("SC_CLK_TCK")
    usage["user"] = ticks.get("user", 0) * 1_000_000_000 // hz
    usage["kernel"] = ticks.get("system", 0) * 1_000_000_000 // hz
    throttle = _keyed(_read(f"{d}/cpu.stat"))
    return {"usage": usage, "throttling": {
        "periods": throttle.get("nr_periods", 0),
        "throttledPeriods": throttle.get("nr_throttled", 0),
        "throttledTime": throttle.get("throttled_time", 0)}}


def _v1_memory(d: str) -> dict[str, Any]:
    def entry(prefix: str) -> dict[str, int]:
        return {"usage": _int(_read(f"{d}/{prefix}usage_in_bytes")),
                "max": _int(_read(f"{d}/{prefix}max_usage_in_bytes")),
                "failcnt": _int(_read(f"{d}/{prefix}failcnt")),
                "limit": _int(_read(f"{d}/{prefix}limit_in_bytes"))}

    raw = _keyed(_read(f"{d}/memory.stat"))
    return {"cache": raw.get("total_cache", raw.get("cache", 0)), "usage": entry("memory."),
            "swap": entry("memory.memsw."), "kernel": entry("memory.kmem."),
            "kernelTCP": entry("memory.kmem.tcp."), "raw": raw}


def _v2_memory(d: str) -> dict[str, Any]:
    raw = _keyed(_read(f"{d}/memory.stat"))
    events = _keyed(_read(f"{d}/memory.events"))
    return {"cache": raw.get("file", 0),
            "usage": {"usage": _int(_read(f"{d}/memory.current")),
                      "max": _int(_read(f"{d}/memory.peak")),
                      "failcnt": events.get("max", 0),
                      "limit": _int(_read(f"{d}/memory.max") or "max")},
            "swap": {"usage": _int(_read(f"{d}/memory.swap.current")),
                     "limit": _int(_read(f"{d}/memory.swap.max") or "max"), "failcnt": 0},
            "raw": raw}


def _v2_cpu(d: str) -> dict[str, Any]:
    stat = _keyed(_read(f"{d}/cpu.stat"))
    return {"usage": {"total": stat.get("usage_usec", 0) * 1000,
                      "user": stat.get("user_usec", 0) * 1000,
                      "kernel": stat.get("system_usec", 0) * 1000},
            "throttling": {"periods": stat.get("nr_periods", 0),
                           "throttledPeriods": stat.get("nr_throttled", 0),
                           "throttledTime": stat.get("throttled_usec", 0) * 1000}}


def _blkio_v1(d: str) -> dict[str, Any]:
    def entries(name: str) -> list[dict[str, Any]]:
        out = []
        for line in _read(f"{d}/{name}").splitlines():
            parts = line.split()
            if len(parts) == 3 and ":" in parts[0]:
                major, _, minor = parts[0].partition(":")
                out.append({"major": _int(major), "minor": _int(minor), "op": parts[1],
                            "value": _int(parts[2])})
        return out

    return {"ioServiceBytesRecursive": entries("blkio.throttle.io_service_bytes_recursive"),
            "ioServicedRecursive": entries("blkio.throttle.io_serviced_recursive")}


def _hugetlb(d: str, version: int) -> dict[str, Any]:
    out = {}
    try:
        names = os.listdir(d)
    except OSError:
        return {}
    for name in names:
        parts = name.split(".")
        if len(parts) == 3 and parts[0] == "hugetlb" and parts[2] in ("usage_in_bytes", "current"):
            size = parts[1]
            if version == 1:
                out[size] = {"usage": _int(_read(f"{d}/hugetlb.{size}.usage_in_bytes")),
                             "max": _int(_read(f"{d}/hugetlb.{size}.max_usage_in_bytes")),
                             "failcnt": _int(_read(f"{d}/hugetlb.{size}.failcnt"))}
            else:
                out[size] = {"usage": _int(_read(f"{d}/hugetlb.{size}.current")),
                             "failcnt": _keyed(_read(f"{d}/hugetlb.{size}.events")).get("max", 0)}
    return out


def read(dirs: list[CgroupDir]) -> dict[str, Any]:
    by = {c: d for d in dirs for c in d.controllers}
    data: dict[str, Any] = {}
    cpu, acct = by.get("cpu"), by.get("cpuacct")
    if cpu is not None and cpu.version == 2:
        data["cpu"] = _v2_cpu(cpu.path)
    elif acct is not None:
        data["cpu"] = _v1_cpu(cpu.path if cpu else acct.path, acct.path)
    mem = by.get("memory")
    if mem is not None:
        data["memory"] = _v1_memory(mem.path) if mem.version == 1 else _v2_memory(mem.path)
    pids = by.get("pids")
    if pids is not None:
        data["pids"] = {"current": _int(_read(f"{pids.path}/pids.current")),
                        "limit": _int(_read(f"{pids.path}/pids.max") or "max")}
    blkio = by.get("blkio")
    if blkio is not None:
        data["blkio"] = _blkio_v1(blkio.path)
    huge = by.get("hugetlb")
    if huge is not None:
        data["hugetlb"] = _hugetlb(huge.path, huge.version)
    cpuset = by.get("cpuset")
    if cpuset is not None:
        data["cpuset"] = {"cpus": _indices(_read(f"{cpuset.path}/cpuset.effective_cpus")),
                          "mems": _indices(_read(f"{cpuset.path}/cpuset.effective_mems"))}
    return data


def _indices(text: str) -> list[int]:
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            out.extend(range(int(low), int(high or low) + 1))
    return out[:8192]


def oom_kills(dirs: list[CgroupDir]) -> int:
    """memory.oom_control's oom_kill (v1) or memory.events' oom_kill (v2);
    -1 without a memory cgroup."""
    mem = next((d for d in dirs if "memory" in d.controllers), None)
    if mem is None:
        return -1
    name = "memory.oom_control" if mem.version == 1 else "memory.events"
    text = _read(f"{mem.path}/{name}")
    return _keyed(text).get("oom_kill", 0) if text else -1
