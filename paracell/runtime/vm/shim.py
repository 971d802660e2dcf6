"""The per-container host shim: owns the VM, and its pid stands for the container.

containerd and conmon wait on this pid and signal it, so it lives as long as
the container, forwards the signals it gets, and exits with the container's
status. While it runs, the C relay moves stdio and serves exec proxies and
control requests (start, kill) on `shim.sock`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from paracell import unixsock
from paracell.errors import ParacellError
from paracell.log import RuntimeLog
from paracell.net import device as net_device
from paracell.net import discover, late, netns, portforward
from paracell.procfs import process_start_time
from paracell.runtime.agent import channel, console, sandboxspec, signals
from paracell.runtime.agent.signals import exit_status_for_signal
from paracell.runtime.host.hostns import HostIsolation
from paracell.runtime.state.store import CONTROL_SOCKET
from paracell.runtime.vm import standin
from paracell.runtime.vm.spawn import Handshake, Ready
from paracell.runtime.vm.templating import Templating
from paracell.runtime.vm.vmplan import PlannedVm
from paracell.vmm import backends
from paracell.vmm.builder import Vm
from paracell.vmm.hypervisor import Hypervisor

TYPE_CHECKING = False
if TYPE_CHECKING:
    from paracell.runtime.snapshots.forking import ForkSource
    from paracell.runtime.snapshots.service import SnapshotService

BOOT_TIMEOUT_S = 60.0
# A restored guest has booted already: one that does not answer its SANDBOX
# in this long is broken, and gives way to a cold boot.
RESTORED_ATTACH_TIMEOUT_S = 15.0
POWEROFF_GRACE_S = 5.0
POWEROFF_ROOM_WAIT_MS = 1000
EXIT_VM_DIED = exit_status_for_signal(signal.SIGKILL)
EXIT_RUNTIME_ERROR = standin.EXIT_RUNTIME_ERROR
# csrc/vmshimexec.c, built beside paracell-relay by setup.py.
VMSHIM_EXEC = channel.RELAY_EXEC.with_name("paracell-vmshim")


@dataclass
class ShimPlan:
    state_dir: Path
    vm: PlannedVm  # its config as recorded: the backend that launches it
    launch_spec: bytes
    hostname: str  # the VM's own, sent in SANDBOX
    console_socket: str | None
    terminal: bool
    log: RuntimeLog
    seccomp: bytes | None = None  # PC_SECCOMP payload, sent just before the SPEC
    network: netns.NetworkPlan = netns.NetworkPlan(netns.HOST)
    # Namespaces, cgroup and jail on the host (runtime/host/hostns.py).
    isolation: HostIsolation | None = None
    # Restore from a VM template, or leave one (runtime/vm/templating.py).
    templates: bool = False
    # Snapshot mode (docs/snapshots.md): how many checkpoints it may keep; 0: not in it.
    checkpoint_limit: int = 0
    # A fork (paracell/runtime/snapshots/forking.py): the checkpoint its VM goes on from.
    fork: ForkSource | None = None
    # A pooled VM (docs/pool.md): the --root whose pool it takes its lease from.
    pool_root: str = ""


class Shim:
    """The stand-in for a VM's init (runtime/vm/standin.py): it owns the VM."""

    needs_commit = True

    def __init__(self, plan: ShimPlan, report: Callable[[str], None]) -> None:
        self.plan = plan
        self.report = report
        self.vm: Vm | None = None
        self.listener: socket.socket | None = None
        self.tty_fd = -1
        self.forward: portforward.PortForward | None = None
        self.began = time.monotonic()
        # Set when the guest broke a protocol: it gets no say in its shutdown.
        self.untrusted = False
        # The creator's service that moves a host pid into the container's cgroup.
        self.place: Callable[[int], None] | None = None
        self.snapshots: SnapshotService | None = None  # in snapshot mode
        self._native_log_fd = -1  # the --log that paracell-vmshim inherits
        # A pooled VM's lease (runtime/poolwire.py): the VM ends with its holder.
        self.lease: socket.socket | None = None

    def _debug(self, msg: str) -> None:
        self.plan.log.info(f"shim: {msg} (+{time.monotonic() - self.began:.3f} s)")

    def _agent_fd(self) -> int:
        assert self.plan.vm.agent.host_end is not None
        return self.plan.vm.agent.host_end.fileno()

    def open(self) -> Ready:
        try:
            return self.boot()
        except OSError as err:
            raise ParacellError(f"starting the VM: {standin.describe(err)}") from None

    def run(self) -> int:
        self.become_native()  # returns only where the VM needs Python for its life
        status, message = self.relay()
        if message:
            self.report(message)
        return status

    def close(self) -> None:
        self.shutdown()

    def boot(self) -> Ready:
        """Everything up to a created (not yet started) process."""
        from paracell._native import lib
        from paracell.runtime.host import hostns

        plan = self.plan
        if plan.pool_root:
            from paracell.runtime import poolwire

            # First: a pool that is gone already gets no VM.
            self.lease = poolwire.take_lease(plan.pool_root, plan.state_dir.name)
        iso = plan.isolation
        if iso is not None:
            iso.enter()
            hostns.prepare_qemu_privileges()
        self.listener = unixsock.listen(plan.state_dir / CONTROL_SOCKET)
        # Before QEMU exists and while we have one thread: both inherit it.
        netns.enter(plan.network)
        vmm = backends.hypervisor_of(plan.vm.config)
        templates = Templating(plan.vm, vmm, self._launch, plan.log.warning, self._debug)
        if plan.fork is not None:
            return self._boot_fork(vmm)
        self.vm = templates.restore() if plan.templates else None
        if self.vm is not None:
            try:
                self._attach(RESTORED_ATTACH_TIMEOUT_S)
                templates.attached()
            except ParacellError as err:
                # Up to its SANDBOX reply a restore still gives way to a cold boot.
                templates.abandon(self.vm, err)
                self.vm = None
        if self.vm is None:
            self.vm = self._launch(False)
            self._debug(f"qemu: {self.vm.describe()}")
            self._debug(f"qemu started, pid {self.vm.pid}; "
                        f"{net_device.summary(plan.vm.nics)}")
            caps = channel.expect_ready(self._agent_fd(), BOOT_TIMEOUT_S)
            self._debug(f"agent ready, protocol {lib.PC_PROTO_VERSION}, capabilities {caps:#x}")
            # Nothing of the sandbox has reached the guest yet: the moment to save it.
            templates.save()
            self._attach(BOOT_TIMEOUT_S)
        self._debug("sandbox attached")
        fd = self._agent_fd()
        if plan.launch_spec:  # empty for a spec without a process: nothing to create yet
            if plan.seccomp:
                channel.send(fd, lib.PC_SECCOMP, 0, plan.seccomp)
            channel.send(fd, lib.PC_SPEC, 0, plan.launch_spec)
            guest_pid = channel.expect_created(fd, BOOT_TIMEOUT_S)
            self._debug(f"container process created, guest pid {guest_pid}")
        # Still in the container's network namespace, as the shim stays. A
        # pooled VM's is its own, whose loopback no one dials: the container
        # that takes the VM lends it its namespace's listeners on the lease.
        self.forward = None if plan.pool_root else portforward.start(plan.network, plan.log)
        if self.forward is not None:
            self._debug("port forwarding: 127.0.0.1 and ::1, any TCP port, reach the guest")
        if plan.terminal:
            self.tty_fd = console.open_for_container(plan.console_socket)
            # The caller's fds 0-2 are not the container's stdio now, and a
            # caller may wait for EOF on them (go-runc does) before create returns.
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.close(devnull)
        # From the moment the pid is published, `kill` may signal us: hold
        # the signals until the relay's signalfd picks them up.
        signal.pthread_sigmask(signal.SIG_BLOCK, signals.FORWARDED)
        if plan.checkpoint_limit:
            # After the mask: a thread that took a forwarded signal would
            # keep it from the relay (the container would never get it).
            self._serve_snapshots(vmm)
        if iso is not None:
            return Ready(*iso.host_pids(self.vm.pid, self.vm.child), template=templates.outcome)
        return Ready(os.getpid(), self.vm.pid, process_start_time(self.vm.pid) or 0,
                     template=templates.outcome)

    def _attach(self, timeout_s: float) -> None:
        channel.attach_sandbox(self._agent_fd(), sandboxspec.payload(self.plan.vm.builder,
                                                                     self.plan.hostname),
                               timeout_s)

    def _boot_fork(self, vmm: Hypervisor) -> Ready:
        """A fork's VM goes on from its parent's checkpoint: no SANDBOX and
        no SPEC, its container runs already (paracell/runtime/snapshots/forking.py)."""
        from paracell.runtime.snapshots import forking
        from paracell.vmm import templatestore

        plan = self.plan
        assert plan.fork is not None
        restore = forking.ForkRestore(plan.fork, plan.state_dir, plan.vm.ram,
                                      templatestore.key_of(plan.vm.builder.shape()), vmm,
                                      lambda: self._launch(False, paused=True), self._debug)
        self.vm = restore.restore()
        self._debug(f"qemu: {net_device.summary(plan.vm.nics)}")
        network = plan.vm.nics.fork_records() if plan.vm.nics is not None else []
        forking.identify(self._agent_fd(), plan.fork, BOOT_TIMEOUT_S, network)
        if plan.vm.nics is not None:
            plan.vm.nics.fork_ready()
        self._debug(f"fork {plan.fork.container_id} took its identity")
        # As a create's: the fork's namespace's loopback leads into its guest.
        self.forward = portforward.start(plan.network, plan.log)
        signal.pthread_sigmask(signal.SIG_BLOCK, signals.FORWARDED)
        if plan.checkpoint_limit:
            self._serve_snapshots(vmm)
        iso = plan.isolation
        if iso is not None:
            return Ready(*iso.host_pids(self.vm.pid, self.vm.child), template="")
        return Ready(os.getpid(), self.vm.pid, process_start_time(self.vm.pid) or 0, template="")

    def _serve_snapshots(self, vmm: Hypervisor) -> None:
        from paracell.runtime.snapshots.service import SnapshotService
        from paracell.runtime.snapshots.writelog import WriteLog
        from paracell.vmm import templatestore
        from paracell.vmm.builder import QemuChild

        vm = self.plan.vm
        assert vm.rootdisk is not None and vm.rootdisk.image is not None
        writes = None
        if vm.ram.tracked and isinstance(self.vm, QemuChild):
            writes = WriteLog(self.vm.pid, vm.ram.path, vm.ram.size_mib << 20,
                              self.plan.log.warning)
        self.snapshots = SnapshotService(
            self.plan.state_dir, vmm, self.plan.state_dir / CONTROL_SOCKET, vm.ram.path,
            vm.ram.size_mib << 20, templatestore.key_of(vm.builder.shape()),
            self.plan.checkpoint_limit, vm.pager.server if vm.pager else None,
            vm.rootdisk.image, self.plan.log.warning, writes)
        self.snapshots.start()
        self._debug("checkpoints served on snap.sock")

    def _launch(self, incoming: bool, paused: bool = False) -> Vm:
        """QEMU, booting or (incoming) waiting for a saved state. The shim's
        jail is made once, by the first launch that gets that far; a
        relaunch (a restore that failed) runs in it, with a root of its own."""
        plan, iso = self.plan, self.plan.isolation

        def jail() -> None:
            if iso is not None:
                iso.jail(plan.vm.builder.host_paths(), str(plan.state_dir))

        def settle(pid: int) -> None:
            # A QEMU that is libvirtd's child starts in libvirt's cgroup: it
            # joins the container's before its guest runs, as our child is
            # born there. The creator moves it: in a PID namespace of our own
            # we cannot name its host pid.
            if iso is not None and self.place is not None:
                self.place(pid)
                self._debug(f"qemu (host pid {pid}) joined the container's cgroup")

        return backends.hypervisor_of(plan.vm.config, iso.host_proc if iso else -1).launch(
            plan.vm.builder, plan.state_dir / "qemu.log", before_start=jail,
            preexec=iso.qemu_preexec if iso else None, incoming=incoming, settle=settle,
            paused=paused)

    def native_args(self) -> list[str] | None:
        """paracell-vmshim's arguments (csrc/vmshimexec.c), or None where this
        VM needs Python, or a resource of the shim's own, for its life:
        - a VM that is not our QEMU child (libvirt's);
        - RAM other than a template's or a checkpoint's, mapped copy-on-write:
          a RAM file of its own is freed by its owner at the end (snapshot
          mode's root disk lock is an fd, which paracell-vmshim inherits);
        - a Pager thread here (a cold boot's: a restored VM's runs in QEMU);
        - the checkpoint service;
        - any thread but this one: QEMU dies with the thread that forked it."""
        from paracell.vmm.builder import QemuChild

        plan, vm = self.plan, self.vm
        pager = plan.vm.pager
        if not isinstance(vm, QemuChild) or not plan.vm.ram.copy_on_write \
                or self.snapshots is not None \
                or (pager is not None and pager.server is not None and not pager.server.in_vmm) \
                or self.listener is None \
                or len(os.listdir("/proc/self/task")) != 1 or not VMSHIM_EXEC.exists():
            return None
        abort_fd = pager.server.abort_fd if pager and pager.server else -1
        fwd = self.forward.listeners if self.forward is not None else None
        fwd_fds = (fwd.listen4, fwd.listen6, fwd.link) if fwd is not None else (-1, -1, -1)
        log_fd = self._native_log_fd = -1
        if plan.log.path:
            with contextlib.suppress(OSError):
                log_fd = self._native_log_fd = os.open(
                    plan.log.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        lease_fd = self.lease.fileno() if self.lease is not None else -1
        fds = (self._agent_fd(), self.listener.fileno(), self.tty_fd, abort_fd, *fwd_fds, log_fd,
               lease_fd)
        if plan.vm.rootdisk is not None:
            plan.vm.rootdisk.keep_across_exec()
        for fd in fds:
            if fd >= 0:
                os.set_inheritable(fd, True)
        return [str(VMSHIM_EXEC), *map(str, fds[:4]), str(vm.pid), *map(str, fds[4:7]),
                str(signals.forward_mask()), str(log_fd), plan.log.fmt,
                "1" if plan.log.debug else "0", str(plan.state_dir / CONTROL_SOCKET),
                # Interfaces that appear before `start`: a child of it mirrors them
                # (paracell/net/latestart.py), as late.start_payload does here.
                plan.vm.config.net_record if late.may_grow(plan.vm.config) else "-",
                discover.TAP_PREFIX, sys.executable, str(lease_fd)]

    def become_native(self) -> None:
        """The shim's steady state in C, in this same pid: a relay of a few
        hundred KiB where a Python process would hold tens of MiB for as long
        as the container runs. Returns where it cannot (Python relays then)."""
        args = self.native_args()
        if args is None:
            return
        self._debug("relay running in paracell-vmshim")
        try:
            os.execv(args[0], args)
        except OSError as err:
            self._debug(f"paracell-vmshim: {err.strerror}; relaying in Python")
            if self._native_log_fd >= 0:
                os.close(self._native_log_fd)

    def relay(self) -> tuple[int, str]:
        from paracell._native import lib

        assert self.listener is not None
        self._debug("relay running")
        pager = self.plan.vm.pager
        abort_fd = pager.server.abort_fd if pager and pager.server else -1
        end = channel.run_relay(self._agent_fd(), self.listener.fileno(), self.tty_fd, abort_fd,
                                lease_fd=self.lease.fileno() if self.lease is not None else -1,
                                forward=self.forward.listeners if self.forward else None,
                                start_payload=lambda: late.start_payload(self.plan.vm.config))
        self._debug(f"relay ended: kind {end.kind}, status {end.status}, {end.message!r}")
        failure = pager.server.failure() if pager and pager.server else None
        if failure and end.kind != lib.PC_END_EXIT:
            # The guest broke the Pager's protocol: the VM is not trusted to run on.
            self.untrusted = True
            return EXIT_RUNTIME_ERROR, failure
        if end.kind == lib.PC_END_EXIT:
            return end.status & 0xFF, ""
        if end.kind == lib.PC_END_RELEASED:
            return 0, ""  # a pool's VM, ended as its holder asked by leaving
        if end.kind == lib.PC_END_HANGUP and self.vm is not None:
            code = self.vm.stop(1.0)
            message = f"{end.message} (qemu exit {code})"
            return (EXIT_VM_DIED if code == -signal.SIGKILL else EXIT_RUNTIME_ERROR), message
        return EXIT_RUNTIME_ERROR, end.message

    def _agent_takes_a_frame(self) -> bool:
        """Whether the channel has room within a second: a guest that stopped
        reading would otherwise hold the shim, and so its QEMU, in the send
        (paracell-vmshim bounds its POWEROFF the same way)."""
        import select

        waiter = select.poll()
        waiter.register(self._agent_fd(), select.POLLOUT)
        return bool(waiter.poll(POWEROFF_ROOM_WAIT_MS))

    def shutdown(self) -> None:
        """Powers the VM off and removes what only a live VM needs."""
        from paracell._native import lib

        if self.forward is not None:
            # First: from now on a client is refused rather than left waiting.
            self.forward.detach()
        if self.snapshots is not None:
            self.snapshots.close()
        if self.plan.vm.agent.host_end is not None and self.vm is not None \
                and not self.untrusted and self._agent_takes_a_frame():
            try:
                channel.send(self._agent_fd(), lib.PC_POWEROFF)
            except ParacellError:
                pass
        if self.vm is not None:
            # A hostile guest could sit out the grace period; it is killed at once.
            self.vm.stop(0 if self.untrusted else POWEROFF_GRACE_S)
            self.vm.release()
        if self.listener is not None:
            self.listener.close()
        if self.lease is not None:
            self.lease.close()
        unixsock.unlink(self.plan.state_dir / CONTROL_SOCKET)
        if self.tty_fd >= 0:
            os.close(self.tty_fd)
        self._debug("shut down")


def serve(plan: ShimPlan, handshake: Handshake, report: Callable[[str], None]) -> int:
    """Runs the shim to the end (runtime/vm/standin.py); returns the exit status."""
    shim = Shim(plan, report)
    shim.place = handshake.place
    return standin.serve(handshake, shim)
