"""QEMU's QMP monitor as a device of the VM: a Unix socket that QEMU
inherits already listening, in the state directory, which the shim's
snapshot service and the verbs (pause, resume, update, events) connect to."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from paracell import unixsock
from paracell.reclaim import reclaimable
from paracell.vmm.builder import Device

SOCKET_NAME = "qmp.sock"


@reclaimable
class QmpSocket(Device):
    """The monitor's socket, listening before QEMU starts."""

    kind = "qemu-monitor"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._listener: socket.socket | None = None

    def facts(self) -> dict[str, Any]:
        return {"path": str(self.path)}

    def prepare(self) -> None:
        self._listener = unixsock.listen(self.path)

    def pass_fds(self) -> tuple[int, ...]:
        return (self._listener.fileno(),) if self._listener else ()

    def qemu_args(self) -> list[str]:
        fd = self._listener.fileno() if self._listener else -1
        return ["-chardev", f"socket,id=qmp,fd={fd},server=on,wait=off",
                "-mon", "chardev=qmp,mode=control"]

    def launched(self) -> None:
        if self._listener:
            self._listener.close()
            self._listener = None

    def release(self) -> None:
        self.launched()
        self.reclaim(self.facts())

    @classmethod
    def reclaim(cls, facts: dict[str, Any]) -> None:
        unixsock.unlink(Path(facts["path"]))
