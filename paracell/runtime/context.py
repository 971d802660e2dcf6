"""What every verb is called with: the state root, the log, and the global
flags that change how a container is made."""

from __future__ import annotations

from dataclasses import dataclass

from paracell.runtime.log import RuntimeLog
from paracell.runtime.state.store import StateStore


@dataclass
class Context:
    root: str
    log: RuntimeLog
    engine_flag: str | None = None  # --engine
    memory_manager: str | None = None  # the global flag; see runtime/sandbox/memorymanager.py
    systemd_cgroup: bool = False  # --systemd-cgroup; see runtime/host/cgroups/
    no_template: bool = False  # --no-template; see runtime/sandbox/templating.py

    @property
    def engine(self) -> str:
        """Resolved when a verb needs it: a bad settings file must not stop
        the verbs that never use it (state, kill, list, delete)."""
        from paracell import settings

        return self.engine_flag or settings.engine_override() or "auto"

    @property
    def store(self) -> StateStore:
        return StateStore(self.root)
