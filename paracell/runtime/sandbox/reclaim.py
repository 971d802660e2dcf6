"""Cleanup of everything a container's state records (paracell/reclaim.py):
the VM's devices, its network interfaces, and a pod member's directory."""

from __future__ import annotations

from typing import Any


def reclaim(records: list[dict[str, Any]]) -> None:
    # Importing the modules registers their kinds.
    import paracell.net.device  # noqa: F401
    import paracell.runtime.sandbox.memberdir  # noqa: F401
    import paracell.vmm.devices  # noqa: F401
    from paracell.reclaim import reclaim_all

    if any(r.get("kind") == "libvirt-domain" for r in records if isinstance(r, dict)):
        import paracell.vmm.libvirt  # noqa: F401  (only then: delete must start fast)

    reclaim_all(records)
