"""OCI hooks. Host-side hooks run here with the state on stdin; the
container-side ones (createContainer, startContainer) would have to run inside
the guest, which the agent cannot do yet, so such a bundle is refused at create
instead of having its hooks skipped."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from paracell.errors import ParacellError

HOST_HOOKS = ("prestart", "createRuntime", "poststart", "poststop")
GUEST_HOOKS = ("createContainer", "startContainer")
MAX_HOOKS = 64


def check_hooks(config: dict[str, Any]) -> None:
    hooks = config.get("hooks") or {}
    if not isinstance(hooks, dict):
        raise ParacellError("invalid config.json: hooks must be an object")
    for name, entries in hooks.items():
        if name not in HOST_HOOKS + GUEST_HOOKS:
            raise ParacellError(f"invalid config.json: unknown hook kind {name!r}")
        if not isinstance(entries, list) or len(entries) > MAX_HOOKS:
            raise ParacellError(f"invalid config.json: hooks.{name} must be a list")
        for i, hook in enumerate(entries):
            if not isinstance(hook, dict) or not isinstance(hook.get("path"), str):
                raise ParacellError(f"invalid config.json: hooks.{name}[{i}].path is required")
            for key in ("args", "env"):
                value = hook.get(key, [])
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise ParacellError(f"invalid config.json: hooks.{name}[{i}].{key}")
            timeout = hook.get("timeout", 1)
            if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout <= 0:
                raise ParacellError(f"invalid config.json: hooks.{name}[{i}].timeout")
        if name in GUEST_HOOKS and entries:
            raise ParacellError(
                f"{name} hooks must run inside the container, which paracell's guest "
                "agent does not support yet"
            )


def run_hooks(hooks: dict[str, Any], name: str, state: dict[str, Any]) -> None:
    """Runs the spec's `hooks` object's entries for `name`, checked by check_hooks."""
    for i, hook in enumerate(hooks.get(name, [])):
        args = hook.get("args") or [hook["path"]]
        timeout = hook.get("timeout")
        try:
            result = subprocess.run(
                args, executable=hook["path"], input=json.dumps(state).encode(),
                env=dict(e.split("=", 1) for e in hook.get("env", []) if "=" in e),
                capture_output=True, timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise ParacellError(f"{name} hook #{i} timed out after {timeout}s") from None
        except OSError as err:
            raise ParacellError(f"{name} hook #{i} ({hook['path']}): {err.strerror}") from None
        if result.returncode != 0:
            detail = result.stderr.decode(errors="replace").strip().splitlines()[-1:]
            raise ParacellError(
                f"{name} hook #{i} failed with status {result.returncode}: {' '.join(detail)}"
            )
