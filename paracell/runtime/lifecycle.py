"""The runc-compatible verbs that make and end containers: create, start, run,
kill, delete. Each verb takes the container's lock for as long as it changes
state, so concurrent verbs on one ID serialise instead of racing."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from paracell.errors import NotExistError, NotRunningError, ParacellError
from paracell.runtime import channel
from paracell.runtime.console import NEED_CONSOLE_SOCKET
from paracell.runtime.ids import check_id
from paracell.runtime.log import RuntimeLog, rfc3339_now
from paracell.runtime.signals import FORWARDED
from paracell.runtime.state import (
    ContainerState,
    StateStore,
    oci_state,
    process_start_time,
    shim_alive,
)

SHIM_DEATH_WAIT_S = 10.0


@dataclass
class Context:
    root: str
    log: RuntimeLog
    engine: str = "auto"

    @property
    def store(self) -> StateStore:
        return StateStore(self.root)


def write_pid_file(path: str, pid: int) -> None:
    """containerd reads it with Atoi and treats its appearance as 'created': bare
    decimal, no newline, renamed into place."""
    target = Path(path).absolute()
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(str(pid))
    os.replace(tmp, target)


def _choose_engine(ctx: Context) -> tuple[str, str, str | None]:
    from paracell.vmm import probe

    facts = probe.probe_host()
    if facts.qemu_path is None:
        raise ParacellError(f"{probe.QEMU_BINARY} not found: install qemu-system-x86")
    choice = probe.choose_engine(ctx.engine, facts)
    return choice.engine, facts.qemu_path, choice.notice


def create(
    ctx: Context,
    container_id: str,
    bundle_dir: str,
    pid_file: str | None,
    console_socket: str | None,
    detach: bool = True,
) -> ContainerState:
    from paracell import settings
    from paracell.guest import artifacts
    from paracell.runtime import hooks, shim, spawn, spec
    from paracell.runtime.shim import ShimPlan
    from paracell.vmm import memory

    store = ctx.store
    check_id(container_id)
    bundle = spec.load_bundle(bundle_dir)
    hooks.check_hooks(bundle.config)
    launch = spec.init_launch_spec(container_id, bundle)
    spec.prepare_rootfs(bundle)
    terminal = bool(bundle.config["process"].get("terminal"))
    if terminal and not console_socket:
        raise ParacellError(NEED_CONSOLE_SOCKET)
    guest = artifacts.current()
    engine, qemu, notice = _choose_engine(ctx)
    state_dir = store.create_dir(container_id)
    state = ContainerState(
        id=container_id, bundle=str(bundle.path), status="creating", created=rfc3339_now(),
        annotations=bundle.annotations, rootfs=str(bundle.rootfs),
        memory_file=str(memory.path_for(ctx.root, container_id)),
        # Kept here: poststart/poststop must run even if the bundle has
        # changed or gone by then.
        config_extra={"hooks": bundle.config.get("hooks") or {}},
    )
    try:
        with store.locked(container_id, must_exist=False):
            store.save(state)
            hooks.run_hooks(bundle.config, "prestart", oci_state(state))
            hooks.run_hooks(bundle.config, "createRuntime", oci_state(state))
            plan = ShimPlan(
                state_dir=state_dir, bundle=bundle, launch_spec=launch, engine=engine, qemu=qemu,
                kernel=guest.kernel, initramfs=guest.initramfs,
                memory_file=Path(state.memory_file), memory_mib=settings.guest_memory_mib(),
                vcpus=1, console_socket=console_socket, terminal=terminal,
            )
            shim_pid, line = spawn.spawn(
                lambda ready_fd: shim.serve(plan, ready_fd, ctx.log.background_error),
                detach, ctx.log.background_error,
            )
            problem = spawn.ready_error(line)
            if problem:
                raise ParacellError(problem)
            state.shim_pid = shim_pid
            state.shim_start = process_start_time(shim_pid) or 0
            state.status = "created"
            _, _, qemu_pid, qemu_start = line.split()[:4]
            state.config_extra.update(qemu_pid=int(qemu_pid), qemu_start=int(qemu_start))
            store.save(state)
            if pid_file:
                write_pid_file(pid_file, shim_pid)
    except BaseException:
        _destroy(ctx, state)
        raise
    if notice:
        # Only once the container exists, so that a failure stays one line.
        print(notice, file=sys.stderr)
    return state


def start(ctx: Context, container_id: str) -> None:
    from paracell.runtime import hooks

    store = ctx.store
    with store.locked(container_id):
        state = store.load(container_id)
        if state.status == "stopped":
            raise ParacellError("cannot start a container that has stopped")
        if state.status != "created":
            raise ParacellError(f"cannot start a container in the {state.status} state")
        from paracell._native import lib

        channel.control_request(store.dir(container_id) / "shim.sock", lib.PC_START)
        state.status = "running"
        store.save(state)
    hooks.run_hooks(state.config_extra, "poststart", oci_state(state))


def kill(ctx: Context, container_id: str, sig: int, all_processes: bool) -> None:
    store = ctx.store
    with store.locked(container_id):
        state = store.load(container_id)
        if state.status not in ("created", "running", "paused"):
            raise NotRunningError()
        if sig in FORWARDED and not all_processes:
            # The shim relays what it receives; no socket round trip needed.
            os.kill(state.shim_pid, sig)
            return
        if sig == signal.SIGKILL:
            # SIGKILL must not depend on the guest's cooperation (it may be
            # paused, wedged or hostile): the shim dies, its VM with it, and
            # waiters see death by SIGKILL, 137, as with runc.
            _kill_shim(state)
            return
        from paracell._native import lib

        channel.control_request(store.dir(container_id) / "shim.sock", lib.PC_SIGNAL,
                                channel.encode_signal(sig, all_processes))


def _kill_shim(state: ContainerState) -> None:
    if shim_alive(state):
        try:
            os.kill(state.shim_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _wait_shim_gone(state: ContainerState) -> None:
    deadline = time.monotonic() + SHIM_DEATH_WAIT_S
    while shim_alive(state) and time.monotonic() < deadline:
        time.sleep(0.02)


def delete(ctx: Context, container_id: str, force: bool) -> None:
    store = ctx.store
    try:
        with store.locked(container_id):
            state = store.load(container_id)
            if state.status in ("running", "paused") and not force:
                raise ParacellError(
                    f"cannot delete container {container_id} that is not stopped: {state.status}"
                )
            _destroy(ctx, state)
    except NotExistError:
        if not force:
            raise


def _destroy(ctx: Context, state: ContainerState) -> None:
    """Kills whatever still runs and removes every file and mount the container had."""
    from paracell.runtime import hooks
    from paracell.runtime.shim import release_vm_files
    from paracell.vmm import machine

    _kill_shim(state)
    _wait_shim_gone(state)
    extra = state.config_extra
    machine.kill_pid(int(extra.get("qemu_pid", 0)), int(extra.get("qemu_start", 0)))
    state_dir = ctx.store.dir(state.id)
    release_vm_files(state_dir, Path(state.memory_file))
    was_started = state.status != "creating"
    state.status = "stopped"
    shutil.rmtree(state_dir, ignore_errors=True)
    if was_started:
        try:
            hooks.run_hooks(extra, "poststop", oci_state(state))
        except ParacellError as err:
            ctx.log.error(f"poststop hook: {err}", to_stderr=False)


def run(
    ctx: Context,
    container_id: str,
    bundle_dir: str,
    pid_file: str | None,
    console_socket: str | None,
    detach: bool,
    keep: bool,
) -> int:
    state = create(ctx, container_id, bundle_dir, pid_file, console_socket, detach=detach)
    try:
        start(ctx, container_id)
    except BaseException:
        delete(ctx, container_id, force=True)
        raise
    if detach:
        return 0
    status = wait_child(state.shim_pid)
    if not keep:
        delete(ctx, container_id, force=True)
    return status


def wait_child(pid: int) -> int:
    """Waits for a foreground shim or proxy, passing on the signals meant for
    the container; the handlers go once the pid is reaped and may be reused."""
    previous = {sig: signal.signal(sig, lambda signum, _frame: os.kill(pid, signum))
                for sig in FORWARDED}
    try:
        _, raw = os.waitpid(pid, 0)  # retried on EINTR by Python itself
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if os.WIFSIGNALED(raw):
        return 128 + os.WTERMSIG(raw)
    return os.WEXITSTATUS(raw)
