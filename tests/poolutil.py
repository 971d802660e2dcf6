"""`paracell pool serve` for the end-to-end tests: a pool on the root that
containerd's shim gives ParaCell, started, waited for, and stopped."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import PARACELL

WAIT_S = 180.0


@dataclass
class ServingPool:
    root: Path
    env: dict[str, str] | None
    proc: subprocess.Popen[bytes]

    def status(self) -> dict:
        found = subprocess.run([PARACELL, "--root", str(self.root), "pool", "status",
                                "--format", "json"], capture_output=True, env=self.env,
                               timeout=60)
        return json.loads(found.stdout)

    def waiting(self) -> list[str]:
        return [vm["id"] for vm in self.status().get("vms", []) if vm["state"] == "waiting"]

    def stop(self) -> None:
        """SIGTERM: the pool ends the VMs it holds, and removes its files."""
        if self.proc.poll() is None:
            self.proc.terminate()
        assert self.proc.wait(timeout=60) == 0


@contextmanager
def serving(root: Path, *flags: str, env: dict[str, str] | None = None
            ) -> Iterator[ServingPool]:
    """A pool of one VM on root, with one VM waiting; stopped at the end,
    which must leave none of its own VMs or files behind."""
    root.mkdir(parents=True, exist_ok=True)
    pool = ServingPool(root, env, subprocess.Popen(
        [PARACELL, "--root", str(root), "pool", "serve", "--size", "1", *flags], env=env,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        deadline = time.monotonic() + WAIT_S
        while not pool.waiting():
            assert pool.proc.poll() is None and time.monotonic() < deadline, \
                "no VM came to wait"
            time.sleep(0.2)
        yield pool
    finally:
        pool.stop()
