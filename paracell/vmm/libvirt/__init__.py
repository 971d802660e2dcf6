"""libvirt, the second backend: the VM is a transient libvirt domain whose
QEMU is libvirtd's child, driven through libvirt-python (docs/libvirt.md).
It passes no fds (QEMU connects to the shim's sockets), and offers neither
templates nor snapshots yet (its Capabilities say so).

The shim still stands for the container. It starts the domain paused,
takes QEMU's connections to the agent and Pager sockets, moves QEMU into the
container's cgroup (`settle`), lets the vCPUs run, and follows the domain
through libvirt's lifecycle events (paracell/vmm/libvirt/watch.py). A
domain outlives a shim killed with SIGKILL only until the next `delete`,
which destroys it from the state's record (LibvirtDomain.reclaim), or until
the container's cgroup is emptied, which kills its QEMU.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paracell.errors import ParacellError
from paracell.reclaim import reclaimable
from paracell.vmm.builder import Device, Vm
from paracell.vmm.hypervisor import (
    Backend,
    Capabilities,
    Hypervisor,
    SavedState,
    VmStatus,
    unsupported,
)
from paracell.vmm.libvirt import connection, domain

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from paracell.vmm.builder import VmBuilder
    from paracell.vmm.domainxml import DomainParts
    from paracell.vmm.libvirt.watch import DomainWatch

CONNECT_TIMEOUT_S = 30.0


@reclaimable
class LibvirtDomain(Device):
    """The domain itself, as a host resource: recorded before it exists, so
    that `delete` destroys it after a shim that died."""

    kind = "libvirt-domain"

    def __init__(self, uri: str, name: str) -> None:
        self.uri, self.name = uri, name

    def facts(self) -> dict[str, Any]:
        return {"uri": self.uri, "name": self.name}

    def shape(self) -> dict[str, Any]:
        return {"uri": self.uri}

    def render_libvirt(self, parts: DomainParts) -> None:
        """The domain is the XML itself: nothing to add to it."""

    @classmethod
    def reclaim(cls, facts: dict[str, Any]) -> None:
        uri, name = str(facts.get("uri", "")), str(facts.get("name", ""))
        if not name.startswith(domain.NAME_PREFIX):
            return  # not a name ParaCell gives: never another's domain
        destroy(uri, name)




def destroy(uri: str, name: str) -> None:
    """Destroys the domain if it still runs; one that is gone already is fine."""
    libvirt = connection.libvirt_module()
    conn = connection.open_uri(uri)
    try:
        conn.lookupByName(name).destroy()
    except libvirt.libvirtError as err:
        if not connection.is_no_domain(err) and connection.is_active(conn, name):
            raise ParacellError(f"libvirt at {uri}: destroying {name}: "
                                f"{connection.describe(err)}") from None
    finally:
        conn.close()


def find_qemu(proc_fd: int, name: str, ram_path: str) -> int:
    """The host pid of the domain's QEMU, from a /proc of the host (the shim
    may sit in a PID namespace of its own): the process whose command line
    names the domain and ParaCell's RAM file, and which maps that very file.
    The file is compared by inode, not by name: a libvirtd whose mount
    namespace does not see ParaCell's RAM directory would give QEMU another
    file of that name, and the Pager would then free memory QEMU never used."""
    marker, ram = f"guest={name},".encode(), f"mem-path={ram_path},".encode()
    ours = os.stat(ram_path)
    for entry in os.listdir(proc_fd):
        if not entry.isdigit():
            continue
        try:
            fd = os.open(f"{entry}/cmdline", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc_fd)
            try:
                cmdline = os.read(fd, 1 << 16)
            finally:
                os.close(fd)
        except OSError:
            continue
        if marker in cmdline and ram in cmdline:
            if not _maps(proc_fd, entry, (ours.st_dev, ours.st_ino)):
                raise ParacellError(f"the QEMU of libvirt domain {name} does not map "
                                    f"ParaCell's guest RAM file {ram_path}: libvirtd's mount "
                                    "namespace does not see ParaCell's RAM directory "
                                    "(docs/libvirt.md)")
            return int(entry)
    raise ParacellError(f"cannot find the QEMU of libvirt domain {name}")


def _maps(proc_fd: int, pid: str, file_id: tuple[int, int]) -> bool:
    """Whether process `pid` has the file open (QEMU keeps its RAM file's fd)."""
    try:
        dir_fd = os.open(f"{pid}/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC,
                         dir_fd=proc_fd)
    except OSError:
        return False
    try:
        for fd in os.listdir(dir_fd):
            try:
                st = os.stat(fd, dir_fd=dir_fd)  # follows the magic link to the open file
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == file_id:
                return True
        return False
    finally:
        os.close(dir_fd)


class LibvirtBackend(Backend):
    name = "libvirt"
    capabilities = Capabilities(passes_fds=False, templates=False, snapshots=False,
                                live_resize=True)
    default_location = connection.DEFAULT_URI

    def check(self, qemu: str, engine: str) -> None:
        from paracell import settings
        from paracell.vmm.libvirt import readiness

        connection.check_uri(self.location)
        # The daemon, its setup and its QEMU's features, in one line if
        # anything is missing.
        readiness.require(self.location, qemu, engine, str(settings.memory_dir()))

    def report(self, qemu: str | None, engine: str | None) -> dict[str, object]:
        from paracell import settings
        from paracell.vmm.libvirt import readiness

        return readiness.report(self.location, qemu, engine, str(settings.memory_dir()))

    def attach_control(self, vm: VmBuilder, state_dir: Path, memory_file: Path) -> dict[str, str]:
        name = domain.name_for(memory_file.stem)
        vm.attach(LibvirtDomain(self.location, name))
        return {"uri": self.location, "domain": name}

    @classmethod
    def hypervisor(cls, control: dict[str, str], host_proc: int = -1) -> Hypervisor:
        return LibvirtHypervisor(control["uri"], control["domain"], host_proc)


class LibvirtHypervisor(Hypervisor):
    """One domain at one URI."""

    def __init__(self, uri: str, name: str, proc_fd: int = -1) -> None:
        """proc_fd: a /proc of the host, for the shim's launch (find_qemu)."""
        self.uri, self.name, self.proc_fd = uri, name, proc_fd

    def _domain(self) -> tuple[Any, Any]:
        libvirt = connection.libvirt_module()
        conn = connection.open_uri(self.uri)
        try:
            return conn, conn.lookupByName(self.name)
        except libvirt.libvirtError as err:
            conn.close()
            if connection.is_no_domain(err):
                raise ParacellError(f"libvirt at {self.uri} has no domain {self.name}: the VM "
                                    "is not running") from None
            raise ParacellError(f"libvirt at {self.uri}: {connection.describe(err)}") from None

    def _call(self, what: str, act: Callable[[Any], Any]) -> Any:
        libvirt = connection.libvirt_module()
        conn, dom = self._domain()
        try:
            return act(dom)
        except libvirt.libvirtError as err:
            raise ParacellError(f"libvirt at {self.uri}: {what} {self.name}: "
                                f"{connection.describe(err)}") from None
        finally:
            conn.close()

    def launch(self, vm: VmBuilder, log_path: Path,
               before_start: Callable[[], None] | None = None,
               preexec: Callable[[], None] | None = None, incoming: bool = False,
               settle: Callable[[int], None] | None = None, paused: bool = False) -> Vm:
        from paracell.vmm.libvirt.watch import DomainWatch

        if incoming or paused:
            raise unsupported(LibvirtBackend.name, "a VM template or a snapshot")
        ram = next((d for d in vm.devices if d.kind == "guest-ram"), None)
        if ram is None:
            raise ParacellError("internal: a libvirt domain needs ParaCell's guest RAM")
        prepared: list[Device] = []
        watch: DomainWatch | None = None
        dom = None
        try:
            for device in vm.devices:
                device.prepare()
                prepared.append(device)
            # Once prepared: the NICs' TAP names and MACs are known then.
            xml = domain.render(vm, self.name, vm.owner)
            if before_start is not None:
                before_start()
            # After the jail, which wants the shim single-threaded.
            # create checked the daemon and its features (readiness.require).
            watch = DomainWatch(self.uri, self.name)
            dom = self._start(watch, xml, vm.devices)
            pid = find_qemu(self.proc_fd if self.proc_fd >= 0 else _host_proc(),
                            self.name, str(ram.facts()["path"]))
            if settle is not None:
                settle(pid)
            dom.resume()
        except BaseException:
            if dom is not None:
                try:
                    dom.destroy()
                except Exception:  # noqa: BLE001 (gone already; the error that matters is raised)
                    pass
            if watch is not None:
                watch.close()
            for device in reversed(prepared):
                device.release()
            raise
        for device in vm.devices:
            device.launched()
        return LibvirtVm(vm.devices, self, watch, pid, xml)

    def _start(self, watch: DomainWatch, xml: str, devices: list[Device]) -> Any:
        """createXML, paused, while each device that QEMU connects to takes
        its connection in a thread: ivshmem reads the Pager's greeting before
        QEMU's start returns."""
        libvirt = connection.libvirt_module()
        failures: list[BaseException] = []

        def serve(device: Device) -> None:
            try:
                device.await_vmm(CONNECT_TIMEOUT_S)
            except BaseException as err:  # handed to the launching thread
                failures.append(err)

        threads = [threading.Thread(target=serve, args=(d,), name=f"await-{d.kind}", daemon=True)
                   for d in devices if d.awaits_vmm]
        for thread in threads:
            thread.start()
        try:
            dom = watch.conn.createXML(xml, libvirt.VIR_DOMAIN_START_PAUSED)
        except libvirt.libvirtError as err:
            # A waiter gives up on its own once the listener closes (release).
            raise ParacellError(f"libvirt at {self.uri}: starting domain {self.name}: "
                                f"{connection.describe(err)}") from None
        for thread in threads:
            thread.join(CONNECT_TIMEOUT_S + 1)
        if failures:
            dom.destroy()
            raise failures[0]
        return dom

    def pause(self) -> None:
        self._call("pausing", lambda dom: dom.suspend())

    def resume(self) -> None:
        self._call("resuming", lambda dom: dom.resume())

    def stop(self) -> None:
        self._call("destroying", lambda dom: dom.destroy())

    def set_memory(self, usable_bytes: int) -> None:
        libvirt = connection.libvirt_module()
        kib = max(1, usable_bytes >> 10)
        self._call("resizing", lambda dom: dom.setMemoryFlags(
            kib, libvirt.VIR_DOMAIN_AFFECT_LIVE))

    def memory(self) -> int:
        # info()[2]: the balloon's current size in KiB ("actual").
        return int(self._call("querying", lambda dom: dom.info()[2])) << 10

    def query(self) -> VmStatus:
        libvirt = connection.libvirt_module()
        state = self._call("querying", lambda dom: dom.state()[0])
        words = {libvirt.VIR_DOMAIN_RUNNING: "running", libvirt.VIR_DOMAIN_PAUSED: "paused",
                 libvirt.VIR_DOMAIN_SHUTDOWN: "shutdown", libvirt.VIR_DOMAIN_SHUTOFF: "shutoff",
                 libvirt.VIR_DOMAIN_CRASHED: "crashed", libvirt.VIR_DOMAIN_BLOCKED: "blocked"}
        return VmStatus(state in (libvirt.VIR_DOMAIN_RUNNING, libvirt.VIR_DOMAIN_BLOCKED),
                        words.get(state, f"state {state}"))

    def save(self, path: Path) -> SavedState:
        raise unsupported(LibvirtBackend.name, "saving a VM")

    def restore(self, state_fd: int) -> None:
        raise unsupported(LibvirtBackend.name, "restoring a VM")

    def is_vmm_process(self, pid: int, ram_file: str) -> bool:
        proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            return find_qemu(proc, self.name, ram_file) == pid
        finally:
            os.close(proc)


def _host_proc() -> int:
    # Kept for the life of the process: the shim asks once.
    global _PROC
    if _PROC < 0:
        _PROC = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    return _PROC


_PROC = -1


@dataclass
class LibvirtVm(Vm):
    devices: list[Device]
    hypervisor: LibvirtHypervisor
    watch: DomainWatch
    qemu_pid: int
    xml: str

    @property
    def pid(self) -> int:
        return self.qemu_pid

    @property
    def child(self) -> bool:
        return False

    def describe(self) -> str:
        return f"libvirt domain {self.hypervisor.name} at {self.hypervisor.uri}, QEMU pid " \
               f"{self.qemu_pid}"

    def stop(self, grace_s: float) -> int:
        """QEMU's exit as direct QEMU would report it: 0 for a VM that ended
        itself, -SIGKILL for one destroyed, killed or crashed (libvirt's
        event does not tell a debug-exit from a kill, so the agent's exit
        message, not this, carries the container's status)."""
        detail = self.watch.wait_stopped(grace_s)
        if detail is None:
            try:
                destroy(self.hypervisor.uri, self.hypervisor.name)
            except ParacellError:
                pass
            detail = self.watch.wait_stopped(5.0)
        self.watch.close()
        return 0 if detail == "shutdown" else -signal.SIGKILL

    def kill(self) -> None:
        destroy(self.hypervisor.uri, self.hypervisor.name)

    def release(self) -> None:
        self.watch.close()
        super().release()

