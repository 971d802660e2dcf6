"""`paracell sandbox checkpoint|rollback|checkpoints|rm-checkpoint`: a
snapshot-mode sandbox's checkpoints (docs/snapshots.md). The shim does the
work (paracell/sandbox/service.py); these verbs ask it, and `checkpoints`
reads the store."""

from __future__ import annotations

import json
import time
from typing import Any

from paracell.errors import ParacellError
from paracell.runtime.context import Context
from paracell.runtime.state import status
from paracell.sandbox import client
from paracell.sandbox.checkpoints import CheckpointStore, check_name


def _running(ctx: Context, container_id: str, verb: str) -> Any:
    state = ctx.store.load(container_id)  # its status settled against the live processes
    status.transition(verb, state.status, container_id)
    return ctx.store.dir(container_id)


def checkpoint(ctx: Context, container_id: str, name: str | None) -> dict[str, Any]:
    if name is not None:
        check_name(name)
    return client.ask(_running(ctx, container_id, "checkpoint"), container_id, "checkpoint",
                      name=name)


def rollback(ctx: Context, container_id: str, name: str) -> dict[str, Any]:
    check_name(name)
    return client.ask(_running(ctx, container_id, "rollback"), container_id, "rollback",
                      name=name)


def remove(ctx: Context, container_id: str, name: str) -> dict[str, Any]:
    check_name(name)
    state_dir = ctx.store.dir(container_id)
    ctx.store.load(container_id)
    if not (CheckpointStore(state_dir).dir / name).is_dir():
        raise ParacellError(f"container {container_id} has no checkpoint {name!r}")
    return client.ask(state_dir, container_id, "remove", name=name)


def listing(ctx: Context, container_id: str, fmt: str) -> str:
    ctx.store.load(container_id)
    found = CheckpointStore(ctx.store.dir(container_id)).all()
    rows = [{"name": c.name, "seq": c.seq, "parent": c.parent, "created": c.created,
             "pages_saved": c.pages_saved, "bytes": c.pages_saved * 4096} for c in found]
    if fmt == "json":
        return json.dumps(rows)
    lines = [f"{'NAME':<24} {'SEQ':>4} {'PARENT':>6} {'SAVED':>10}  CREATED"]
    for r in rows:
        when = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(r["created"]))
        lines.append(f"{r['name']:<24} {r['seq']:>4} {r['parent'] or '-':>6} "
                     f"{r['bytes'] / 2**20:>8.1f}Mi  {when}")
    return "\n".join(lines)
