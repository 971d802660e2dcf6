"""What `create` decides for the host side of a container, in one place:
the VM's size from linux.resources, the host cgroup at cgroupsPath, and the
namespaces the shim and QEMU get (runtime/host/hostns.py, runtime/host/cgroups/)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from paracell.runtime.bundle import resources
from paracell.runtime.bundle.resources import GuestSize, Resources
from paracell.runtime.host import cgroups, hostns
from paracell.runtime.host.cgroups import CgroupDir, hierarchy
from paracell.runtime.host.hostns import HostIsolation
from paracell.runtime.state.store import HostRecord

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

    from paracell.runtime.bundle.spec import Bundle


@dataclass
class HostPlan:
    resources: Resources
    size: GuestSize
    cgroup_dirs: list[CgroupDir]
    isolation: HostIsolation

    def record(self) -> HostRecord:
        """What `delete` reclaims the cgroup from."""
        return HostRecord(cgroups=cgroups.facts(self.cgroup_dirs))

    def setup(self, engine: str, log: Any, state_dir: Path, memory_file: Path,
              bundle: Bundle) -> None:
        """Makes the cgroup with the host's limits; the shim joins it. Notes
        what the shim and QEMU still write once jailed: their state, guest
        RAM, a writable rootfs, the log."""
        writable = [state_dir, memory_file.parent]
        if not bundle.rootfs_readonly:
            writable.append(bundle.rootfs)
        if log.path:
            writable.append(log.path)
        self.isolation.writable = [os.path.abspath(p) for p in writable]
        for name in self.resources.ignored:
            log.warning(f"linux.resources.{name} is ignored, as runc ignores it "
                        "(kernel memory accounting is obsolete)")
        host = cgroups.host_resources(self.resources, self.size.memory_mib, engine)
        cgroups.setup(self.cgroup_dirs, host, log)
        self.isolation.cgroup_dirs = [d.path for d in self.cgroup_dirs]


def plan(bundle: Bundle, container_id: str, systemd: bool, default_memory_mib: int) -> HostPlan:
    linux = bundle.config.get("linux") or {}
    res = resources.parse(linux.get("resources"))
    size = resources.guest_size(res, default_memory_mib, os.cpu_count() or 1)
    cgroups_path = hierarchy.check_cgroups_path(linux.get("cgroupsPath"))
    if systemd and not cgroups_path:
        cgroups_path = f"system.slice:paracell:{container_id}"
    dirs = cgroups.place(cgroups_path, container_id, systemd)
    return HostPlan(res, size, dirs, HostIsolation(hostns.plan(bundle.namespaces)))
