"""Reading a process's capability sets as the container sees them."""

from __future__ import annotations

CAP_FIELDS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")
# Run inside the container: its own sets, one line each.
SHOW_CAPS = "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status"
NO_CAPS = dict.fromkeys(CAP_FIELDS, 0)


def cap_masks(text: str) -> dict[str, int]:
    """`CapBnd:\\t000001ff...` lines as field -> mask."""
    return {name.rstrip(":"): int(value, 16) for name, value in
            (line.split() for line in text.splitlines() if line.startswith("Cap"))}
