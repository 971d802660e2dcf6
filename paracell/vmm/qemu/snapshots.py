"""Snapshots under direct QEMU (paracell/vmm/hypervisor.py, Snapshots;
docs/snapshots.md): device states as internal snapshots of a qcow2 that
QEMU is handed by fd, saved and loaded in place with `x-ignore-shared`, so
that guest RAM, a shared file the caller captures and puts back, is never
in them.

Each operation is one QMP session: stop, the caller's step on guest RAM,
the snapshot job, cont. The qcow2 is made (qemu-img) and added to QEMU as
a block node the first time it is needed; QEMU keeps its own fd of it, as
its jail holds no path of the state directory.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from paracell.errors import ParacellError
from paracell.vmm.hypervisor import Snapshots
from paracell.vmm.qemu import qmp
from paracell.vmm.qemu.qmp import AwaitJob, Call, Command

JOB_TIMEOUT_S = 60.0
STORE_NODE, STORE_FDSET = "pc-vmstate", 7
SOURCE_NODE, SOURCE_FDSET = "pc-forksrc", 8
STORE_SIZE = "64M"  # virtual size of the qcow2; the device states live beside it
IGNORE_SHARED = Command("migrate-set-capabilities", {
    "capabilities": [{"capability": "x-ignore-shared", "state": True}]})


class QemuSnapshots(Snapshots):
    def __init__(self, monitor: Path, store: Path) -> None:
        self.monitor, self.store = monitor, store
        self._added = False  # the store is a block node of QEMU's
        self._fd = -1        # ours of the qcow2 while QEMU takes its copy

    def _store_steps(self) -> list[Any]:
        if self._added:
            return []
        if not self.store.exists():
            made = subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(self.store),
                                   STORE_SIZE], capture_output=True, text=True, timeout=30)
            if made.returncode != 0:
                raise ParacellError(f"qemu-img create: {made.stderr.strip()[:200]}")
        self._fd = os.open(self.store, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        # The capability once per QEMU, with the store: nothing of ParaCell's
        # ever clears it (every save and restore of a VM sets it) and only
        # root reaches the monitor, so a checkpoint's or rollback's pause need
        # not pay a round trip for it each time.
        return [IGNORE_SHARED, Command("add-fd", {"fdset-id": STORE_FDSET}, fd=self._fd),
                Command("blockdev-add", {"driver": "qcow2", "node-name": STORE_NODE,
                                         "cache": {"no-flush": True},
                                         "file": {"driver": "file",
                                                  "filename": f"/dev/fdset/{STORE_FDSET}"}})]

    def _session(self, *steps: Any) -> None:
        try:
            qmp.run(self.monitor, *steps)
            self._added = True
        finally:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def save(self, tag: str, capture: Callable[[], None]) -> None:
        job = f"save-{tag}"
        self._session(*self._store_steps(), Command("stop"), Call(capture),
                      Command("snapshot-save", {"job-id": job, "tag": tag, "vmstate": STORE_NODE,
                                                "devices": [STORE_NODE]}),
                      AwaitJob(job, JOB_TIMEOUT_S), Command("cont"))

    def load(self, tag: str, revert: Callable[[], None]) -> None:
        job = f"load-{tag}"
        self._session(*self._store_steps(), Command("stop"), Call(revert),
                      Command("snapshot-load", {"job-id": job, "tag": tag, "vmstate": STORE_NODE,
                                                "devices": [STORE_NODE]}),
                      AwaitJob(job, JOB_TIMEOUT_S), Command("cont"))

    def delete(self, tag: str) -> None:
        job = f"del-{tag}"
        self._session(*self._store_steps(),
                      Command("snapshot-delete", {"job-id": job, "tag": tag,
                                                  "devices": [STORE_NODE]}),
                      AwaitJob(job, JOB_TIMEOUT_S))

    def start_from(self, store: Path, tag: str) -> None:
        fd = os.open(store, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            qmp.run(self.monitor, IGNORE_SHARED,
                    Command("add-fd", {"fdset-id": SOURCE_FDSET}, fd=fd),
                    Command("blockdev-add", {"driver": "qcow2", "node-name": SOURCE_NODE,
                                             "file": {"driver": "file", "filename":
                                                      f"/dev/fdset/{SOURCE_FDSET}"}}),
                    Command("snapshot-load", {"job-id": "fork-load", "tag": tag,
                                              "vmstate": SOURCE_NODE, "devices": [SOURCE_NODE]}),
                    AwaitJob("fork-load", JOB_TIMEOUT_S),
                    Command("blockdev-del", {"node-name": SOURCE_NODE}),
                    Command("remove-fd", {"fdset-id": SOURCE_FDSET}), Command("cont"))
        finally:
            os.close(fd)
