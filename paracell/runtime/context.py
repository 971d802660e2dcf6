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
    vmm_flag: str | None = None  # --vmm; see paracell/vmm/hypervisor.py
    libvirt_uri_flag: str | None = None  # --libvirt-uri

    @property
    def engine(self) -> str:
        """Resolved when a verb needs it: a bad settings file must not stop
        the verbs that never use it (state, kill, list, delete)."""
        from paracell import settings

        return self.engine_flag or settings.engine_override() or "auto"

    def vmm(self, annotations: dict[str, str]) -> str:
        """The backend for a new VM: the annotation for its container, then
        the flag, then the environment and the file; direct QEMU by default."""
        from paracell import settings
        from paracell.vmm.hypervisor import ANNOTATION, BACKENDS, DEFAULT_BACKEND

        requested = annotations.get(ANNOTATION)
        if requested is not None and requested not in BACKENDS:
            from paracell.errors import ParacellError

            raise ParacellError(f"annotation {ANNOTATION}: unknown vmm {requested[:32]!r}: "
                                f"expected one of {', '.join(BACKENDS)}")
        return requested or self.vmm_flag or settings.vmm_override() or DEFAULT_BACKEND

    @property
    def libvirt_uri(self) -> str:
        from paracell import settings
        from paracell.vmm.libvirt.connection import DEFAULT_URI

        return self.libvirt_uri_flag or settings.libvirt_uri_override() or DEFAULT_URI

    @property
    def store(self) -> StateStore:
        return StateStore(self.root)
