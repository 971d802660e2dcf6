"""Which memory manager a container's VM gets, and the guest knobs it sets.

`pager` (the default wherever it works), `balloon` (virtio-balloon free page
reporting, the mainstream answer) or `none` (RunV's behaviour: guest RAM
stays allocated once touched). All three boot the same guest kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paracell import settings
from paracell.errors import ParacellError

MANAGERS = settings.MEMORY_MANAGERS
ANNOTATION = "io.paracell.memory-manager"
# Per-container tuning of the Pager, for containerd callers and the tests;
# each maps to one guest kernel parameter, bounded here.
KNOB_ANNOTATIONS = {
    "io.paracell.pager.delay-ms": ("page_reporting.delay_ms", 0, 60000),
    "io.paracell.pager.order": ("paracell_pager.order", 1, 10),
    "io.paracell.pager.reserve-kb": ("paracell_pager.reserve_kb", 0, 1 << 20),
    "io.paracell.pager.bind-batch-kb": ("paracell_pager.bind_batch_kb", 0, 1 << 20),
    "io.paracell.pager.churn-max-delay-ms": ("paracell_pager.churn_max_delay_ms", 0, 60000),
    "io.paracell.pager.min-free-age-ms": ("paracell_pager.min_free_age_ms", 0, 60000),
    "io.paracell.pager.min-free-age-batch-kb": ("paracell_pager.min_free_age_batch_kb", 0,
                                                1 << 20),
    "io.paracell.pager.split-bind-kb": ("paracell_pager.split_bind_kb", 0, 4096),
    "io.paracell.pager.burst-late-kb": ("paracell_pager.burst_late_kb", 0, 1 << 20),
    "io.paracell.pager.testing": ("paracell_pager.testing", 0, 1),
}
# Reclaim within tens of milliseconds of a free, in 8 KiB blocks, keeping
# 2 MiB bound for the next burst. docs/pager.md has the measurements behind
# these values, 2 MiB blocks (order 9) among them.
DEFAULT_KNOBS = {
    "page_reporting.delay_ms": 10,
    "paracell_pager.order": 1,
    "paracell_pager.reserve_kb": 2048,
    "paracell_pager.bind_batch_kb": 2048,
}


@dataclass(frozen=True)
class MemoryPlan:
    manager: str
    kernel_knobs: dict[str, int] = field(default_factory=dict)


def _parse_knob(key: str, raw: str) -> int:
    _, low, high = KNOB_ANNOTATIONS[key]
    if not (isinstance(raw, str) and raw.isascii() and raw.isdigit() and len(raw) <= 10):
        raise ParacellError(f"annotation {key}: {raw!r} is not a whole number")
    value = int(raw)
    if not low <= value <= high:
        raise ParacellError(f"annotation {key}: {value} is outside {low}..{high}")
    return value


def choose(flag: str | None, configured: str | None, annotations: dict[str, str],
           memory_mib: int) -> MemoryPlan:
    """The annotation wins for its container, then the global flag, then the
    config file; unset, the Pager wherever it can serve the guest."""
    from paracell.pager.server import MAX_RAM_BYTES

    requested = annotations.get(ANNOTATION) or flag or configured
    if requested is not None and requested not in MANAGERS:
        raise ParacellError(f"unknown memory manager {requested!r}: "
                            f"expected one of {', '.join(MANAGERS)}")
    manager = requested or ("pager" if memory_mib << 20 <= MAX_RAM_BYTES else "balloon")
    if manager == "pager" and memory_mib << 20 > MAX_RAM_BYTES:
        raise ParacellError(f"the Pager serves guests of up to {MAX_RAM_BYTES >> 20} MiB, "
                            f"not {memory_mib} MiB: use the balloon or none memory manager")
    knobs: dict[str, int] = {}
    if manager == "pager":
        knobs = dict(DEFAULT_KNOBS)
        for key, (param, _, _) in KNOB_ANNOTATIONS.items():
            if key in annotations:
                knobs[param] = _parse_knob(key, annotations[key])
    else:
        stray = sorted(k for k in annotations if k in KNOB_ANNOTATIONS)
        if stray:
            raise ParacellError(f"annotation {stray[0]} needs the pager memory manager, "
                                f"not {manager}")
    return MemoryPlan(manager, knobs)
