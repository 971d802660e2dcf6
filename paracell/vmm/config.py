"""A VM's configuration as its creator recorded it: what its hypervisor is
chosen by, and what it is rebuilt from."""

from __future__ import annotations

from paracell.record import Record


class VmConfig(Record):
    """The VM as `create` configured it, typed and recorded: what `update`,
    `events`, `pause` and a pod's members read, and what a saved VM will be
    rebuilt from. A pod member has no VM of its own: all defaults."""

    FIELDS = {"engine": "", "memory_mib": 0, "vcpus": 0, "memory_manager": "none",
              "xgates": False, "ram_file": "", "qmp_socket": "", "pod_share": "",
              "network": "", "net_record": "", "vmm": "qemu", "libvirt_uri": "",
              "domain": ""}

    engine: str  # "kvm" or "tcg"
    memory_mib: int  # guest RAM at boot
    vcpus: int
    memory_manager: str  # "pager", "balloon" or "none"
    xgates: bool
    ram_file: str  # the guest-RAM file on the host
    qmp_socket: str
    pod_share: str  # a pod sandbox's share directory; "" for any other VM
    network: str  # the network plan's mode (paracell/net/netns.py)
    net_record: str  # which veths the shim mirrors (paracell/net/device.py)
    vmm: str  # the backend: "qemu" (direct) or "libvirt" (paracell/vmm/hypervisor.py)
    libvirt_uri: str  # the libvirt daemon that runs the domain
    domain: str  # the libvirt domain's name (paracell/vmm/libvirt/domain.py)
