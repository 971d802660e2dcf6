"""linux.resources as cgroup file writes, for v1 and for v2.

Each write is (controller, file, value) in the order it must happen; the
controller picks the hierarchy. The mapping follows runc's fs and fs2
drivers, including its v1 -> v2 conversions (shares -> weight, blkio weight ->
io.weight, memory+swap -> swap alone).
"""

from __future__ import annotations

from paracell.errors import ParacellError
from paracell.runtime.bundle.resources import Device, Resources

Write = tuple[str, str, str]

# The devices the shim and QEMU themselves open, whatever the container may:
# /dev/null, zero, random and urandom; /dev/kvm, /dev/net/tun, vhost-net and
# vhost-vsock; /dev/ptmx and the ptys for a container with a terminal.
VMM_DEVICES = (
    Device(True, "c", 1, 3, "rwm"), Device(True, "c", 1, 5, "rwm"),
    Device(True, "c", 1, 8, "rwm"), Device(True, "c", 1, 9, "rwm"),
    Device(True, "c", 10, 232, "rwm"), Device(True, "c", 10, 200, "rwm"),
    Device(True, "c", 10, 238, "rwm"), Device(True, "c", 10, 241, "rwm"),
    Device(True, "c", 5, 2, "rwm"), Device(True, "c", 136, -1, "rwm"),
)


def _num(value: int) -> str:
    return str(value)


# Fields written as they are, in this order (the period before the quota).
# "a|b": the writer takes the first name the cgroup has (blkio.weight on CFQ
# kernels, blkio.bfq.weight on BFQ ones).
V1_PLAIN = (
    ("memory_reservation", "memory", "memory.soft_limit_in_bytes"),
    ("memory_swappiness", "memory", "memory.swappiness"),
    ("cpu_shares", "cpu", "cpu.shares"),
    ("cpu_period", "cpu", "cpu.cfs_period_us"),
    ("cpu_quota", "cpu", "cpu.cfs_quota_us"),
    ("cpu_burst", "cpu", "cpu.cfs_burst_us"),
    ("cpu_rt_period", "cpu", "cpu.rt_period_us"),
    ("cpu_rt_runtime", "cpu", "cpu.rt_runtime_us"),
    ("cpu_idle", "cpu", "cpu.idle"),
    ("cpus", "cpuset", "cpuset.cpus"),
    ("mems", "cpuset", "cpuset.mems"),
    ("blkio_weight", "blkio", "blkio.weight|blkio.bfq.weight"),
    ("blkio_leaf_weight", "blkio", "blkio.leaf_weight"),
    ("net_classid", "net_cls", "net_cls.classid"),
)


def v1(res: Resources, current_memsw: int | None = None) -> list[Write]:
    """runc's fs driver. `current_memsw` decides the order of the two memory
    limits: the kernel refuses a limit above memsw, or memsw below the limit."""
    w: list[Write] = []
    limit, swap = res.memory_limit, res.memory_swap
    mem: list[Write] = []
    if limit is not None:
        mem.append(("memory", "memory.limit_in_bytes", _num(limit)))
    if swap is not None:
        mem.append(("memory", "memory.memsw.limit_in_bytes", _num(swap)))
    if len(mem) == 2 and current_memsw is not None and current_memsw != -1 \
            and (limit == -1 or (limit or 0) > current_memsw):
        mem.reverse()
    w += mem
    if res.disable_oom_killer:
        w.append(("memory", "memory.oom_control", "1"))
    for attr, controller, name in V1_PLAIN:
        value = getattr(res, attr)
        if value is not None:
            w.append((controller, name, str(value)))
    if res.pids_limit is not None:
        w.append(("pids", "pids.max", "max" if res.pids_limit < 0 else _num(res.pids_limit)))
    for dev in res.blkio_weight_device:
        w.append(("blkio", "blkio.weight_device|blkio.bfq.weight_device",
                  f"{dev.major}:{dev.minor} {dev.value}"))
    for name, devs in res.throttle.items():
        for dev in devs:
            w.append(("blkio", f"blkio.throttle.{name}", f"{dev.major}:{dev.minor} {dev.value}"))
    for size, limit_bytes in res.hugepages.items():
        w.append(("hugetlb", f"hugetlb.{size}.limit_in_bytes", _num(limit_bytes)))
    if res.devices:
        for dev in (*res.devices, *VMM_DEVICES):
            w.append(("devices", "devices.allow" if dev.allow else "devices.deny", dev.rule()))
    for name, prio in res.net_priorities:
        w.append(("net_prio", "net_prio.ifpriomap", f"{name} {prio}"))
    if res.unified:
        # runc's ErrV1NoUnified; on a hybrid host too, as runc has it.
        raise ParacellError("invalid configuration: cannot use unified on cgroup v1")
    return w


def shares_to_weight(shares: int) -> int:
    """runc's ConvertCPUSharesToCgroupV2Value: [2, 262144] -> [1, 10000]."""
    if shares == 0:
        return 0
    return 1 + ((max(shares, 2) - 2) * 9999) // 262142


def blkio_to_io_weight(weight: int) -> int:
    """runc's ConvertBlkIOToIOWeightValue: [10, 1000] -> [1, 10000]."""
    return 1 + (weight - 10) * 9999 // 990


def v2_swap(swap: int | None, limit: int | None) -> int | None:
    """runc's ConvertMemorySwapToCgroupV2Value: v2's swap.max is swap alone."""
    if swap is None:
        return -1 if limit == -1 else None
    if swap == -1:
        return -1
    if limit == -1:
        return swap
    if limit is None:
        raise ParacellError("unable to set swap limit without memory limit")
    if swap < limit:
        raise ParacellError("memory+swap limit should be >= memory limit")
    return swap - limit


def _max(value: int) -> str:
    return "max" if value < 0 else str(value)


def v2(res: Resources, current_period: int | None = None,
       controllers: tuple[str, ...] | None = None) -> list[Write]:
    """runc's fs2 driver. `controllers`: those v2 holds here (on a hybrid host
    v1 has the rest); a field v2 cannot express is refused only where v2 holds
    its controller."""
    def owns(controller: str) -> bool:
        return controllers is None or controller in controllers

    w: list[Write] = []
    if res.memory_limit is not None:
        w.append(("memory", "memory.max", _max(res.memory_limit)))
    swap = v2_swap(res.memory_swap, res.memory_limit) if owns("memory") else None
    if swap is not None:
        w.append(("memory", "memory.swap.max", _max(swap)))
    if res.memory_reservation is not None:
        w.append(("memory", "memory.low", _max(res.memory_reservation)))
    if res.memory_swappiness is not None and owns("memory"):
        raise ParacellError("linux.resources.memory.swappiness: cgroup v2 has no swappiness")
    if res.disable_oom_killer and owns("memory"):
        raise ParacellError("linux.resources.memory.disableOOMKiller: cgroup v2 cannot "
                            "disable the OOM killer")
    if res.cpu_shares is not None:
        w.append(("cpu", "cpu.weight", str(shares_to_weight(res.cpu_shares))))
    if res.cpu_quota is not None or res.cpu_period is not None:
        quota = "max" if (res.cpu_quota or -1) < 0 else str(res.cpu_quota)
        period = res.cpu_period or current_period or 100_000
        w.append(("cpu", "cpu.max", f"{quota} {period}"))
    if res.cpu_burst is not None:
        w.append(("cpu", "cpu.max.burst", str(res.cpu_burst)))
    if (res.cpu_rt_runtime is not None or res.cpu_rt_period is not None) and owns("cpu"):
        raise ParacellError("linux.resources.cpu: realtime runtime and period are not "
                            "supported on cgroup v2")
    if res.cpu_idle is not None:
        w.append(("cpu", "cpu.idle", str(res.cpu_idle)))
    if res.cpus:
        w.append(("cpuset", "cpuset.cpus", res.cpus))
    if res.mems:
        w.append(("cpuset", "cpuset.mems", res.mems))
    if res.pids_limit is not None:
        w.append(("pids", "pids.max", _max(res.pids_limit)))
    if res.blkio_weight is not None:
        w.append(("io", "io.bfq.weight|io.weight", str(blkio_to_io_weight(res.blkio_weight))))
    for dev in res.blkio_weight_device:
        w.append(("io", "io.bfq.weight|io.weight",
                  f"{dev.major}:{dev.minor} {blkio_to_io_weight(dev.value)}"))
    keys = {"read_bps_device": "rbps", "write_bps_device": "wbps",
            "read_iops_device": "riops", "write_iops_device": "wiops"}
    for name, devs in res.throttle.items():
        for dev in devs:
            w.append(("io", "io.max", f"{dev.major}:{dev.minor} {keys[name]}={dev.value}"))
    for size, limit_bytes in res.hugepages.items():
        w.append(("hugetlb", f"hugetlb.{size}.max", str(limit_bytes)))
    if (res.net_classid is not None or res.net_priorities) and controllers is None:
        raise ParacellError("linux.resources.network: net_cls and net_prio do not exist on "
                            "cgroup v2")
    for key, value in res.unified.items():
        w.append((key.split(".", 1)[0], key, value))
    return w
