"""A VM's configuration as its creator recorded it: what its hypervisor is
chosen by, and what it is rebuilt from."""

from __future__ import annotations

from paracell.record import Record


class VmConfig(Record):
    """The VM as `create` configured it, typed and recorded: what `update`,
    `events`, `pause` and a pod's members read, and what a saved VM will be
    rebuilt from. A pod member has no VM of its own: all defaults."""

    FIELDS = {"engine": "", "memory_mib": 0, "vcpus": 0, "memory_manager": "none",
              "xgates": False, "ram_file": "", "pod_share": "", "network": "",
              "net_record": "", "vmm": "qemu", "control": {}}

    engine: str  # "kvm" or "tcg"
    memory_mib: int  # guest RAM at boot
    vcpus: int
    memory_manager: str  # "pager", "balloon" or "none"
    xgates: bool
    ram_file: str  # the guest-RAM file on the host
    pod_share: str  # a pod sandbox's share directory; "" for any other VM
    network: str  # the network plan's mode (paracell/net/netns.py)
    net_record: str  # which veths the shim mirrors (paracell/net/device.py)
    vmm: str  # the backend's name in the registry (paracell/vmm/backends.py)
    # How the backend reaches the VM again (Backend.attach_control): its own
    # record, read by no one else; empty for a pod member, which has no VM.
    control: dict[str, str]
