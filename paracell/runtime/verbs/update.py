"""`paracell update`: runc's flags and --resources, applied to the host cgroup,
with the guest's memory resized live through the balloon.

What a micro-VM can change live, and what it cannot:
- every cgroup limit: written as runc writes it;
- guest memory: down (and back up to its boot size) with the balloon memory
  manager, through the backend's live resize (Hypervisor.set_memory, where
  its Capabilities say it has one); the Pager and `none` have no live resize, and
  no manager can grow the guest past its boot RAM (microvm has no memory
  hotplug), so those are refused;
- vCPUs: microvm cannot hotplug CPUs, so the count stays; the cpu limits
  still apply to the cgroup, and a warning says the count did not change.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from collections.abc import Iterator
from typing import Any

from paracell.errors import ParacellError
from paracell.runtime.bundle import resources
from paracell.runtime.bundle.resources import MIB, Resources
from paracell.runtime.host import cgroups
from paracell.runtime.state.store import ContainerState, StateStore
from paracell.vmm import backends
from paracell.vmm.hypervisor import Hypervisor

TYPE_CHECKING = False
if TYPE_CHECKING:
    from paracell.runtime.context import Context

MAX_RESOURCES_BYTES = 1 << 20
BALLOON_WAIT_S = 10.0
# docker's units.RAMInBytes, which runc uses for the memory flags.
RAM = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgtp]?)i?b?", re.IGNORECASE)
UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}

# runc's flag -> (section, field, parser).
INT_FLAGS = {
    "blkio-weight": ("blockIO", "weight"), "cpu-period": ("cpu", "period"),
    "cpu-quota": ("cpu", "quota"), "cpu-burst": ("cpu", "burst"),
    "cpu-share": ("cpu", "shares"), "cpu-rt-period": ("cpu", "realtimePeriod"),
    "cpu-rt-runtime": ("cpu", "realtimeRuntime"), "cpu-idle": ("cpu", "idle"),
    "pids-limit": ("pids", "limit"),
}
RAM_FLAGS = {
    "memory": ("memory", "limit"), "memory-swap": ("memory", "swap"),
    "memory-reservation": ("memory", "reservation"), "kernel-memory": ("memory", "kernel"),
    "kernel-memory-tcp": ("memory", "kernelTCP"),
}
STR_FLAGS = {"cpuset-cpus": ("cpu", "cpus"), "cpuset-mems": ("cpu", "mems")}


def read_resources(source: str) -> dict[str, Any]:
    try:
        if source == "-":
            raw = sys.stdin.buffer.read(MAX_RESOURCES_BYTES + 1)
        else:
            with open(source, "rb") as f:
                raw = f.read(MAX_RESOURCES_BYTES + 1)
    except OSError as err:
        raise ParacellError(f"open {source}: {err.strerror}") from None
    if len(raw) > MAX_RESOURCES_BYTES:
        raise ParacellError(f"update: resources larger than {MAX_RESOURCES_BYTES} bytes")
    try:
        value = json.loads(raw) if raw.strip() else {}
    except (ValueError, UnicodeDecodeError) as err:
        raise ParacellError(f"update: resources are not valid JSON: {err}") from None
    if not isinstance(value, dict):
        raise ParacellError("update: resources must be a JSON object")
    return value


def ram_in_bytes(text: str, flag: str) -> int:
    if text.strip() == "-1":
        return -1
    match = RAM.fullmatch(text.strip())
    if not match or len(text) > 32:
        raise ParacellError(f"invalid value for {flag}: {text!r}")
    value = int(float(match.group(1)) * UNITS[match.group(2).lower()])
    if value > resources.INT64_MAX:
        raise ParacellError(f"invalid value for {flag}: {text!r} is too large")
    return value


def _int_flag(text: str, flag: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise ParacellError(f"invalid value for {flag}: {text!r}") from None
    if not -resources.INT64_MAX - 1 <= value <= resources.UINT64_MAX:
        raise ParacellError(f"invalid value for {flag}: {text!r}")
    return value


def merge_flags(raw: dict[str, Any], flags: dict[str, str | None]) -> dict[str, Any]:
    """The flags win over --resources, as with runc."""
    merged = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    for flag, text in flags.items():
        if text is None:
            continue
        if flag in INT_FLAGS:
            section, key, value = *INT_FLAGS[flag], _int_flag(text, flag)
        elif flag in RAM_FLAGS:
            section, key, value = *RAM_FLAGS[flag], ram_in_bytes(text, flag)
        elif flag in STR_FLAGS:
            section, key, value = *STR_FLAGS[flag], text
        else:
            raise ParacellError(f"update: --{flag} is not supported (Intel RDT is not "
                                "available to a micro-VM)")
        target = merged.setdefault(section, {})
        if not isinstance(target, dict):
            raise ParacellError(f"linux.resources.{section}: must be an object")
        target[key] = value
    mem = merged.get("memory")
    # runc's fix-up: unlimited memory with no swap given means unlimited swap too.
    if isinstance(mem, dict) and mem.get("limit") == -1 and "swap" not in mem:
        mem["swap"] = -1
    return merged


def _manager(state: ContainerState) -> str:
    return state.vm.config.memory_manager


def _memory_target(state: ContainerState, res: Resources, guest_mib: int) -> int:
    """The guest's new usable MiB (its RAM minus the balloon), or a refusal."""
    limit = res.memory_limit or -1
    target = guest_mib if limit < 0 else max(limit // MIB, resources.GUEST_FLOOR_MIB)
    if target > guest_mib:
        raise ParacellError(f"memory.limit of {limit} is above the guest's boot RAM "
                            f"({guest_mib} MiB): microvm has no memory hotplug")
    manager = _manager(state)
    if manager != "balloon" and target != guest_mib:
        raise ParacellError(f"memory.limit: the {manager} memory manager cannot resize the "
                            "guest live; create the container with the balloon manager "
                            "(annotation io.paracell.memory-manager=balloon) to shrink it")
    if target != guest_mib and not backends.capabilities_of(state.vm.config).live_resize:
        raise ParacellError(f"memory.limit: the {state.vm.config.vmm} backend cannot resize "
                            "the guest live")
    return target


def _balloon(state: ContainerState, target_mib: int, vmm: Hypervisor) -> None:
    """Sets the balloon and waits (bounded) until the guest has given the
    memory back, so a lower cgroup limit that follows finds it free."""
    if _manager(state) != "balloon":
        return
    vmm.set_memory(target_mib * MIB)
    deadline = time.monotonic() + BALLOON_WAIT_S
    while time.monotonic() < deadline:
        if abs(vmm.memory() - target_mib * MIB) <= MIB:
            return
        time.sleep(0.1)


def _usable_now(state: ContainerState, guest_mib: int, vmm: Hypervisor) -> int:
    if _manager(state) != "balloon":
        return guest_mib
    return vmm.memory() // MIB


def apply(state: ContainerState, raw: dict[str, Any], vmm: Hypervisor) -> Iterator[str]:
    """Applies the update to a VM of the container's own; yields warnings
    for the caller to print."""
    res = resources.parse(raw)
    if res.devices:
        # runc's update leaves the device rules alone too; saying so beats
        # pretending they changed.
        raise ParacellError("update: linux.resources.devices cannot be changed on a "
                            "running container")
    config = state.vm.config
    dirs = cgroups.from_facts(state.vm.host.cgroups)
    guest_mib, vcpus, engine = config.memory_mib, config.vcpus, config.engine
    for name in res.ignored:
        yield f"linux.resources.{name} is ignored (kernel memory accounting is obsolete)"
    if res.memory_limit is None:
        cgroups.update(dirs, res)
    else:
        target = _memory_target(state, res, guest_mib)
        host = cgroups.host_resources(res, target, engine)
        if res.memory_limit > 0:
            # The guest's usable RAM plus the VMM's overhead, as at create.
            from dataclasses import replace

            host = replace(host, memory_limit=target * MIB
                           + cgroups.VMM_OVERHEAD_MIB.get(engine, 192) * MIB)
        # Growing: the cgroup first, then the guest; shrinking: the other way,
        # so the host limit never sits below what the guest may use.
        if target >= _usable_now(state, guest_mib, vmm):
            cgroups.update(dirs, host)
            _balloon(state, target, vmm)
        else:
            _balloon(state, target, vmm)
            cgroups.update(dirs, host)
    wanted = _vcpus_for(res)
    if wanted is not None and wanted != vcpus:
        yield (f"the cpu limits apply to the host cgroup; the guest keeps {vcpus} vCPU(s), "
               f"not {wanted}: microvm cannot hotplug CPUs")


def apply_to_member(store: StateStore, state: ContainerState,
                    raw: dict[str, Any]) -> Iterator[str]:
    """A pod member's memory and pids limits are its group's in the pod's VM
    (docs/pods.md); the rest of linux.resources is the pod VM's."""
    from paracell.runtime.agent import channel
    from paracell.runtime.pod import pod

    res = resources.parse(raw)
    memory = None if res.memory_limit is None else max(res.memory_limit, 0)
    pids = None if res.pids_limit is None else max(res.pids_limit, 0)
    if memory is not None or pids is not None:
        socket = pod.sandbox_socket(store, state)
        if socket is None:
            raise ParacellError(f"container {state.id} has no VM of its own: update its "
                                "pod's sandbox")
        channel.set_limits(socket, state.id, memory, pids)
    others = [name for name, value in (("cpu", res.cpu_shares or res.cpu_quota or res.cpus),
                                        ("blockIO", res.blkio_weight))
              if value]
    for name in others:
        yield f"linux.resources.{name} of a pod member is its pod VM's: update the sandbox"


def _current_limit(dirs: list[cgroups.CgroupDir]) -> int | None:
    for d in dirs:
        if "memory" in d.controllers:
            name = "memory.limit_in_bytes" if d.version == 1 else "memory.max"
            try:
                with open(f"{d.path}/{name}") as f:
                    text = f.read().strip()
            except OSError:
                return None
            return None if text == "max" else int(text)
    return None


def _vcpus_for(res: Resources) -> int | None:
    wanted = []
    if res.cpu_quota is not None and res.cpu_quota > 0:
        wanted.append(math.ceil(res.cpu_quota / (res.cpu_period or 100_000)))
    if res.cpus:
        wanted.append(resources.count_cpus(res.cpus))
    if not wanted:
        return None
    return max(1, min(min(wanted), resources.GUEST_MAX_VCPUS))


def update(ctx: Context, container_id: str, source: str | None,
           flags: dict[str, str | None]) -> None:
    """runc's update: the host cgroup, and guest memory through the balloon;
    source is --resources (a file, or - for stdin)."""
    raw = read_resources(source) if source else {}
    for line in update_resources(ctx, container_id, merge_flags(raw, flags)):
        print(f"paracell: {line}", file=sys.stderr)


def update_resources(ctx: Context, container_id: str, asked: dict[str, Any]) -> list[str]:
    """The one update, for the CLI and containerd's shim v2 alike: OCI
    `linux.resources` applied under the container's lock; what could not be
    applied as asked, as notices."""
    from paracell.runtime.state import status

    with ctx.store.locked(container_id):
        state = ctx.store.load(container_id)
        status.transition("update", state.status, container_id)
        if not state.vm.config.engine:
            return list(apply_to_member(ctx.store, state, asked))
        return list(apply(state, asked, backends.hypervisor_of(state.vm.config)))
