"""Port forwarding: loopback connections in the VM's network namespace on the
host reach the guest's loopback (docs/networking.md, "Port forwarding").

containerd's CRI PortForward (`kubectl port-forward`) enters the pod's network
namespace on the host and dials localhost:PORT there, as it would for a runc
pod. The shim attaches a BPF sk_lookup program to that namespace which hands
every TCP connection to 127.0.0.1 or ::1, on any port, to a listener of the
shim (csrc/portfwd.c); the shim's C relay carries each one over the agent
channel to a connection the agent opens to the same address and port in the
guest (csrc/streams.c, guest/agent/portfwd.c). The kernel detaches the program
when the shim's last fd of it closes, so it never outlives the shim, which
is why `delete` has nothing to remove here even after a killed shim.

Only a VM that holds its namespace's network gets it: a namespace the spec
names (a pod's sandbox, a container that podman or CNI gave a namespace) or
one of the shim's own. Never the host's, whose loopback is the host's own,
and never a podman pod's app container, whose namespace is its infra VM's.
"""

from __future__ import annotations

import os
from typing import Any

from paracell.errors import ParacellError
from paracell.net.netns import JOIN, NEW, NetworkPlan

TYPE_CHECKING = False
if TYPE_CHECKING:
    from paracell.log import RuntimeLog


class PortForward:
    """The listeners and the steering, made in the shim's network namespace."""

    def __init__(self, listeners: Any) -> None:
        self.listeners = listeners  # struct pc_fwd_listeners *, which the relay reads

    @classmethod
    def attach(cls) -> PortForward:
        """In the calling thread's network namespace; ParacellError in one line."""
        from paracell._native import ffi, lib

        listeners = ffi.new("struct pc_fwd_listeners *")
        err = ffi.new("char[]", 256)
        if lib.pc_fwd_attach(listeners, err, len(err)) < 0:
            raise ParacellError(ffi.string(err).decode("utf-8", "replace"))
        return cls(listeners)

    def fds(self) -> list[int]:
        """listen4, listen6 where the namespace has IPv6, then the link: as a
        pooled VM's lease carries them (csrc/relay.h, PC_LEASE_FORWARD_*)."""
        listeners = self.listeners
        return [fd for fd in (listeners.listen4, listeners.listen6, listeners.link) if fd >= 0]

    def detach(self) -> None:
        """Idempotent: connections are refused again from here on."""
        from paracell._native import lib

        lib.pc_fwd_detach(self.listeners)


def wanted(network: NetworkPlan) -> bool:
    return network.mode in (JOIN, NEW)


def start(network: NetworkPlan, log: RuntimeLog) -> PortForward | None:
    """The shim's port forwarding, or None: a VM whose namespace is not its
    own gets none, and one whose kernel refuses the program runs without it
    (a warning in --log), since nothing else of the container depends on it."""
    if not wanted(network):
        return None
    try:
        forward = PortForward.attach()
    except ParacellError as err:
        log.warning(f"{err}: connections to 127.0.0.1 and ::1 in the container's network "
                    "namespace do not reach the VM")
        return None
    return forward


def attached_links(netns_path: str) -> int:
    """sk_lookup programs attached to the network namespace at netns_path
    (anyone's): for tests and diagnostics."""
    from paracell._native import ffi, lib

    fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        count = lib.pc_fwd_count_links(fd)
    finally:
        os.close(fd)
    if count < 0:
        raise ParacellError(f"listing BPF links: {os.strerror(ffi.errno)}")
    return count
