"""Cleanup of everything a container's state records (paracell/reclaim.py):
the VM's devices, its backend's own resources, its network interfaces, and a
pod member's directory."""

from __future__ import annotations

from typing import Any


def reclaim(records: list[dict[str, Any]]) -> None:
    # Importing the modules registers their kinds; a backend's only when a
    # record names one of its kinds (delete must start fast).
    import paracell.net.device  # noqa: F401
    import paracell.runtime.vm.memberdir  # noqa: F401
    import paracell.vmm.devices  # noqa: F401
    from paracell.reclaim import reclaim_all
    from paracell.vmm import backends

    backends.register_reclaimers(records)
    reclaim_all(records)
