"""Asks a snapshot-mode container's shim for a checkpoint operation
(paracell/runtime/snapshots/service.py): one request on its `snap.sock`, one answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from paracell import unixsock
from paracell.errors import ParacellError
from paracell.runtime.snapshots import service

# A checkpoint of a large guest, or a rollback far back, can take seconds
# under TCG; the shim finishes it even if we stop waiting.
ANSWER_TIMEOUT_S = 300.0


def ask(state_dir: Path, container_id: str, op: str, **args: Any) -> dict[str, Any]:
    path = state_dir / service.SOCKET
    try:
        sock = unixsock.connect(path)
    except FileNotFoundError:
        raise ParacellError(f"container {container_id} is not in snapshot mode (it needs the "
                            "annotation io.paracell.snapshot: \"on\" at create)") from None
    except OSError as err:
        raise ParacellError(f"container {container_id}: its checkpoint service: "
                            f"{err.strerror}") from None
    with sock:
        sock.settimeout(ANSWER_TIMEOUT_S)
        try:
            sock.sendall(service.request(op, **args))
            data = b""
            while not data.endswith(b"\n") and len(data) <= service.MAX_LINE * 4:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except (TimeoutError, OSError) as err:
            raise ParacellError(f"container {container_id}: its checkpoint service: "
                                f"{err}") from None
    try:
        reply = json.loads(data)
    except ValueError:
        raise ParacellError(f"container {container_id}: its checkpoint service gave no "
                            "answer (the container may have stopped)") from None
    if not isinstance(reply, dict):
        raise ParacellError(f"container {container_id}: a malformed answer")
    if not reply.get("ok"):
        raise ParacellError(str(reply.get("error", "the operation failed"))[:500])
    reply.pop("ok", None)
    return reply
