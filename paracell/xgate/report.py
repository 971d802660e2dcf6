"""How `paracell xgate vet` prints a VetReport: lines for people, JSON for tools."""

from __future__ import annotations

import json

from paracell.xgate.rule import WHY
from paracell.xgate.vet import Finding, VetReport

CLEAN, OFFENDING = 0, 1


def exit_status(report: VetReport) -> int:
    return OFFENDING if report.offences else CLEAN


def _where(finding: Finding) -> str:
    vaddr = "no vaddr" if finding.vaddr is None else f"vaddr {finding.vaddr:#x}"
    return f"offset {finding.offset:#x} ({vaddr})"


def finding_line(finding: Finding, path: str) -> str:
    verdict = "offence" if finding.offence else "info"
    why = WHY[finding.instruction.removesuffix("64")]
    return (f"{path}: {_where(finding)}: {finding.instruction} "
            f"[{finding.encoding.hex(' ')}] {verdict}: {why}")


def text(report: VetReport) -> str:
    lines = [finding_line(f, f.path) for f in report.findings]
    lines += [f"note: {path}: {what}" for path, what in report.notes]
    info = len(report.findings) - len(report.offences)
    lines.append(
        f"{len(report.offences)} offence(s), {info} for information, in {report.elf_files} "
        f"ELF file(s) among {report.entries} entries"
    )
    return "\n".join(lines)


def as_json(report: VetReport) -> str:
    return json.dumps({
        "roots": report.roots,
        "clean": not report.offences,
        "offences": len(report.offences),
        "elf_files": report.elf_files,
        "entries": report.entries,
        "findings": [f.as_dict() for f in report.findings],
        "notes": [{"path": p, "note": n} for p, n in report.notes],
    }, indent=2)
