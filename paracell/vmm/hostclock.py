"""The host TSC rate for TCG guests (see csrc/hostclock.h), measured once per
host boot and cached, so a create pays for it once."""

from __future__ import annotations

import contextlib
import json
import os

from paracell import settings

SAMPLE_MS = 20


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def tsc_khz() -> int:
    """0 where the host has no usable TSC: the guest then calibrates as before."""
    from paracell._native import lib

    cache = settings.cache_dir() / "host-tsc.json"
    boot = _boot_id()
    try:
        record = json.loads(cache.read_text())
        if record.get("boot_id") == boot and isinstance(record.get("khz"), int):
            return int(record["khz"])
    except (OSError, ValueError):
        pass
    khz = int(lib.pc_tsc_khz(SAMPLE_MS))
    if boot:
        # Only a speed-up: a cache that cannot be written costs the next
        # create another 20 ms, never the create itself.
        tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({"boot_id": boot, "khz": khz}))
            os.replace(tmp, cache)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
    return khz
