"""What every verb is called with: the state root, the log, and the global
flags that change how a container is made."""

from __future__ import annotations

from dataclasses import dataclass

from paracell.log import RuntimeLog
from paracell.runtime.state.store import StateStore

TYPE_CHECKING = False
if TYPE_CHECKING:
    from paracell.vmm.hypervisor import Backend


@dataclass
class Context:
    root: str
    log: RuntimeLog
    engine_flag: str | None = None  # --engine
    memory_manager: str | None = None  # the global flag; see runtime/vm/memorymanager.py
    systemd_cgroup: bool = False  # --systemd-cgroup; see runtime/host/cgroups/
    no_template: bool = False  # --no-template; see runtime/vm/templating.py
    vmm_flag: str | None = None  # --vmm; see paracell/vmm/backends.py
    libvirt_uri_flag: str | None = None  # --libvirt-uri: where a daemon backend is
    # The container's stdio (fds) for the host processes a verb spawns, or
    # None for the caller's own fds 0-2: the CLI is called with them, and
    # containerd's shim v2 (paracell/shimv2/) opens its FIFOs instead.
    stdio: tuple[int, int, int] | None = None

    @property
    def engine(self) -> str:
        """Resolved when a verb needs it: a bad settings file must not stop
        the verbs that never use it (state, kill, list, delete)."""
        from paracell import settings

        return self.engine_flag or settings.engine_override() or "auto"

    def backend(self, annotations: dict[str, str]) -> Backend:
        """The backend for a new VM (paracell/vmm/backends.py): the annotation
        for its container, then the flag, then the environment and the file."""
        from paracell.vmm import backends

        cls = backends.backend_class(backends.requested(annotations, self.vmm_flag))
        return cls(self.location_of(cls))

    def location_of(self, cls: type[Backend]) -> str:
        """Where a daemon backend is: --libvirt-uri, then the environment and
        the file, then the backend's default; nothing for one that is no daemon."""
        from paracell import settings

        if not cls.default_location:
            return ""
        return self.libvirt_uri_flag or settings.libvirt_uri_override() or cls.default_location

    @property
    def store(self) -> StateStore:
        return StateStore(self.root)
