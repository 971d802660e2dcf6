"""XGates at create time: whether a container asks for them, whether this host
can give them, and the vetting of its rootfs before anything is made.

Annotations (config.json) win over the operator's default (`"xgates": true` in
/etc/paracell/config.json):
  io.paracell.xgates      "on" | "off"
  io.paracell.xgates.vet  "refuse" (default) | "warn": log offences, boot anyway
                          (the guest kernel still refuses the offending mappings)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from paracell.errors import ParacellError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from paracell.log import RuntimeLog
    from paracell.xgate.support import XgatesSupport

ANNOTATION = "io.paracell.xgates"
VET_ANNOTATION = "io.paracell.xgates.vet"
SWITCH = {"on": True, "off": False}
REFUSE, WARN = "refuse", "warn"


@dataclass(frozen=True)
class XgatesPlan:
    enabled: bool
    vet: str  # REFUSE or WARN
    source: str  # where `enabled` came from, for error messages


def plan(annotations: dict[str, str]) -> XgatesPlan:
    from paracell import settings

    raw = annotations.get(ANNOTATION)
    if raw is None:
        enabled, source = settings.xgates_default(), f'"xgates" in {settings.config_path()}'
    elif raw in SWITCH:
        enabled, source = SWITCH[raw], f"annotation {ANNOTATION}"
    else:
        raise ParacellError(f'annotation {ANNOTATION} must be "on" or "off", not {raw[:40]!r}')
    vet = annotations.get(VET_ANNOTATION, REFUSE)
    if vet not in (REFUSE, WARN):
        raise ParacellError(
            f'annotation {VET_ANNOTATION} must be "{REFUSE}" or "{WARN}", not {vet[:40]!r}'
        )
    return XgatesPlan(enabled, vet, source)


def admit(xgates: XgatesPlan, here: XgatesSupport | None, rootfs: Path,
          log: RuntimeLog) -> None:
    """The whole admission, once per create: XGates asked for where the
    guest cannot have PKU are refused, never run without (`here` is None for
    a VM that exists already, admitted at its own create); then the rootfs
    is vetted."""
    if not xgates.enabled:
        return
    if here is not None and not here.supported:
        raise ParacellError(f"XGates requested ({xgates.source}) but unsupported with "
                            f"engine {here.engine}: {here.reason}")
    vet_rootfs(xgates, rootfs, log)


def vet_rootfs(xgates: XgatesPlan, rootfs: Path, log: RuntimeLog) -> None:
    """Refuses (or, in warn mode, logs) a rootfs whose executables the guest
    kernel would refuse to map; runs before create makes any file or process."""
    from paracell import settings
    from paracell.xgate import report, vet, vetcache

    if not xgates.enabled:
        return
    began = time.monotonic()
    # Files vetted clean by an earlier create, unchanged since, are not
    # scanned again (vetcache.py says why that is safe).
    with vetcache.opened(settings.vet_cache_dir(), log.warning) as cache:
        try:
            found = vet.vet_rootfs(rootfs, cache)
        except ParacellError as err:  # a tree past the vet's bounds: never a silent pass
            if xgates.vet != WARN:
                raise ParacellError(f"XGates: rootfs not vetted: {err}") from None
            log.warning(f"xgates vet (warn): rootfs not vetted: {err}")
            return
        unsaved = cache.save()
    if unsaved:
        log.warning(f"xgates vet cache: {unsaved}")
    log.info(f"xgates vet of {rootfs}: {found.elf_files} ELF files ({found.cached} known "
             f"clean from the cache) in {time.monotonic() - began:.2f}s, "
             f"{len(found.offences)} offences")
    for path, note in found.notes:
        log.info(f"xgates vet: {path}: {note}")
    offences = found.offences
    if not offences:
        return
    if xgates.vet == WARN:
        for finding in offences:
            log.warning(f"xgates vet (warn): {report.finding_line(finding, finding.inside)}")
        return
    first = offences[0]
    more = f"; {len(offences) - 1} more offence(s)" if len(offences) > 1 else ""
    raise ParacellError(
        f"XGates: rootfs file {first.inside} has {first.instruction} at offset "
        f"{first.offset:#x}, outside the kernel's gate page{more}; refused "
        f"(`paracell xgate vet` lists them; {VET_ANNOTATION}: {WARN} boots anyway)"
    )
