"""A pooled container's network namespace (runtime/pod/pooled.py, "The
network"): its proxy sits there as a VM's own shim would, lends the pooled
VM's shim its port forwarding listeners, and at `start` its relay moves the
pooled VM's spare there and mirrors the namespace's interfaces onto it
(paracell/net/late.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from paracell.runtime import poolwire

TYPE_CHECKING = False
if TYPE_CHECKING:
    from paracell.log import RuntimeLog
    from paracell.net.device import Spare
    from paracell.net.netns import NetworkPlan
    from paracell.runtime.bundle.spec import Bundle
    from paracell.runtime.state.store import StateStore


@dataclass
class PooledNetwork:
    """A pooled container's network namespace (the module's docstring), in
    which its proxy sits, and the record that lends it the pooled VM's
    spares at `start`."""

    plan: NetworkPlan
    record: Path
    # The pooled VM's spares, where its shim holds them.
    spares: list[Spare]
    spares_at: str
    spares_at_id: tuple[int, int] | None
    log: RuntimeLog

    @classmethod
    def of(cls, store: StateStore, container_id: str, bundle: Bundle, vm_id: str,
           log: RuntimeLog) -> PooledNetwork | None:
        """None for a container that has no network namespace of its own
        (the host's, which no VM shares: lo only, as for a VM of its own)."""
        from paracell.net import device, netns

        plan = netns.plan(bundle.namespaces, False)
        if plan.mode == netns.HOST:
            return None
        vm = store.load(vm_id)
        spares = device.Record.read(Path(vm.vm.config.net_record)).spares \
            if vm.vm.config.net_record else []
        where = f"/proc/{vm.shim_pid}/ns/net"
        return cls(plan, store.dir(container_id) / device.RECORD_FILE, spares, where,
                   netns.identity_of(where), log)

    def enter(self, lease_fd: int) -> None:
        """In the proxy, while it is the only thread: into the namespace, and
        the record written there, which says which one it is. Port
        forwarding's listeners are made there too, as a VM's own shim makes
        them, and go to the pooled VM's shim, which serves them, on its lease."""
        from paracell.net import device, netns, portforward

        netns.enter(self.plan)
        device.Record(spares=self.spares,
                      netns=netns.identity_of("/proc/thread-self/ns/net"),
                      spares_at=self.spares_at, spares_at_id=self.spares_at_id
                      ).write(self.record)
        forward = portforward.start(self.plan, self.log)
        if forward is not None:
            try:
                poolwire.lend_port_forwarding(lease_fd, forward.fds())
            finally:
                forward.detach()

    def reclaim_record(self) -> dict[str, str]:
        """For `delete`: the mirrors on the namespace's interfaces, taken off
        (a namespace of the proxy's own went with it)."""
        from paracell.net import device, netns

        where = self.plan.path if self.plan.mode == netns.JOIN else ""
        return {"kind": device.NetworkInterfaces.kind, "netns": where, "record": str(self.record)}
