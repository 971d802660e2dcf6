"""The devices a ParaCell micro-VM is built from (see paracell/vmm/builder.py).
Names the guest looks for come from proto/vm_proto.h."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from paracell import speckeys as K
from paracell import unixsock, wire
from paracell.errors import ParacellError
from paracell.reclaim import reclaimable
from paracell.vmm import hostshare, memory
from paracell.vmm.builder import Device

TYPE_CHECKING = False
if TYPE_CHECKING:
    from paracell.pager.server import PagerServer
    from paracell.vmm.domainxml import DomainParts


@reclaimable
class GuestRam(Device):
    """Guest RAM in a sparse tmpfs file the runtime owns and QEMU maps shared,
    so that the host can see, and the Pager release, exactly what the guest uses.

    A VM restored from a template may instead map the template's own RAM
    file privately (`shared_from`): it shares every page it has not written
    with the other VMs from that template, and its own pages are anonymous
    copies in its QEMU (docs/templates.md). It has no RAM file of its own."""

    kind = "guest-ram"
    BACKEND_ID = "mem"
    machine_options = (f"memory-backend={BACKEND_ID}",)

    def __init__(self, path: Path, size_mib: int) -> None:
        self.path, self.size_mib = path, size_mib
        # For a restore: writes a saved VM's RAM into the new, empty file.
        self.fill: Callable[[int], object] | None = None
        # For a copy-on-write restore: the template's RAM file, open and checked,
        # and what the Pager adds to QEMU's RAM plugin (PagerChannel.prepare).
        self.shared_from = -1
        self.plugin_options: list[str] = []
        # Snapshot mode: QEMU's RAM plugin logs which pages it writes
        # (csrc/ramplugin.c, track=1), and checkpoints read only those.
        self.track_writes = False
        self._track_fd = -1

    @property
    def copy_on_write(self) -> bool:
        return self.shared_from >= 0

    @property
    def tracked(self) -> bool:
        return self.track_writes and not self.copy_on_write

    def facts(self) -> dict[str, Any]:
        return {"path": str(self.path)}

    def shape(self) -> dict[str, Any]:
        return {"size_mib": self.size_mib}

    def prepare(self) -> None:
        if self.copy_on_write:
            return
        memory.create_at(self.path, self.size_mib)
        try:
            if self.fill is not None:
                fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    self.fill(fd)
                finally:
                    os.close(fd)
            if self.tracked:
                # How the plugin knows the file: by this fd's identity.
                self._track_fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except BaseException:
            memory.remove(self.path)
            raise

    def host_paths(self) -> dict[str, bool]:
        if self.copy_on_write:
            return {str(memory.PLUGIN): False}
        return {str(self.path): True, **({str(memory.PLUGIN): False} if self.tracked else {})}

    def pass_fds(self) -> tuple[int, ...]:
        if self.copy_on_write:
            return (self.shared_from,)
        return (self._track_fd,) if self._track_fd >= 0 else ()

    def launched(self) -> None:
        if self._track_fd >= 0:
            os.close(self._track_fd)
            self._track_fd = -1

    def release(self) -> None:
        self.launched()
        super().release()

    def qemu_args(self) -> list[str]:
        size = f"{self.size_mib}M"
        if self.copy_on_write:
            # The file QEMU opens is the one that was checked: the fd it inherits.
            plugin = memory.plugin_option(f"ram={self.shared_from}",
                                          f"size={self.size_mib << 20}", *self.plugin_options)
            return ["-object", f"memory-backend-file,id={self.BACKEND_ID},size={size},"
                    f"mem-path=/proc/self/fd/{self.shared_from},share=off,prealloc=off",
                    "-plugin", plugin]
        shared = ["-object", f"memory-backend-file,id={self.BACKEND_ID},size={size},"
                  f"mem-path={self.path},share=on,prealloc=off,align=2M"]
        if self._track_fd >= 0:
            shared += ["-plugin", memory.plugin_option(f"ram={self._track_fd}",
                                                       f"size={self.size_mib << 20}", "track=1")]
        return shared

    @classmethod
    def reclaim(cls, facts: dict[str, Any]) -> None:
        memory.remove(Path(facts["path"]))

    def render_libvirt(self, parts: DomainParts) -> None:
        # libvirt puts a file-backed RAM under its daemon-wide directory, at a
        # path of its choosing: ParaCell's own file goes to QEMU as it is.
        from paracell.vmm.domainxml import RAM_BACKEND_ID

        parts.qemu_args += ["-object", f"memory-backend-file,id={RAM_BACKEND_ID},"
                            f"size={self.size_mib}M,mem-path={self.path},share=on,"
                            "prealloc=off,align=2M", "-machine",
                            f"memory-backend={RAM_BACKEND_ID}"]


@reclaimable
class SerialConsole(Device):
    """The guest's console, kept in a file that outlives the VM for diagnosis."""

    kind = "serial-console"

    def __init__(self, path: Path) -> None:
        self.path = path

    def qemu_args(self) -> list[str]:
        return ["-chardev", f"file,id=console,path={self.path}", "-serial", "chardev:console"]

    def host_paths(self) -> dict[str, bool]:
        return {str(self.path): True}

    def render_libvirt(self, parts: DomainParts) -> None:
        from paracell.vmm.domainxml import sub

        serial = parts.add("serial", {"type": "file"})
        sub(serial, "source", path=str(self.path), append="on")
        sub(serial, "target", port="0")


@reclaimable
class DebugExit(Device):
    """isa-debug-exit: a guest write makes QEMU exit at once; the agent powers off through it."""

    kind = "debug-exit"

    def qemu_args(self) -> list[str]:
        from paracell._native import lib

        return ["-device", f"isa-debug-exit,iobase={lib.PC_DEBUG_EXIT_PORT:#x},iosize=4"]

    def render_libvirt(self, parts: DomainParts) -> None:
        parts.qemu_args += self.qemu_args()  # libvirt has no element for it


class Rendezvous:
    """A socket a VMM that is not our child connects to as it starts: one
    connection is taken, then the path goes. It lives in the RAM directory,
    root's alone, under a name short enough for sun_path (QEMU connects by path)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._listener: socket.socket | None = None

    def listen(self) -> None:
        unixsock.unlink(self.path)
        self._listener = unixsock.listen(self.path, backlog=1)

    def accept(self, timeout_s: float, what: str) -> socket.socket:
        assert self._listener is not None
        self._listener.settimeout(timeout_s)
        try:
            conn, _ = self._listener.accept()
        except TimeoutError:
            raise ParacellError(f"QEMU did not connect to the {what} socket in "
                                f"{timeout_s:.0f} s") from None
        finally:
            self.close()
        conn.settimeout(None)
        return conn

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        unixsock.unlink(self.path)


@reclaimable
class AgentPort(Device):
    """The agent channel: a virtio-serial port backed by a socketpair whose other
    end the shim keeps (`host_end`); or, for a VMM that is not our child, a
    socket QEMU connects to (`listen_path`)."""

    kind = "agent-port"

    def __init__(self, listen_path: Path | None = None) -> None:
        self.listen_path = listen_path
        self.host_end: socket.socket | None = None
        self._vm_end: socket.socket | None = None
        self._rendezvous = Rendezvous(listen_path) if listen_path else None

    def facts(self) -> dict[str, Any]:
        return {"path": str(self.listen_path)} if self.listen_path else {}

    def prepare(self) -> None:
        if self._rendezvous is not None:
            self._rendezvous.listen()
            return
        self.host_end, self._vm_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

    @property
    def awaits_vmm(self) -> bool:
        return self._rendezvous is not None

    def await_vmm(self, timeout_s: float) -> None:
        assert self._rendezvous is not None
        self.host_end = self._rendezvous.accept(timeout_s, "agent")

    def pass_fds(self) -> tuple[int, ...]:
        return (self._vm_end.fileno(),) if self._vm_end else ()

    def qemu_args(self) -> list[str]:
        fd = self._vm_end.fileno() if self._vm_end else -1
        return [
            "-device", "virtio-serial-device,max_ports=2",
            "-chardev", f"socket,id=agent,fd={fd}",
            "-device", f"virtserialport,chardev=agent,name={wire.text('PC_AGENT_PORT_NAME')}",
        ]

    def launched(self) -> None:
        if self._vm_end:
            self._vm_end.close()
            self._vm_end = None

    def release(self) -> None:
        for sock in (self.host_end, self._vm_end):
            if sock is not None:
                sock.close()
        self.host_end = self._vm_end = None
        if self._rendezvous is not None:
            self._rendezvous.close()

    @classmethod
    def reclaim(cls, facts: dict[str, Any]) -> None:
        if facts.get("path"):
            unixsock.unlink(Path(str(facts["path"])))

    def render_libvirt(self, parts: DomainParts) -> None:
        from paracell.vmm.domainxml import sub

        if self.listen_path is None:
            raise ParacellError("internal: the agent port of a libvirt domain needs a socket "
                                "path")
        channel = parts.add("channel", {"type": "unix"})
        # QEMU connects to the shim's listener: nothing else can take the port first.
        sub(channel, "source", mode="connect", path=str(self.listen_path))
        sub(channel, "target", type="virtio", name=wire.text("PC_AGENT_PORT_NAME"))


@reclaimable
class Share(Device):
    """A host directory as a virtio-9p share, mounted by the agent by its tag."""

    kind = "9p-share"

    def __init__(self, tag: str, path: Path, readonly: bool, multidevs: bool = False) -> None:
        self.tag, self.path, self.readonly, self.multidevs = tag, path, readonly, multidevs

    def host_paths(self) -> dict[str, bool]:
        return {str(self.path): not self.readonly}

    def shape(self) -> dict[str, Any]:
        return {"tag": self.tag, "readonly": self.readonly, "multidevs": self.multidevs}

    def sandbox_records(self) -> list[tuple[str, str]]:
        return [(K.SHARE, self.tag)]

    def qemu_args(self) -> list[str]:
        # passthrough keeps the container's uids/modes on the host files, as runc would.
        opts = f"local,id={self.tag},path={self.path},security_model=passthrough"
        if self.readonly:
            opts += ",readonly=on"
        if self.multidevs:
            # Several host filesystems under one share: remap inode numbers
            # so that two files never share one in the guest.
            opts += ",multidevs=remap"
        return ["-fsdev", opts,
                "-device", f"virtio-9p-device,fsdev={self.tag},mount_tag={self.tag}"]

    def render_libvirt(self, parts: DomainParts) -> None:
        from paracell.vmm.domainxml import sub

        attrs = {"type": "mount", "accessmode": "passthrough"}
        if self.multidevs:
            attrs["multidevs"] = "remap"
        fs = parts.add("filesystem", attrs)
        sub(fs, "driver", type="path")
        sub(fs, "source", dir=str(self.path))
        sub(fs, "target", dir=self.tag)
        if self.readonly:
            sub(fs, "readonly")


class RootDisk(Device):
    """A snapshot-mode VM's rootfs: the bundle's rootfs as a read-only ext4
    image (paracell/images/rootdisk.py) on virtio-blk, with the container's
    writes in guest RAM (docs/snapshots.md). Nothing of it is on a 9p share,
    so QEMU can save the VM at any moment."""

    kind = "root-disk"
    DRIVE_ID = "rootdisk"

    def __init__(self, image: Path | None, writable: bool) -> None:
        self.image, self.writable = image, writable
        self._hold = -1

    def build(self, rootfs: Path) -> None:
        from paracell.images import rootdisk

        self.image = rootdisk.image_for(rootfs)

    def _image(self) -> Path:
        if self.image is None:
            raise ParacellError("the root disk was never built")
        return self.image

    def prepare(self) -> None:
        from paracell.images import rootdisk

        self._hold = rootdisk.hold(self._image())

    def keep_across_exec(self) -> None:
        """The shim is about to become paracell-vmshim: its fd, and so the
        image's in-use lock, goes with it."""
        if self._hold >= 0:
            os.set_inheritable(self._hold, True)

    def shape(self) -> dict[str, Any]:
        # The guest reads the disk's size as it boots, before READY.
        return {"bytes": os.stat(self._image()).st_size, "writable": self.writable}

    def host_paths(self) -> dict[str, bool]:
        return {str(self._image()): False}

    def qemu_args(self) -> list[str]:
        return ["-drive",
                f"file={self._image()},if=none,id={self.DRIVE_ID},format=raw,readonly=on",
                "-device", f"virtio-blk-device,drive={self.DRIVE_ID}"]

    def sandbox_records(self) -> list[tuple[str, str]]:
        return [(K.ROOTDISK, "rw" if self.writable else "ro")]

    def release(self) -> None:
        if self._hold >= 0:
            os.close(self._hold)
            self._hold = -1


class HostFiles(Device):
    """A snapshot-mode VM's copies of host files bound into the container
    (/etc/hosts and the like), sent in the SANDBOX in place of the host share."""

    kind = "host-files"

    def __init__(self, files: list[tuple[str, bytes]]) -> None:
        self.files = files  # (bind slot, content)

    def sandbox_records(self) -> list[tuple[str, str]]:
        return [(K.HOSTFILE, f"{slot}:{content.hex()}") for slot, content in self.files]


def rootfs_share(path: Path, readonly: bool) -> Share:
    return Share(wire.text("PC_ROOTFS_TAG"), path, readonly)


class BoundShare(Share):
    """A share whose directory holds bind mounts made on the host: `reclaim`
    unbinds them and removes the directory, never what was bound."""

    def facts(self) -> dict[str, Any]:
        return {"dir": str(self.path)}

    @classmethod
    def reclaim(cls, facts: dict[str, Any]) -> None:
        hostshare.remove_tree(Path(facts["dir"]))


@reclaimable
class HostShare(BoundShare):
    """Bind sources from outside the rootfs, each bind-mounted at its entry
    (SLOT/NAME) of one share directory on the host (paracell/vmm/hostshare.py)."""

    kind = "host-share"

    def __init__(self, directory: Path, binds: list[tuple[Path, str]]) -> None:
        super().__init__(wire.text("PC_HOSTSHARE_TAG"), directory, readonly=False)
        self.binds = binds

    def prepare(self) -> None:
        hostshare.mount_binds(self.path, self.binds)


@reclaimable
class PodShare(BoundShare):
    """A pod VM's share: each member container's rootfs and bind sources are
    bound into a directory of it while the VM runs (paracell/runtime/pod/pod.py)."""

    kind = "pod-share"

    def __init__(self, directory: Path) -> None:
        super().__init__(wire.text("PC_PODSHARE_TAG"), directory, readonly=False, multidevs=True)

    def prepare(self) -> None:
        self.path.mkdir(mode=0o700, exist_ok=True)
        # Members are bound in after QEMU sits in its jail, whose mounts are
        # slaves of the host's: a shared mount here carries them there.
        hostshare.make_shared(self.path)


@reclaimable
class PagerChannel(Device):
    """The Pager's ivshmem-doorbell device. Its server runs in this process
    (paracell/pager/server.py) and is greeted onto a socketpair before QEMU
    starts, so there is no listening socket to race for or to leak."""

    kind = "pager"
    # microvm has a PCI bus only with its PCIe host bridge, described by ACPI.
    machine_options = ("acpi=on", "pcie=on")

    def __init__(self, ram: GuestRam, state_dir: Path, kernel_knobs: dict[str, int],
                 listen_path: Path | None = None) -> None:
        """listen_path: for a VMM that is not our child, the server socket
        QEMU connects to (libvirt's <shmem><server>)."""
        self.ram, self.state_dir, self.kernel_knobs = ram, state_dir, kernel_knobs
        self.listen_path = listen_path
        self.server: PagerServer | None = None
        self._host_end: socket.socket | None = None
        self._vm_end: socket.socket | None = None
        self._rendezvous = Rendezvous(listen_path) if listen_path else None

    def facts(self) -> dict[str, Any]:
        facts = {"dir": str(self.state_dir)}
        if self.listen_path:
            facts["socket"] = str(self.listen_path)
        return facts

    def prepare(self) -> None:
        from paracell.pager.server import PagerServer

        # A copy-on-write RAM's pages can only be discarded by QEMU: served there.
        self.server = PagerServer(None if self.ram.copy_on_write else self.ram.path,
                                  self.ram.size_mib << 20, self.state_dir)
        if self.server.in_vmm:
            self.ram.plugin_options = self.server.plugin_options()
        try:
            if self._rendezvous is not None:
                self._rendezvous.listen()
                return
            self._host_end, self._vm_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            self.server.greet(self._host_end.fileno())
        except BaseException:
            self.release()
            raise

    @property
    def awaits_vmm(self) -> bool:
        return self._rendezvous is not None

    def await_vmm(self, timeout_s: float) -> None:
        # QEMU's ivshmem reads the greeting while it starts: it is served here, meanwhile.
        assert self._rendezvous is not None and self.server is not None
        self._host_end = self._rendezvous.accept(timeout_s, "Pager")
        self.server.greet(self._host_end.fileno())

    def pass_fds(self) -> tuple[int, ...]:
        plugin = self.server.plugin_fds() if self.server and self.server.in_vmm else ()
        return ((self._vm_end.fileno(),) if self._vm_end else ()) + plugin

    def qemu_args(self) -> list[str]:
        from paracell._native import lib

        fd = self._vm_end.fileno() if self._vm_end else -1
        # master=on: QEMU migrates only the master peer's ivshmem (templates).
        device = f"ivshmem-doorbell,chardev=pager,vectors={lib.PC_PAGER_VECTORS},master=on"
        return ["-chardev", f"socket,id=pager,fd={fd}", "-device", device]

    def kernel_args(self) -> list[str]:
        from paracell._native import lib

        # The rings' range, out of the allocator's reach (proto/pager_proto.h).
        ring = f"memmap={lib.PC_PAGER_SHM_SIZE >> 10}K${lib.PC_PAGER_RING_GPA:#x}"
        return [ring, *(f"{name}={value}" for name, value in self.kernel_knobs.items())]

    def launched(self) -> None:
        if self._vm_end:
            self._vm_end.close()
            self._vm_end = None
        if self.server:
            self.server.launched()
            self.server.start()

    def started(self, pid: int) -> None:
        # PARACELL_PAGER_VMM_PREFAULT=0 leaves QEMU to fault bound memory in
        # itself, as before: how docs/pager.md measures what the prefault saves.
        if self.server and os.environ.get("PARACELL_PAGER_VMM_PREFAULT") != "0":
            self.server.set_vmm(pid)

    def release(self) -> None:
        if self.server:
            self.server.close()
            self.server = None
        self.ram.plugin_options = []
        for sock in (self._host_end, self._vm_end):
            if sock is not None:
                sock.close()
        self._host_end = self._vm_end = None
        if self._rendezvous is not None:
            self._rendezvous.close()
        self.reclaim(self.facts())

    @classmethod
    def reclaim(cls, facts: dict[str, Any]) -> None:
        from paracell.pager import server

        if facts.get("socket"):
            unixsock.unlink(Path(str(facts["socket"])))
        for name in (server.TOKEN_FILE, server.STATS_FILE):
            try:
                os.unlink(Path(facts["dir"]) / name)
            except FileNotFoundError:
                pass

    def render_libvirt(self, parts: DomainParts) -> None:
        from paracell._native import lib
        from paracell.vmm.domainxml import sub

        if self.listen_path is None:
            raise ParacellError("internal: the Pager of a libvirt domain needs a socket path")
        shmem = parts.add("shmem", {"name": "paracell-pager"})
        sub(shmem, "model", type="ivshmem-doorbell")
        sub(shmem, "server", path=str(self.listen_path))
        sub(shmem, "msi", vectors=str(lib.PC_PAGER_VECTORS), ioeventfd="on")


@reclaimable
class Balloon(Device):
    """virtio-balloon with free page reporting: the mainstream baseline, where
    QEMU itself discards what the guest reports (2 MiB blocks, 2 s pacing)."""

    kind = "balloon"

    def qemu_args(self) -> list[str]:
        return ["-device", "virtio-balloon-device,free-page-reporting=on"]

    def render_libvirt(self, parts: DomainParts) -> None:
        from paracell.vmm.domainxml import sub

        parts.balloon = True
        balloon = parts.add("memballoon", {"model": "virtio", "freePageReporting": "on"})
        # No statistics polling: it would wake an idle guest.
        sub(balloon, "stats", period="0")
