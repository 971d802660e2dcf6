"""Direct QEMU, the default backend: the VM is a QEMU child of the shim
(paracell/vmm/builder.py renders its command line, paracell/vmm/qemu/jail.py
its root), controlled over its QMP monitor (monitor.py, qmp.py), with
templates and snapshots (snapshots.py).

Save and restore use QEMU's migration to a file descriptor with the
`x-ignore-shared` capability: guest RAM is a shared file that is not copied
into the stream, so what is written is device state only (tens of KB).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from paracell.errors import ParacellError
from paracell.vmm.hypervisor import (
    Backend,
    Capabilities,
    Hypervisor,
    SavedState,
    Snapshots,
    VmStatus,
)
from paracell.vmm.qemu import qmp
from paracell.vmm.qemu.monitor import SOCKET_NAME, QmpSocket
from paracell.vmm.qemu.qmp import AwaitMigration, Command
from paracell.vmm.qemu.snapshots import IGNORE_SHARED, QemuSnapshots

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from paracell.vmm.builder import Vm, VmBuilder

MIGRATION_TIMEOUT_S = 60.0
# The name the state's fd gets inside QEMU (`getfd`), for the `fd:` URI.
STATE_FD_NAME = "paracell-state"
CONTROL_KEY = "qmp_socket"


class QemuBackend(Backend):
    name = "qemu"
    capabilities = Capabilities(passes_fds=True, templates=True, snapshots=True,
                                live_resize=True)

    def attach_control(self, vm: VmBuilder, state_dir: Path, memory_file: Path) -> dict[str, str]:
        return {CONTROL_KEY: str(vm.attach(QmpSocket(state_dir / SOCKET_NAME)).path)}

    @classmethod
    def hypervisor(cls, control: dict[str, str], host_proc: int = -1) -> Hypervisor:
        return QemuHypervisor(Path(control[CONTROL_KEY]))


class QemuHypervisor(Hypervisor):
    def __init__(self, qmp_socket: Path) -> None:
        self.qmp_socket = qmp_socket

    def launch(self, vm: VmBuilder, log_path: Path,
               before_start: Callable[[], None] | None = None,
               preexec: Callable[[], None] | None = None, incoming: bool = False,
               settle: Callable[[int], None] | None = None, paused: bool = False) -> Vm:
        # QEMU is the shim's child: it is born where the shim is, and needs no settling.
        return vm.launch(log_path, before_start, preexec, incoming=incoming, paused=paused)

    def pause(self) -> None:
        qmp.execute(self.qmp_socket, "stop")

    def resume(self) -> None:
        qmp.execute(self.qmp_socket, "cont")

    def stop(self) -> None:
        qmp.execute(self.qmp_socket, "quit")

    def set_memory(self, usable_bytes: int) -> None:
        qmp.execute(self.qmp_socket, "balloon", {"value": usable_bytes})

    def memory(self) -> int:
        actual = qmp.execute(self.qmp_socket, "query-balloon")
        if not isinstance(actual, dict) or not isinstance(actual.get("actual"), int):
            raise ParacellError("QMP query-balloon: no figure in the answer")
        return actual["actual"]

    def query(self) -> VmStatus:
        status = qmp.execute(self.qmp_socket, "query-status")
        if not isinstance(status, dict):
            raise ParacellError("QMP query-status: no status in the answer")
        return VmStatus(bool(status.get("running")), str(status.get("status", "")))

    def save(self, path: Path) -> SavedState:
        began = time.monotonic()
        # A new file, never a link: the state is written where it was asked to be.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            qmp.run(self.qmp_socket, IGNORE_SHARED, Command("stop"),
                    Command("getfd", {"fdname": STATE_FD_NAME}, fd=fd),
                    Command("migrate", {"uri": f"fd:{STATE_FD_NAME}"}),
                    AwaitMigration("save", MIGRATION_TIMEOUT_S))
            size = os.fstat(fd).st_size
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        return SavedState(path, size, time.monotonic() - began)

    def snapshots(self, store: Path) -> Snapshots:
        return QemuSnapshots(self.qmp_socket, store)

    def restore(self, state_fd: int) -> None:
        os.lseek(state_fd, 0, os.SEEK_SET)
        qmp.run(self.qmp_socket, IGNORE_SHARED,
                Command("getfd", {"fdname": STATE_FD_NAME}, fd=state_fd),
                Command("migrate-incoming", {"uri": f"fd:{STATE_FD_NAME}"}),
                AwaitMigration("restore", MIGRATION_TIMEOUT_S))
