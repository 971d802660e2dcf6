"""`paracell template build|list|rm`: VM templates by hand (docs/templates.md).

Creates make and use templates by themselves; these verbs build one ahead of
the first create, show what the store holds, and remove templates.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from pathlib import Path

from paracell.errors import ParacellError
from paracell.runtime.context import Context
from paracell.vmm import templatestore

BUILD_ID = "template-build"


def build(ctx: Context, bundle: str | None) -> str:
    """Creates a container of the bundle (the example busybox bundle without
    one) in a private state root, so that its VM boots cold and is saved at
    READY, then removes it. One line: the template, or why none was made."""
    from paracell.runtime.bundle import defaultspec
    from paracell.runtime.verbs import lifecycle

    with tempfile.TemporaryDirectory(prefix="paracell-template-") as tmp:
        if bundle is None:
            bundle = str(defaultspec.example_bundle(Path(tmp) / "bundle", ["true"]))
        private = dataclasses.replace(ctx, root=str(Path(tmp) / "state"), no_template=False)
        state = lifecycle.create(private, BUILD_ID, bundle, None, None)
        try:
            outcome = state.vm.template
        finally:
            lifecycle.delete(private, BUILD_ID, force=True)
    verb, _, key = outcome.partition(" ")
    if verb == "saved":
        return f"template {key}: built"
    if verb == "restored":
        return f"template {key}: already built"
    raise ParacellError("no template was made: the bundle asks for none "
                        "(io.paracell.template), or saving failed (see --log)")


def list_templates(fmt: str) -> str:
    entries = templatestore.store().entries()
    rows = [{"key": e["key"], "last_used": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                        time.gmtime(e["used"])),
             "disk_bytes": e["disk_bytes"], **templatestore.summary(e["shape"]),
             **({"broken": e["broken"]} if "broken" in e else {})} for e in entries]
    if fmt == "json":
        return json.dumps(rows, indent=2)
    lines = [f"{'KEY':<34}{'LAST USED':<22}{'DISK':>8}  {'RAM':>6} {'VCPU':>4} "
             f"{'MANAGER':<8} {'NICS':>4}  POD"]
    for r in rows:
        if "broken" in r:
            lines.append(f"{r['key']:<34}{'-':<22}{'-':>8}  unusable: {r['broken']}")
            continue
        lines.append(f"{r['key']:<34}{r['last_used']:<22}{r['disk_bytes'] >> 20:>6}Mi  "
                     f"{r['memory_mib']:>4}Mi {r['vcpus']:>4} {r['memory_manager']:<8} "
                     f"{r['nics']:>4}  {'yes' if r['pod'] else 'no'}")
    return "\n".join(lines)


def remove(keys: tuple[str, ...], everything: bool) -> str:
    store = templatestore.store()
    if everything == bool(keys):
        raise ParacellError("template rm: give template keys, or --all")
    if everything:
        keys = tuple(e["key"] for e in store.entries())
    for key in keys:
        if not templatestore.KEY.fullmatch(key):
            raise ParacellError(f"template rm: {key[:64]!r} is not a template key")
    removed = [k for k in keys if store.remove(k)]
    missing = [k for k in keys if k not in removed]
    # --all removes what is there: a key another rm took meanwhile is not missing.
    if missing and not everything:
        raise ParacellError(f"template rm: no template {', '.join(missing)}")
    return f"removed {len(removed)} template{'s' if len(removed) != 1 else ''}"

