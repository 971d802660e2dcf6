"""The per-container host shim: owns the VM, and its pid stands for the container.

containerd and conmon wait on this pid and signal it, so it lives as long as
the container, forwards the signals it gets, and exits with the container's
status. While it runs, the C relay moves stdio and serves exec proxies and
control requests (start, kill) on `shim.sock`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from paracell.errors import ParacellError
from paracell.runtime import channel, console, hostshare, signals, spawn
from paracell.runtime.spec import Bundle
from paracell.runtime.state import process_start_time
from paracell.vmm import machine, memory
from paracell.vmm.qemu import VmSpec

BOOT_TIMEOUT_S = 60.0
POWEROFF_GRACE_S = 5.0
EXIT_VM_DIED = 128 + signal.SIGKILL
EXIT_RUNTIME_ERROR = 255


@dataclass
class ShimPlan:
    state_dir: Path
    bundle: Bundle
    launch_spec: bytes
    engine: str
    qemu: str
    kernel: Path
    initramfs: Path
    memory_file: Path
    memory_mib: int
    vcpus: int
    console_socket: str | None
    terminal: bool


class Shim:
    def __init__(self, plan: ShimPlan) -> None:
        self.plan = plan
        self.vm: subprocess.Popen[bytes] | None = None
        self.agent: socket.socket | None = None
        self.listener: socket.socket | None = None
        self.tty_fd = -1

    def boot(self) -> str:
        """Everything up to a created (not yet started) process; returns the ready line."""
        from paracell._native import lib

        plan = self.plan
        d = plan.state_dir
        share = hostshare.mount_binds(d, plan.bundle.host_binds)
        memory.create_at(plan.memory_file, plan.memory_mib)
        shim_end, vm_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        qmp = channel.listen_unix(d / "qmp.sock")
        self.listener = channel.listen_unix(d / "shim.sock")
        self.agent = shim_end
        spec = VmSpec(
            qemu=plan.qemu, engine=plan.engine, kernel=plan.kernel, initramfs=plan.initramfs,
            memory_mib=plan.memory_mib, vcpus=plan.vcpus, memory_file=plan.memory_file,
            rootfs=plan.bundle.rootfs, rootfs_readonly=plan.bundle.rootfs_readonly,
            console_log=d / "console.log", agent_fd=vm_end.fileno(), qmp_fd=qmp.fileno(),
            hostshare=share,
        )
        try:
            self.vm = machine.launch(spec, d / "qemu.log")
        finally:
            vm_end.close()
            qmp.close()
        fd = shim_end.fileno()
        frame = channel.recv(fd, BOOT_TIMEOUT_S, "booting the micro-VM")
        if frame.type != lib.PC_READY:
            raise ParacellError(f"agent protocol violation: expected READY, got {frame.type}")
        channel.send(fd, lib.PC_SPEC, 0, plan.launch_spec)
        channel.expect_created(fd, BOOT_TIMEOUT_S)
        if plan.terminal:
            self.tty_fd = console.open_for_container(plan.console_socket)
            # The caller's fds 0-2 are not the container's stdio now, and a
            # caller may wait for EOF on them (go-runc does) before create returns.
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.close(devnull)
        start = process_start_time(self.vm.pid) or 0
        # From the moment the pid is published, `kill` may signal us: hold
        # the signals until the relay's signalfd picks them up.
        signal.pthread_sigmask(signal.SIG_BLOCK, signals.FORWARDED)
        return f"ok {os.getpid()} {self.vm.pid} {start}"

    def relay(self) -> tuple[int, str]:
        from paracell._native import lib

        end = channel.run_relay(self.agent.fileno(), self.listener.fileno(), self.tty_fd)
        message = end.message
        if end.kind == lib.PC_END_EXIT:
            return end.status & 0xFF, ""
        if end.kind == lib.PC_END_HANGUP and self.vm is not None:
            code = machine.stop(self.vm, 1.0)
            message = f"{message} (qemu exit {code})"
            return (EXIT_VM_DIED if code == -signal.SIGKILL else EXIT_RUNTIME_ERROR), message
        return EXIT_RUNTIME_ERROR, message

    def shutdown(self) -> None:
        """Powers the VM off and removes what only a live VM needs."""
        from paracell._native import lib

        if self.agent is not None:
            try:
                channel.send(self.agent.fileno(), lib.PC_POWEROFF)
            except ParacellError:
                pass
        if self.vm is not None:
            machine.stop(self.vm, POWEROFF_GRACE_S)
        for sock in (self.agent, self.listener):
            if sock is not None:
                sock.close()
        if self.tty_fd >= 0:
            os.close(self.tty_fd)
        release_vm_files(self.plan.state_dir, self.plan.memory_file)


def release_vm_files(state_dir: Path, memory_file: Path) -> None:
    """Idempotent cleanup shared by the shim's exit and `delete`."""
    for name in ("qmp.sock", "shim.sock"):
        try:
            os.unlink(state_dir / name)
        except FileNotFoundError:
            pass
    hostshare.unmount_binds(state_dir)
    memory.remove(memory_file)


def serve(plan: ShimPlan, ready_fd: int, report: Callable[[str], None]) -> int:
    """Runs the shim to the end; returns the exit status."""
    shim = Shim(plan)
    try:
        line = shim.boot()
    except (ParacellError, OSError) as err:
        text = str(err) if isinstance(err, ParacellError) else f"starting the VM: {err}"
        spawn.report_ready(ready_fd, f"error {text}")
        shim.shutdown()
        return EXIT_RUNTIME_ERROR
    try:
        spawn.report_ready(ready_fd, line)
    except OSError:
        # `create` died before it could record us: nobody would ever delete
        # this container, so it must not keep running.
        shim.shutdown()
        return EXIT_RUNTIME_ERROR
    status, message = shim.relay()
    if message:
        report(message)
    shim.shutdown()
    return status
