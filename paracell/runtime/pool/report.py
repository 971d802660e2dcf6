"""`paracell pool status` and `paracell check`'s pool line: what the pool of
a --root holds and costs, asked of its daemon."""

from __future__ import annotations

import json

from paracell.errors import ParacellError
from paracell.runtime import poolwire


def ask(root: str) -> dict[str, object] | None:
    """The daemon's status, or None where no pool serves this root."""
    try:
        answer, _ = poolwire.request(root, {"status": 1})
    except (OSError, ParacellError):
        return None
    return answer


def render(status: dict[str, object] | None, root: str, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(status if status is not None else {"root": root, "serving": False},
                          indent=2)
    if status is None:
        return f"no pool serves {root} (paracell pool serve starts one)"
    vms = status.get("vms")
    vms = vms if isinstance(vms, list) else []
    kinds = status.get("kinds")
    kinds = ", ".join(str(k) for k in kinds) if isinstance(kinds, list) else ""
    lines = [f"pool of {status.get('root')}: {kinds}, {status.get('size')} of each, "
             f"budget {status.get('budget_mib')} MiB, cost {status.get('cost_mib')} MiB, "
             f"{status.get('claimed')} claimed, {status.get('available_mib')} MiB available "
             f"(ends VMs below {status.get('min_available_mib')})"]
    lines.append(f"{'ID':<28} {'KIND':<28} {'STATE':<8} {'PSS MiB':>8} {'AGE s':>7}")
    for vm in vms:
        if isinstance(vm, dict):
            lines.append(f"{vm.get('id', '')!s:<28} {vm.get('kind', '')!s:<28} "
                         f"{vm.get('state', '')!s:<8} {vm.get('cost_mib', 0)!s:>8} "
                         f"{vm.get('age_s', 0)!s:>7}")
    if status.get("last_error"):
        lines.append(f"last failure: {status['last_error']}")
    return "\n".join(lines)

