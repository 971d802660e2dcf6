"""The runc-compatible verbs that make and end containers: create, start, run,
delete (kill is verbs/kill.py). Each verb takes the container's lock for as long as it changes
state, so concurrent verbs on one ID serialise instead of racing."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from paracell.errors import NotExistError, ParacellError
from paracell.log import rfc3339_now
from paracell.procfs import kill_same, process_start_time, wait_gone
from paracell.runtime import poolwire
from paracell.runtime.agent import channel
from paracell.runtime.agent.console import NEED_CONSOLE_SOCKET
from paracell.runtime.agent.signals import FORWARDED, SIGKILL, exit_status_for_signal
from paracell.runtime.context import Context
from paracell.runtime.state import status
from paracell.runtime.state.ids import check_id
from paracell.runtime.state.store import (
    CONTROL_SOCKET,
    STANDIN_PID_FILE,
    ContainerState,
    CorruptStateError,
    oci_state,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from paracell.runtime.snapshots.forking import ForkSource

# runc refuses such a spec at create ("process property must not be empty");
# the runtime spec only requires start to fail, which it does here.
NO_PROCESS = "cannot start container {}: process property must not be empty"

SHIM_DEATH_WAIT_S = 10.0



def _write_atomically(path: str | Path, text: str) -> None:
    target = Path(path).absolute()
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, target)


def write_pid_file(path: str, pid: int) -> None:
    """containerd reads it with Atoi and treats its appearance as 'created': bare
    decimal, no newline, renamed into place."""
    _write_atomically(path, str(pid))


def create(
    ctx: Context,
    container_id: str,
    bundle_dir: str,
    pid_file: str | None,
    console_socket: str | None,
    detach: bool = True,
    fork: ForkSource | None = None,
    pool_vm: bool = False,
) -> ContainerState:
    """The one create path: a Container in a VM of its own, or in its pod's
    (runtime/vm/placement.py), or in a VM from the warm pool
    (runtime/pod/pooled.py), or, with `fork`, in a VM that goes on from a
    checkpoint (runtime/snapshots/forking.py). It walks the layers down
    once: the bundle, the plan (which decides everything), the admission,
    the state; everything the container will hold is in the state on disk
    before any of it exists, and a failure at any step removes all of it.
    `pool_vm`: the pool's own create of a VM that waits, or of its warm-up
    (runtime/pool/)."""
    from paracell.runtime.bundle import podrole, spec
    from paracell.runtime.host import hooks
    from paracell.runtime.pod import pod, pooled
    from paracell.runtime.vm.placement import Container, OwnVm, Placement
    from paracell.xgate import admission

    store = ctx.store
    check_id(container_id)
    if poolwire.is_pool_vm(container_id) and not pool_vm:
        raise ParacellError(f"container IDs that start with {poolwire.VM_PREFIX} are the "
                            "warm pool's")
    bundle = spec.load_bundle(bundle_dir)
    hooks.check_hooks(bundle.config)
    pod_role = podrole.role(bundle.annotations, container_id)
    if pod_role.kind == "sandbox":
        podrole.refuse_host_namespaces(bundle.namespaces)
    process = bundle.config.get("process")
    terminal = bool(process and process.get("terminal"))
    if terminal and not console_socket:
        raise ParacellError(NEED_CONSOLE_SOCKET)
    if fork is not None and pod_role.kind == "member":
        raise ParacellError("a pod member cannot be forked or restored: its VM is its pod's")
    xgates_plan = admission.plan(bundle.annotations)
    claim = None
    if not pool_vm and poolwire.socket_path(ctx.root).exists():
        why_not = pooled.why_not_pooled(ctx, bundle, pod_role, fork is not None)
        kind = "" if why_not else pooled.kind_of(ctx, pooled.vm_memory_mib(bundle, pod_role))
        claim = poolwire.claim(ctx.root, kind) if kind else None
        if claim is None:
            ctx.log.info(f"create {container_id}: not from the warm pool: "
                         f"{why_not or f'no VM of its kind ({kind}) waiting'}")
    try:
        placement: Placement
        if claim is not None:
            placement = pooled.PooledSlot.plan(ctx, container_id, bundle, claim)
        elif pod_role.kind == "member":
            placement = pod.PodSlot.plan(ctx, container_id, bundle, pod_role.sandbox_id)
        else:
            placement = OwnVm.plan(ctx, container_id, bundle, pod_role, xgates_plan, fork,
                                   pool_root=ctx.root if pool_vm else "")
        # Before prepare_rootfs, which writes mount points into the rootfs: a
        # refused create leaves nothing behind, not even there.
        admission.admit(xgates_plan, placement.xgates_support, bundle.rootfs, ctx.log)
        container = Container(container_id, bundle, spec.init_launch_spec(
            container_id, bundle, xgates=xgates_plan.enabled, extra=placement.extra_records()),
            terminal, console_socket)
        spec.prepare_rootfs(bundle)
        me = os.getpid()
        state = ContainerState(
            id=container_id, bundle=str(bundle.path), status=status.CREATING,
            created=rfc3339_now(), annotations=bundle.annotations, rootfs=str(bundle.rootfs),
            creator_pid=me, creator_start=process_start_time(me) or 0,
            hooks=bundle.config.get("hooks") or {}, has_process=process is not None,
            vm=placement.record(), pool_vm=claim.vm_id if claim is not None else "",
        )
        lock_fd = store.create(state)
    except BaseException:
        if claim is not None:
            claim.release()
            _delete_pool_vm(ctx, claim.vm_id)
        raise
    spawned = None
    try:
        placement.provision(ctx)
        ctx.log.info(f"create {container_id}: {placement.describe()}")
        hooks.run_hooks(state.hooks, "prestart", oci_state(state))
        hooks.run_hooks(state.hooks, "createRuntime", oci_state(state))
        for warning in bundle.warnings:
            ctx.log.warning(warning)
        spawned = placement.spawn(ctx, container, detach)
        if spawned.ready.error:
            raise ParacellError(spawned.ready.error)
        state.shim_pid = spawned.pid
        state.shim_start = process_start_time(spawned.pid) or 0
        placement.spawned(state, spawned)
        state.status = status.CREATED
        _write_atomically(store.path(container_id, STANDIN_PID_FILE),
                          f"{state.shim_pid} {state.shim_start}")
        store.save(state)
        spawned.commit()
        if pid_file:
            write_pid_file(pid_file, spawned.pid)
    except BaseException:
        if spawned is not None:
            spawned.abandon()
        if claim is not None:
            claim.release()
        _destroy(ctx, state)
        raise
    finally:
        os.close(lock_fd)
    for notice in placement.notices():
        ctx.log.warning(notice)
    return state


def start(ctx: Context, container_id: str) -> None:
    from paracell._native import lib
    from paracell.runtime.host import hooks

    store = ctx.store
    with store.locked(container_id):
        state = store.load(container_id)
        target = status.transition("start", state.status, container_id)
        try:
            if not state.has_process:
                raise ParacellError(NO_PROCESS.format(container_id))
            # Recorded before the process may run: a state that cannot be
            # written (a full filesystem) fails the start with nothing run.
            state.status = target
            store.save(state)
            # The shim adds what appeared in its network namespace since
            # create (ctr run --cni): it is the process that sits there.
            channel.control_request(store.dir(container_id) / CONTROL_SOCKET, lib.PC_START)
        except BaseException:
            # As runc: a start that failed leaves a stopped container, and
            # here no VM. The record, settled by its dead shim, reads stopped.
            _stop_vm(state)
            raise
    hooks.run_hooks(state.hooks, "poststart", oci_state(state))


def _kill_shim(state: ContainerState) -> None:
    kill_same(state.shim_pid, state.shim_start, SIGKILL)


def _wait_shim_gone(state: ContainerState) -> None:
    wait_gone(state.shim_pid, state.shim_start, SHIM_DEATH_WAIT_S)


def delete(ctx: Context, container_id: str, force: bool) -> None:
    store = ctx.store
    if not force:
        # A create in progress holds the lock until its VM is up: answer now,
        # from the state it wrote first, as runc does, rather than wait.
        peek = store.load(container_id)
        if status.is_creating(peek.status):
            status.transition("delete", peek.status, container_id)
    try:
        with store.locked(container_id):
            try:
                state = store.load(container_id)
            except CorruptStateError:
                if not force:
                    raise
                _salvage(ctx, container_id)
                return
            status.transition("delete --force" if force else "delete", state.status,
                              container_id)
            _destroy(ctx, state)
    except NotExistError:
        if not force:
            raise
        store.remove_stale(container_id)
        # A create of this ID killed before its directory appeared left a
        # temporary one, which no ID names: it goes too.
        store.sweep_abandoned()
    except CorruptStateError:
        # The lock itself is broken (a directory, missing): nothing to take.
        if not force:
            raise
        _salvage(ctx, container_id)


def _salvage(ctx: Context, container_id: str) -> None:
    """delete --force of a container whose state is unreadable: its VM and
    resources are found from what exists (runtime/verbs/salvage.py)."""
    from paracell.runtime.verbs import salvage
    from paracell.vmm import hostshare, memory

    store = ctx.store
    state_dir = store.dir(container_id)
    found = salvage.reclaim(state_dir, memory.path_for(ctx.root, container_id),
                            state_dir / CONTROL_SOCKET, state_dir / STANDIN_PID_FILE,
                            container_id)
    # The host shares' binds live in the state directory: unmounted before
    # anything there is removed, so nothing behind them is ever deleted.
    hostshare.remove_tree(state_dir)
    store.remove(container_id)
    ctx.log.warning(f"delete --force {container_id}: its state was unreadable; removed "
                    f"{', '.join(found) or 'no running process'} and its state directory")


def _stop_vm(state: ContainerState) -> None:
    """Ends the shim and its VM and frees the VM's devices (RAM file, shares);
    the state and the host cgroups stay for delete."""
    from paracell.runtime.vm.teardown import reclaim

    _kill_shim(state)
    _wait_shim_gone(state)
    kill_same(state.vm.qemu_pid, state.vm.qemu_start, SIGKILL)
    reclaim(state.vm.reclaim)


def _destroy(ctx: Context, state: ContainerState) -> None:
    """Kills whatever still runs and removes every file and mount the container had."""
    from paracell.runtime.host import cgroups, hooks
    from paracell.vmm import memory

    _stop_vm(state)
    if state.pool_vm:
        # Its container's proxy is gone, and with it the VM's lease.
        _delete_pool_vm(ctx, state.pool_vm)
    cgroups.reclaim(state.vm.host.cgroups)
    # By its name too: a record that lost its device entry must not leak it.
    memory.remove(memory.path_for(ctx.root, state.id))
    was_started = not status.is_creating(state.status)
    state.status = status.STOPPED
    ctx.store.remove(state.id)
    if was_started:
        try:
            hooks.check_hooks({"hooks": state.hooks})
            hooks.run_hooks(state.hooks, "poststop", oci_state(state))
        except ParacellError as err:
            ctx.log.error(f"poststop hook: {err}", to_stderr=False)


def _delete_pool_vm(ctx: Context, vm_id: str) -> None:
    """A pooled VM that a container took goes with the container."""
    try:
        delete(ctx, check_id(vm_id), force=True)
    except ParacellError as err:
        ctx.log.warning(f"deleting pooled VM {vm_id}: {err}")


def run(
    ctx: Context,
    container_id: str,
    bundle_dir: str,
    pid_file: str | None,
    console_socket: str | None,
    detach: bool,
    keep: bool,
    pool_vm: bool = False,
) -> int:
    state = create(ctx, container_id, bundle_dir, pid_file, console_socket, detach=detach,
                   pool_vm=pool_vm)
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
        return exit_status_for_signal(os.WTERMSIG(raw))
    return os.WEXITSTATUS(raw)
