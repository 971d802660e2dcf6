"""Whether a guest started here gets PKU, which XGates need.

QEMU's TCG emulates PKU/OSPKE with `-cpu max`; under KVM the guest runs with
`-cpu host` and gets PKU only where the host CPU has it."""

from __future__ import annotations

from dataclasses import dataclass

from paracell.vmm.probe import HostFacts


@dataclass(frozen=True)
class XgatesSupport:
    supported: bool
    reason: str
    engine: str | None = None  # the engine it was asked for


def support(engine: str | None, facts: HostFacts) -> XgatesSupport:
    """`engine` is the engine a container would get ("kvm", "tcg"), None when none can run."""
    if facts.qemu_path is None:
        return XgatesSupport(False, "no QEMU, so no guest", engine)
    if engine == "tcg":
        return XgatesSupport(True, "QEMU TCG with -cpu max gives the guest PKU/OSPKE", engine)
    if engine == "kvm":
        if facts.host_pku:
            return XgatesSupport(True, "KVM with -cpu host passes on the host CPU's pku", engine)
        return XgatesSupport(False, "KVM guests get PKU only from the host CPU, which lacks pku",
                             engine)
    return XgatesSupport(False, "no engine can run a guest here", engine)
