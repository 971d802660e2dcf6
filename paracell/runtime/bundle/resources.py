"""`linux.resources` as hostile input: parsed once into typed, bounded values
that the cgroup writers (runtime/host/cgroups/) and the VM sizing use.

A value that is absent stays None and is left alone, as runc leaves it. Every
refusal is one line naming the field, so `create` and `update` fail the same way.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from paracell.errors import ParacellError

INT64_MAX = (1 << 63) - 1
UINT64_MAX = (1 << 64) - 1
MIB = 1 << 20
# A cpuset list such as "0-3,6"; each number is bounded below.
CPU_LIST = re.compile(r"\d{1,5}(-\d{1,5})?(,\d{1,5}(-\d{1,5})?)*")
MAX_CPU_INDEX = 8191
PAGE_SIZE = re.compile(r"[1-9]\d{0,4}(KB|MB|GB)")
MAX_DEVICE_RULES = 1024
MAX_DEVICE_ENTRIES = 256
# Keys of linux.resources.unified are cgroup v2 file names: "memory.high".
UNIFIED_KEY = re.compile(r"[a-z][a-z0-9_]*\.[a-z0-9_.]+")
MAX_UNIFIED = 64
MAX_UNIFIED_VALUE = 4096
IFNAME = re.compile(r"[A-Za-z0-9_.:-]{1,15}")


def _fail(where: str, msg: str) -> ParacellError:
    return ParacellError(f"linux.resources.{where}: {msg}")


def _int(value: Any, where: str, low: int, high: int) -> int | None:
    if value is None:
        return None
    # bool is an int in Python, and a float would be truncated silently.
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(where, f"{value!r} is not an integer")
    if not low <= value <= high:
        raise _fail(where, f"{value} is outside {low}..{high}")
    return value


def _limit(value: Any, where: str) -> int | None:
    """runc's byte limits: -1 is unlimited, 0 is unset, otherwise a byte count."""
    n = _int(value, where, -1, INT64_MAX)
    return None if n == 0 else n


def _bool(value: Any, where: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise _fail(where, f"{value!r} is not a boolean")


def _obj(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(where, "must be an object")
    return value


def _list(value: Any, where: str, limit: int) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _fail(where, "must be a list")
    if len(value) > limit:
        raise _fail(where, f"has more than {limit} entries")
    return value


def cpu_list(value: Any, where: str) -> str | None:
    """A cpuset list, checked so that it also tells how many CPUs it names."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > 1024 or not CPU_LIST.fullmatch(value):
        raise _fail(where, f"{value!r} is not a list of CPU numbers like 0-3,6")
    for part in value.split(","):
        low, _, high = part.partition("-")
        if int(high or low) < int(low) or int(high or low) > MAX_CPU_INDEX:
            raise _fail(where, f"{part!r} is not a valid range")
    return value


def count_cpus(cpus: str) -> int:
    named: set[int] = set()
    for part in cpus.split(","):
        low, _, high = part.partition("-")
        named.update(range(int(low), int(high or low) + 1))
    return len(named)


@dataclass(frozen=True)
class Device:
    """One devices-cgroup rule; major/minor -1 is '*'."""

    allow: bool
    kind: str  # a, b or c
    major: int
    minor: int
    access: str

    def rule(self) -> str:
        if self.kind == "a":
            return "a"
        major = "*" if self.major < 0 else str(self.major)
        minor = "*" if self.minor < 0 else str(self.minor)
        return f"{self.kind} {major}:{minor} {self.access}"


@dataclass(frozen=True)
class BlockDevice:
    major: int
    minor: int
    value: int  # a weight or a rate


@dataclass
class Resources:
    memory_limit: int | None = None
    memory_reservation: int | None = None
    memory_swap: int | None = None
    memory_swappiness: int | None = None
    disable_oom_killer: bool | None = None
    cpu_shares: int | None = None
    cpu_quota: int | None = None
    cpu_period: int | None = None
    cpu_burst: int | None = None
    cpu_rt_runtime: int | None = None
    cpu_rt_period: int | None = None
    cpu_idle: int | None = None
    cpus: str | None = None
    mems: str | None = None
    pids_limit: int | None = None
    blkio_weight: int | None = None
    blkio_leaf_weight: int | None = None
    blkio_weight_device: list[BlockDevice] = field(default_factory=list)
    throttle: dict[str, list[BlockDevice]] = field(default_factory=dict)
    hugepages: dict[str, int] = field(default_factory=dict)
    devices: list[Device] = field(default_factory=list)
    net_classid: int | None = None
    net_priorities: list[tuple[str, int]] = field(default_factory=list)
    unified: dict[str, str] = field(default_factory=dict)
    # Fields runc accepts and ignores (kernel memory is obsolete in the kernel).
    ignored: list[str] = field(default_factory=list)


THROTTLE_FIELDS = {
    "throttleReadBpsDevice": "read_bps_device",
    "throttleWriteBpsDevice": "write_bps_device",
    "throttleReadIOPSDevice": "read_iops_device",
    "throttleWriteIOPSDevice": "write_iops_device",
}


def _block_devices(value: Any, where: str, key: str, low: int, high: int) -> list[BlockDevice]:
    found = []
    for i, entry in enumerate(_list(value, where, MAX_DEVICE_ENTRIES)):
        entry = _obj(entry, f"{where}[{i}]")
        major = _int(entry.get("major"), f"{where}[{i}].major", 0, 0xFFFFFFFF)
        minor = _int(entry.get("minor"), f"{where}[{i}].minor", 0, 0xFFFFFFFF)
        amount = _int(entry.get(key), f"{where}[{i}].{key}", low, high)
        if major is None or minor is None or amount is None:
            raise _fail(f"{where}[{i}]", f"needs major, minor and {key}")
        found.append(BlockDevice(major, minor, amount))
    return found


def _devices(value: Any) -> list[Device]:
    rules = []
    for i, entry in enumerate(_list(value, "devices", MAX_DEVICE_RULES)):
        where = f"devices[{i}]"
        entry = _obj(entry, where)
        allow = _bool(entry.get("allow"), f"{where}.allow")
        if allow is None:
            raise _fail(f"{where}.allow", "is required")
        kind = entry.get("type") or "a"
        if kind not in ("a", "b", "c"):
            raise _fail(f"{where}.type", f"{kind!r} is not a, b or c")
        major = _int(entry.get("major", -1), f"{where}.major", -1, 0xFFFFFFFF)
        minor = _int(entry.get("minor", -1), f"{where}.minor", -1, 0xFFFFFFFF)
        access = entry.get("access") or "rwm"
        if not isinstance(access, str) or not access or len(access) > 3 \
                or set(access) - set("rwm") or len(set(access)) != len(access):
            raise _fail(f"{where}.access", f"{access!r} is not made of r, w and m")
        rules.append(Device(allow, kind, -1 if major is None else major,
                            -1 if minor is None else minor, access))
    return rules


def _memory(res: Resources, memory: dict[str, Any]) -> None:
    res.memory_limit = _limit(memory.get("limit"), "memory.limit")
    res.memory_reservation = _limit(memory.get("reservation"), "memory.reservation")
    res.memory_swap = _limit(memory.get("swap"), "memory.swap")
    res.memory_swappiness = _int(memory.get("swappiness"), "memory.swappiness", 0, 100)
    res.disable_oom_killer = _bool(memory.get("disableOOMKiller"), "memory.disableOOMKiller")
    for obsolete in ("kernel", "kernelTCP"):
        if _limit(memory.get(obsolete), f"memory.{obsolete}") is not None:
            res.ignored.append(f"memory.{obsolete}")
    _bool(memory.get("useHierarchy"), "memory.useHierarchy")
    _bool(memory.get("checkBeforeUpdate"), "memory.checkBeforeUpdate")
    limit, swap = res.memory_limit, res.memory_swap
    if swap is not None and swap > 0 and limit is not None and limit > 0 and swap < limit:
        raise _fail("memory.swap", "memory+swap limit should be >= memory limit")


def _cpu(res: Resources, cpu: dict[str, Any]) -> None:
    res.cpu_shares = _int(cpu.get("shares"), "cpu.shares", 0, 262144) or None
    quota = _int(cpu.get("quota"), "cpu.quota", -1, INT64_MAX)
    res.cpu_quota = None if quota == 0 else quota
    # The kernel's CFS bounds: 1 ms .. 1 s.
    res.cpu_period = _int(cpu.get("period"), "cpu.period", 0, 1_000_000) or None
    if res.cpu_period is not None and res.cpu_period < 1000:
        raise _fail("cpu.period", f"{res.cpu_period} is outside 1000..1000000")
    res.cpu_burst = _int(cpu.get("burst"), "cpu.burst", 0, INT64_MAX)
    res.cpu_rt_runtime = _int(cpu.get("realtimeRuntime"), "cpu.realtimeRuntime", -1,
                              INT64_MAX) or None
    res.cpu_rt_period = _int(cpu.get("realtimePeriod"), "cpu.realtimePeriod", 0,
                             INT64_MAX) or None
    res.cpu_idle = _int(cpu.get("idle"), "cpu.idle", 0, 1)
    res.cpus = cpu_list(cpu.get("cpus"), "cpu.cpus")
    res.mems = cpu_list(cpu.get("mems"), "cpu.mems")


def _blkio(res: Resources, blkio: dict[str, Any]) -> None:
    weight = _int(blkio.get("weight"), "blockIO.weight", 0, 1000)
    if weight is not None and 0 < weight < 10:
        raise _fail("blockIO.weight", f"{weight} is outside 10..1000")
    res.blkio_weight = weight or None
    res.blkio_leaf_weight = _int(blkio.get("leafWeight"), "blockIO.leafWeight", 10, 1000)
    res.blkio_weight_device = _block_devices(blkio.get("weightDevice"), "blockIO.weightDevice",
                                             "weight", 10, 1000)
    for key, name in THROTTLE_FIELDS.items():
        entries = _block_devices(blkio.get(key), f"blockIO.{key}", "rate", 0, UINT64_MAX)
        if entries:
            res.throttle[name] = entries


def _hugepages(res: Resources, value: Any) -> None:
    for i, entry in enumerate(_list(value, "hugepageLimits", 16)):
        entry = _obj(entry, f"hugepageLimits[{i}]")
        size = entry.get("pageSize")
        if not isinstance(size, str) or not PAGE_SIZE.fullmatch(size):
            raise _fail(f"hugepageLimits[{i}].pageSize", f"{size!r} is not like 2MB")
        limit = _int(entry.get("limit"), f"hugepageLimits[{i}].limit", 0, UINT64_MAX)
        res.hugepages[size] = limit or 0


def _network(res: Resources, network: dict[str, Any]) -> None:
    res.net_classid = _int(network.get("classID"), "network.classID", 0, 0xFFFFFFFF)
    for i, entry in enumerate(_list(network.get("priorities"), "network.priorities", 64)):
        entry = _obj(entry, f"network.priorities[{i}]")
        name = entry.get("name")
        if not isinstance(name, str) or not IFNAME.fullmatch(name):
            raise _fail(f"network.priorities[{i}].name", f"{name!r} is not an interface name")
        prio = _int(entry.get("priority"), f"network.priorities[{i}].priority", 0, 0xFFFFFFFF)
        res.net_priorities.append((name, prio or 0))


def _unified(res: Resources, value: Any) -> None:
    unified = _obj(value, "unified")
    if len(unified) > MAX_UNIFIED:
        raise _fail("unified", f"has more than {MAX_UNIFIED} entries")
    for key, val in unified.items():
        # runc's rule: a file name, never a path; and never the membership files.
        if not UNIFIED_KEY.fullmatch(key) or key.startswith("cgroup."):
            raise _fail("unified", f"unified resource {key!r} must be in the form "
                        "CONTROLLER.PARAMETER")
        if not isinstance(val, str) or len(val) > MAX_UNIFIED_VALUE or "\0" in val:
            raise _fail(f"unified[{key!r}]", "must be a string of up to 4096 bytes")
        res.unified[key] = val


def parse(value: Any) -> Resources:
    """linux.resources (or `update --resources`) as typed, bounded values."""
    raw = _obj(value, "") if value is not None else {}
    res = Resources()
    _memory(res, _obj(raw.get("memory"), "memory"))
    _cpu(res, _obj(raw.get("cpu"), "cpu"))
    pids = _obj(raw.get("pids"), "pids")
    limit = _int(pids.get("limit"), "pids.limit", -1, INT64_MAX)
    res.pids_limit = None if limit == 0 else limit
    _blkio(res, _obj(raw.get("blockIO"), "blockIO"))
    _hugepages(res, raw.get("hugepageLimits"))
    res.devices = _devices(raw.get("devices"))
    _network(res, _obj(raw.get("network"), "network"))
    _unified(res, raw.get("unified"))
    if raw.get("rdma"):
        raise _fail("rdma", "the rdma cgroup is not supported: a micro-VM has no RDMA devices")
    return res


# -- VM sizing ---------------------------------------------------------------

# Below this a guest kernel and agent have too little room to be useful.
GUEST_FLOOR_MIB = 64
GUEST_CEILING_MIB = 65536
# The guest kernel is built with CONFIG_NR_CPUS=8 (guest/kernel/paracell.config).
GUEST_MAX_VCPUS = 8


@dataclass(frozen=True)
class GuestSize:
    memory_mib: int
    vcpus: int
    # Why it is this size, for the create log line.
    reason: str


def guest_size(res: Resources, default_mib: int, host_cpus: int) -> GuestSize:
    """memory.limit sizes guest RAM (with a floor); cpu quota/period or the
    cpuset sizes the vCPUs, bounded by the host and the guest kernel."""
    reasons = []
    memory_mib = default_mib
    if res.memory_limit is not None and res.memory_limit > 0:
        memory_mib = min(max(res.memory_limit // MIB, GUEST_FLOOR_MIB), GUEST_CEILING_MIB)
        reasons.append(f"memory.limit {res.memory_limit}")
    wanted: list[int] = []
    if res.cpu_quota is not None and res.cpu_quota > 0:
        wanted.append(math.ceil(res.cpu_quota / (res.cpu_period or 100_000)))
        reasons.append(f"cpu quota {res.cpu_quota}/{res.cpu_period or 100_000}")
    if res.cpus:
        wanted.append(count_cpus(res.cpus))
        reasons.append(f"cpuset {res.cpus}")
    vcpus = min(wanted) if wanted else 1
    vcpus = max(1, min(vcpus, host_cpus, GUEST_MAX_VCPUS))
    return GuestSize(memory_mib, vcpus, ", ".join(reasons) or "defaults")
