"""A pod member's directory in its pod's share: not attached to the VM (the
share is), but bound in on the host, so it is recorded in the member's state
and `delete` unbinds it even after a crash."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paracell.reclaim import Reclaimable, reclaimable
from paracell.vmm import hostshare


@reclaimable
class PodMemberDir(Reclaimable):
    kind = "pod-member"

    @classmethod
    def record(cls, directory: Path) -> dict[str, str]:
        return {"kind": cls.kind, "dir": str(directory)}

    @classmethod
    def reclaim(cls, facts: dict[str, Any]) -> None:
        hostshare.remove_tree(Path(facts["dir"]))
