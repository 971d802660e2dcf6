"""What this host can run: KVM kind, PKU, QEMU, and the engine that follows."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from paracell import fileanswers, settings
from paracell.errors import ParacellError

ENGINES = settings.ENGINES
QEMU_BINARY = "qemu-system-x86_64"


@dataclass(frozen=True)
class HostFacts:
    kvm_kind: str  # "hardware", "pvm-host" or "none"
    kvm_detail: str
    host_pku: bool
    qemu_path: str | None
    qemu_version: str | None


@dataclass(frozen=True)
class EngineChoice:
    engine: str  # "kvm" or "tcg"
    reason: str
    notice: str | None  # one line for stderr when auto fell back


def _cpu_flags(cpuinfo: str) -> set[str]:
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _loaded_modules(sys_module: Path) -> set[str]:
    try:
        return {entry.name for entry in sys_module.iterdir()}
    except OSError:
        return set()


def classify_kvm(flags: set[str], modules: set[str], dev_kvm: bool) -> tuple[str, str]:
    """Hardware KVM needs VMX/SVM; kvm_pvm serves /dev/kvm without them (a PVM host)."""
    if not dev_kvm:
        return "none", "no /dev/kvm"
    if "kvm_pvm" in modules:
        return "pvm-host", "/dev/kvm is served by kvm_pvm; it needs a PVM guest kernel"
    hw = "vmx" in flags or "svm" in flags
    hw_module = modules & {"kvm_intel", "kvm_amd"}
    if hw and hw_module:
        return "hardware", f"{'vmx' if 'vmx' in flags else 'svm'} with {sorted(hw_module)[0]}"
    if hw:
        return "hardware", "vmx/svm present and /dev/kvm exists"
    return "none", "/dev/kvm exists but the CPU shows no vmx/svm"


def qemu_version(path: str) -> str | None:
    """Asked of the binary once per process and per version of the file
    (paracell/fileanswers.py)."""
    def ask() -> str | None:
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        match = re.search(r"version (\S+)", out.stdout)
        return match.group(1) if match else None

    return fileanswers.once("version", (path,), ask)


def probe_host(
    cpuinfo_path: Path = Path("/proc/cpuinfo"),
    sys_module: Path = Path("/sys/module"),
    dev_kvm: Path = Path("/dev/kvm"),
) -> HostFacts:
    try:
        flags = _cpu_flags(cpuinfo_path.read_text())
    except OSError:
        flags = set()
    kind, detail = classify_kvm(flags, _loaded_modules(sys_module), dev_kvm.exists())
    qemu = shutil.which(QEMU_BINARY)
    return HostFacts(
        kvm_kind=kind,
        kvm_detail=detail,
        host_pku="pku" in flags,
        qemu_path=qemu,
        qemu_version=qemu_version(qemu) if qemu else None,
    )


def choose_engine(requested: str, facts: HostFacts) -> EngineChoice:
    if requested not in ENGINES:
        raise ParacellError(f"unknown engine {requested!r}: use one of {', '.join(ENGINES)}")
    usable_kvm = facts.kvm_kind == "hardware" and os.access("/dev/kvm", os.R_OK | os.W_OK)
    if requested == "kvm":
        if not usable_kvm:
            raise ParacellError(f"engine kvm is not usable here: {facts.kvm_detail}")
        return EngineChoice("kvm", f"requested; {facts.kvm_detail}", None)
    if requested == "tcg":
        return EngineChoice("tcg", "requested", None)
    if usable_kvm:
        return EngineChoice("kvm", f"hardware KVM: {facts.kvm_detail}", None)
    reason = f"no usable hardware KVM ({facts.kvm_detail})"
    return EngineChoice("tcg", reason, f"paracell: {reason}; using QEMU TCG (software CPU)")


def facts_as_dict(facts: HostFacts) -> dict[str, object]:
    return asdict(facts)
