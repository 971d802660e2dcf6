"""Helpers of the snapshot-mode tests: a container whose init fills memory
with a pattern it can report on (memfill.c), and the verbs they drive."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.conftest import wait_status

SNAPSHOT = {"io.paracell.snapshot": "on"}

def snapshot_bundle(make_bundle, rootfs: Path, args: list[str], **annotations: str) -> Path:
    def mutate(config: dict) -> None:
        config["annotations"] = dict(SNAPSHOT, **annotations)
    return make_bundle(args, rootfs=rootfs, readonly=False, mutate=mutate)


def report(runtime, cid: str) -> dict[str, str]:
    result = runtime("exec", cid, "cat", "/report", check=True)
    return dict(part.split("=", 1) for part in result.stdout.decode().split())


def wait_seed(runtime, cid: str, seed: int) -> dict[str, str]:
    deadline = time.monotonic() + 60
    while True:
        # The first /report comes once the whole buffer is filled.
        first = runtime("exec", cid, "test", "-e", "/report").returncode == 0
        got = report(runtime, cid) if first else {"seed": "none yet"}
        if got["seed"] == str(seed):
            return got
        assert time.monotonic() < deadline, f"seed never became {seed}: {got}"
        time.sleep(0.1)


def bump(runtime, cid: str, to: int) -> dict[str, str]:
    runtime("kill", cid, "USR1", check=True)
    return wait_seed(runtime, cid, to)


def checkpoint(runtime, cid: str, name: str | None = None) -> dict:
    args = ["sandbox", "checkpoint", "-f", "json", cid] + (["--name", name] if name else [])
    result = runtime(*args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def rollback(runtime, cid: str, name: str) -> None:
    result = runtime("sandbox", "rollback", cid, name)
    assert result.returncode == 0, result.stderr


def started(runtime, make_bundle, rootfs: Path, cid: str, mib: int = 16, **annotations: str):
    bundle = snapshot_bundle(make_bundle, rootfs, ["memfill", str(mib)], **annotations)
    runtime("run", "--detach", "--bundle", str(bundle), cid, check=True)
    wait_status(runtime, cid, "running")
    return wait_seed(runtime, cid, 1)
