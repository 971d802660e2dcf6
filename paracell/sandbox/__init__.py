"""Checkpoint, roll back and fork a running snapshot-mode sandbox from Python
(docs/snapshots.md), for agent frameworks: the same operations as
`paracell sandbox ...`, without a process start per call.

    from paracell.sandbox import Sandbox

    box = Sandbox("agent-1")            # created with io.paracell.snapshot: "on"
    box.checkpoint("before-tool")       # {"name": ..., "paused_s": ..., ...}
    ...                                 # the agent tries something
    box.rollback("before-tool")         # memory, processes and files as they were
    box.fork("before-tool", count=4)    # ["agent-1-fork-1", ...]: four tries at once
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paracell.settings import DEFAULT_ROOT


class Sandbox:
    """A snapshot-mode container, by its id and state root (runc's --root)."""

    def __init__(self, container_id: str, root: str = DEFAULT_ROOT) -> None:
        import os

        self.id, self.root = container_id, os.path.abspath(root)

    def _ctx(self) -> Any:
        from paracell.log import RuntimeLog
        from paracell.runtime.context import Context

        return Context(root=self.root, log=RuntimeLog(None, "text", False))

    def checkpoint(self, name: str | None = None) -> dict[str, Any]:
        """Pauses, saves what changed since the last checkpoint, resumes."""
        from paracell.runtime.verbs import snapshot

        return snapshot.checkpoint(self._ctx(), self.id, name)

    def rollback(self, name: str) -> dict[str, Any]:
        """Back to a checkpoint; open exec sessions end (status 137)."""
        from paracell.runtime.verbs import snapshot

        return snapshot.rollback(self._ctx(), self.id, name)

    def fork(self, name: str | None = None, count: int = 1,
             id_prefix: str | None = None) -> list[str]:
        """COUNT new sandboxes that go on from the checkpoint (or from now)."""
        from paracell.runtime.verbs import snapshot

        return snapshot.fork(self._ctx(), self.id, name, count, id_prefix)

    def checkpoints(self) -> list[dict[str, Any]]:
        import json

        from paracell.runtime.verbs import snapshot

        return json.loads(snapshot.listing(self._ctx(), self.id, "json"))

    def remove(self, name: str) -> None:
        from paracell.runtime.verbs import snapshot

        snapshot.remove(self._ctx(), self.id, name)

    @property
    def state_dir(self) -> Path:
        return Path(self.root) / self.id
