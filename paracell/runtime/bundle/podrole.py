"""What a container's annotations say about its pod: whether it is a pod's
sandbox, a member of one (and which), or neither, and the pod's memory.

containerd's CRI plugin says which container is a pod's sandbox (the pause
container) and which belong to it; runtime/pod/ places a member in its pod's VM."""

from __future__ import annotations

from dataclasses import dataclass

from paracell.errors import ParacellError
from paracell.runtime.state.ids import check_id

CONTAINER_TYPE = "io.kubernetes.cri.container-type"
# CRI-O's, which podman gives the containers of its pods (a VM per container).
CRIO_CONTAINER_TYPE = "io.kubernetes.cri-o.ContainerType"
SANDBOX_ID = "io.kubernetes.cri.sandbox-id"
# Set by containerd releases that pass the pod's limits down (1.7 on).
SANDBOX_MEMORY = "io.kubernetes.cri.sandbox-memory"


@dataclass(frozen=True)
class PodRole:
    """The one decision about a container's pod, from its annotations."""

    kind: str  # "sandbox", "member" or "none"
    sandbox_id: str = ""
    # A container in a pod whose network namespace another VM holds: podman's
    # pods (CRI-O's annotation), whose containers each get a VM of their own.
    in_pods_network: bool = False


def role(annotations: dict[str, str], container_id: str) -> PodRole:
    kind = annotations.get(CONTAINER_TYPE)
    if kind is None:
        return PodRole("none", in_pods_network=annotations.get(CRIO_CONTAINER_TYPE) == "container")
    if kind == "sandbox":
        return PodRole("sandbox")
    if kind != "container":
        raise ParacellError(f"invalid annotation {CONTAINER_TYPE}={kind!r}: "
                            "expected sandbox or container")
    sandbox = annotations.get(SANDBOX_ID, "")
    if not sandbox:
        raise ParacellError(f"annotation {SANDBOX_ID} is required with {CONTAINER_TYPE}=container")
    check_id(sandbox)
    if sandbox == container_id:
        raise ParacellError(f"container {container_id} names itself as its pod's sandbox")
    return PodRole("member", sandbox)


# What kubelet's hostNetwork, hostIPC and hostPID look like in the sandbox's
# spec: the namespace's entry is left out, so the pause container would share
# the host's. A pod's VM has its own kernel; it cannot share any of them.
HOST_NAMESPACES = {"network": "host network", "ipc": "host IPC", "pid": "host PID"}


def refuse_host_namespaces(namespaces: dict[str, str]) -> None:
    """A pod that asks for the host's network, IPC or PID namespace fails at
    RunPodSandbox instead of running cut off (docs/runtime.md)."""
    from paracell.runtime.bundle import spec

    wanted = [name for kind, name in HOST_NAMESPACES.items() if kind not in namespaces
              or (kind == "network" and namespaces[kind] and spec.is_host_netns(namespaces[kind]))]
    if wanted:
        raise ParacellError(f"{', '.join(wanted)} is not supported by a VM runtime: "
                            "the pod's VM has its own kernel (remove hostNetwork, hostIPC "
                            "and hostPID, or use another RuntimeClass)")


def pod_memory_mib(annotations: dict[str, str], default_mib: int) -> int:
    """The pod's memory limit when containerd passes it, else the default."""
    raw = annotations.get(SANDBOX_MEMORY, "")
    if not raw or raw == "0":
        return default_mib
    if not raw.isdigit() or len(raw) > 20:
        raise ParacellError(f"invalid annotation {SANDBOX_MEMORY}={raw[:40]!r}: not a byte count")
    mib = -(-int(raw) // (1 << 20))
    if not 64 <= mib <= 65536:
        raise ParacellError(f"pod memory limit of {mib} MiB is outside 64..65536")
    return mib
