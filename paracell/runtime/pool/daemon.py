"""`paracell pool serve`: keeps VMs restored and attached for the creates of
one --root to take (docs/pool.md), of one kind or several: a kind is what a
create's own VM would have been (pod/pooled.py: kind_of), here its size.

One process, one thread: a poll loop over the pool's socket and the leases
of the VMs that wait. A VM is made by a forked worker that runs the one
create path (`lifecycle.create(pool_vm=True)`), so the loop never waits for
a boot. The VM's shim takes its lease on the pool's socket as it starts; the
VM waits once its worker has recorded it and its lease is here. A claim
hands that lease to the create that takes the VM.

What bounds the pool: its size, per kind; a memory budget, for all kinds, against each waiting VM's
measured PSS (its shim and QEMU); and the host's available memory, below
which waiting VMs are ended, newest first, and none are made.

When the daemon ends, however it ends, its waiting VMs end with it: their
shims see their leases close and power off, and a janitor (a forked child
that outlives the daemon only for this) deletes every VM the daemon made
and did not hand out. The VMs it handed out are their containers'.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import select
import signal
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from paracell import unixsock
from paracell.errors import ParacellError
from paracell.runtime import poolwire
from paracell.runtime.context import Context
from paracell.runtime.pool import bundles

TICK_S = 0.25
CLIENT_TIMEOUT_S = 1.0
# Before a VM has been measured: about a restored VM's PSS (docs/benchmarks.md).
FIRST_ESTIMATE_MIB = 64
BACKOFF_S = (2.0, 60.0)
ORPHAN_CHECK_S = 2.0
# How often a waiting VM's PSS is read again (smaps_rollup walks QEMU's maps).
MEASURE_S = 2.0


# A pod VM's bounds (runtime/bundle/podrole.py: pod_memory_mib).
MEMORY_MIB_MIN, MEMORY_MIB_MAX = 64, 65536
MAX_SHAPES = 8


@dataclass
class PoolSettings:
    size: int  # of each shape
    budget_mib: int
    min_available_mib: int
    shapes: tuple[int, ...]  # the VMs' memory sizes, in MiB: one kind each

    def check(self) -> None:
        if not 1 <= len(self.shapes) <= MAX_SHAPES:
            raise ParacellError(f"a pool keeps 1 to {MAX_SHAPES} sizes of VM, "
                                f"not {len(self.shapes)}")
        for memory_mib in self.shapes:
            if not MEMORY_MIB_MIN <= memory_mib <= MEMORY_MIB_MAX:
                raise ParacellError(f"pooled VM memory of {memory_mib} MiB is outside "
                                    f"{MEMORY_MIB_MIN}..{MEMORY_MIB_MAX}")
        if not 0 <= self.size <= 64:
            raise ParacellError(f"pool size {self.size} is outside 0..64")
        if not 16 <= self.budget_mib <= 1 << 20:
            raise ParacellError(f"pool budget of {self.budget_mib} MiB is outside 16..1048576")
        if not 0 <= self.min_available_mib <= 1 << 20:
            raise ParacellError(f"minimum available memory of {self.min_available_mib} MiB "
                                "is outside 0..1048576")


@dataclass
class PooledVm:
    id: str
    kind: str
    worker: int = 0  # the pid of the create making it; 0 once it is made
    made: bool = False
    lease: socket.socket | None = None
    lease_pid: int = 0  # who took the lease (SO_PEERCRED), checked against the record
    pids: tuple[int, ...] = ()  # its shim and QEMU, once made
    cost_kib: int = 0
    since: float = field(default_factory=time.monotonic)

    @property
    def waiting(self) -> bool:
        return self.made and self.lease is not None


def available_mib() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    return 0


def pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def peer(sock: socket.socket) -> tuple[int, int]:
    """The connecting process's pid and uid."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", raw)
    return pid, uid


class Pool:
    def __init__(self, ctx: Context, settings: PoolSettings, kinds: dict[str, int]) -> None:
        """kinds: each kind the pool keeps, with its VMs' memory in MiB."""
        from paracell import settings as operator_settings

        settings.check()
        if not operator_settings.warm_pool_enabled():
            raise ParacellError(f"the warm pool is off: \"warm_pool\": false in "
                                f"{operator_settings.config_path()}")
        if ctx.no_template or not operator_settings.templates_default():
            raise ParacellError("the warm pool keeps VMs restored from templates, which are off "
                                "(--no-template, or \"templates\": false)")
        backend = ctx.backend({})
        if not backend.capabilities.templates:
            raise ParacellError(f"the warm pool keeps VMs restored from templates, which the "
                                f"{backend.name} backend does not save (--vmm qemu)")
        self.ctx, self.settings, self.kinds = ctx, settings, kinds
        self.dir = poolwire.pool_dir(ctx.root)
        self.vms: dict[str, PooledVm] = {}
        self.claimed = 0
        # Handed-out VMs, by ID, with when: until a container's delete takes
        # each, or it is found orphaned (runtime/pool/daemon.py: _orphans).
        self.handed: dict[str, float] = {}
        self.next_orphan_check = 0.0
        self.next_measure = 0.0
        self.failures = 0
        self.next_try = 0.0
        self.last_error = ""
        self.largest_kib = FIRST_ESTIMATE_MIB << 10
        self.janitor_w = -1
        self.wake_r = -1
        self.stopping = False

    # -- the loop ---------------------------------------------------------

    def serve(self) -> None:
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = os.open(self.dir / poolwire.LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock)
            raise ParacellError(f"a pool already serves {self.ctx.root}") from None
        listener = None
        try:
            for memory_mib in self.kinds.values():
                bundles.write_vm_bundle(self.dir, memory_mib)
            self._sweep()
            self._start_janitor()
            path = poolwire.socket_path(self.ctx.root)
            unixsock.unlink(path)
            listener = unixsock.listen(path)
            os.chmod(path, 0o600)
            # A stop wakes the loop at once, not at its next tick: a worker
            # is stopped where it is, and what it made goes.
            self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            signal.set_wakeup_fd(wake_w)
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._stop)
            self._say(f"serving {self.ctx.root}: {self.settings.size} VM(s) of each of "
                      f"{', '.join(self.kinds)}, "
                      f"budget {self.settings.budget_mib} MiB, ending VMs below "
                      f"{self.settings.min_available_mib} MiB available")
            while not self.stopping:
                self._tick(listener)
        finally:
            if listener is not None:
                listener.close()
            self._end_all()
            remove_pool_dir(self.ctx.root)
            os.close(lock)

    def _stop(self, _signum: int, _frame: object) -> None:
        self.stopping = True

    def _tick(self, listener: socket.socket) -> None:
        self._reap_workers()
        self._keep_within_memory()
        self._refill()
        self._orphans()
        poller = select.poll()
        poller.register(listener, select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        by_fd = {}
        for vm in self.vms.values():
            if vm.lease is not None:
                poller.register(vm.lease, select.POLLIN | select.POLLRDHUP)
                by_fd[vm.lease.fileno()] = vm
        try:
            events = poller.poll(TICK_S * 1000)
        except InterruptedError:
            return
        for fd, _ in events:
            if fd == self.wake_r:
                with contextlib.suppress(BlockingIOError):
                    os.read(self.wake_r, 64)
            elif fd == listener.fileno():
                self._accept(listener)
            elif fd in by_fd:
                # Nothing is sent on a lease: its shim is gone (deleted by hand, broken).
                vm = by_fd[fd]
                self._say(f"{vm.id}: its shim ended while it waited")
                self._end(vm)

    # -- making VMs -------------------------------------------------------

    def _refill(self) -> None:
        if self.stopping or any(vm.worker for vm in self.vms.values()):
            return  # one at a time: a boot takes the host's CPUs
        kind = self._shortest_kind()
        if kind is None or time.monotonic() < self.next_try:
            return
        if available_mib() < self.settings.min_available_mib:
            return
        if self._cost_kib() + self.largest_kib > self.settings.budget_mib << 10:
            return
        vm_id = poolwire.VM_PREFIX + secrets.token_hex(6)
        self._tell_janitor(f"made {vm_id}")
        pid = os.fork()
        if pid == 0:
            self._worker(vm_id, self.kinds[kind])  # never returns
        self.vms[vm_id] = PooledVm(vm_id, kind, worker=pid)

    def _shortest_kind(self) -> str | None:
        """The kind with the fewest VMs, made or being made, where that is
        under the size; the first named wins a tie."""
        held = {kind: 0 for kind in self.kinds}
        for vm in self.vms.values():
            held[vm.kind] += 1
        kind = min(held, key=held.__getitem__)
        return kind if held[kind] < self.settings.size else None

    def _worker(self, vm_id: str, memory_mib: int) -> None:
        status = 1
        try:
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1):
                os.dup2(devnull, fd)
            os.closerange(3, 65536)  # leases, the listener, the janitor's pipe
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, signal.SIG_DFL)
            from paracell.runtime.verbs import lifecycle

            lifecycle.create(self.ctx, vm_id, str(bundles.vm_bundle(self.dir, memory_mib)),
                             None, None, detach=True, pool_vm=True)
            lifecycle.start(self.ctx, vm_id)
            bundles.warm_up(self.ctx, self.dir, vm_id)
            status = 0
        except ParacellError as err:
            self.ctx.log.error(f"pool: making {vm_id}: {err}")
        except BaseException as err:  # a worker never returns into the loop
            self.ctx.log.error(f"pool: making {vm_id}: {type(err).__name__}: {err}")
        finally:
            os._exit(status)

    def _reap_workers(self) -> None:
        for vm in list(self.vms.values()):
            if not vm.worker:
                continue
            try:
                pid, raw = os.waitpid(vm.worker, os.WNOHANG)
            except ChildProcessError:
                pid, raw = vm.worker, 1 << 8
            if pid == 0:
                continue
            vm.worker = 0
            if os.waitstatus_to_exitcode(raw) != 0:
                self._failed(vm, "its create failed (the log says why)")
                continue
            self._made(vm)

    def _made(self, vm: PooledVm) -> None:
        """Its create has recorded it: its shim must be the one that took its lease."""
        try:
            state = self.ctx.store.load(vm.id)
        except ParacellError as err:
            self._failed(vm, str(err))
            return
        if vm.lease is None or vm.lease_pid != state.shim_pid:
            self._failed(vm, "its lease was not taken by its shim")
            return
        vm.made, vm.pids = True, (state.shim_pid, state.vm.qemu_pid)
        vm.cost_kib = sum(pss_kib(pid) for pid in vm.pids)
        self.failures, self.last_error = 0, ""
        made_in = f"{time.monotonic() - vm.since:.2f} s"
        if state.vm.template.startswith("saved"):
            # It booted cold to save the template: one restored from the
            # template shares its pages and costs far less.
            self._say(f"{vm.id} booted cold in {made_in} ({vm.cost_kib / 1024:.1f} MiB): "
                      "replaced by one restored from its template")
            self._end(vm)
            return
        self.largest_kib = max(self.largest_kib, vm.cost_kib)
        self._say(f"{vm.id} waits, {vm.kind}: {vm.cost_kib / 1024:.1f} MiB, made in {made_in}")

    def _failed(self, vm: PooledVm, why: str) -> None:
        self.failures += 1
        self.last_error = f"{vm.id}: {why}"
        self.next_try = time.monotonic() + min(BACKOFF_S[0] * 2 ** (self.failures - 1),
                                               BACKOFF_S[1])
        self._say(f"{vm.id} failed: {why}")
        self._end(vm)

    def _orphans(self) -> None:
        """A VM handed out that no container names and whose shim is gone:
        the create that took it died before it recorded it (its lease died
        with it, and the VM powered off). Its state goes. A create records
        the VM before it can let go of the lease, so one that names it, or
        a VM still running, is never taken for an orphan."""
        from paracell.runtime.state.store import shim_alive

        now = time.monotonic()
        if not self.handed or now < self.next_orphan_check:
            return
        self.next_orphan_check = now + ORPHAN_CHECK_S
        store = self.ctx.store
        named = set()
        for other in store.list_ids():
            if other not in self.handed:
                with contextlib.suppress(ParacellError):
                    named.add(store.load(other).pool_vm)
        for vm_id, since in list(self.handed.items()):
            try:
                state = store.load(vm_id)
            except ParacellError:
                del self.handed[vm_id]  # deleted with its container
                continue
            if vm_id in named or shim_alive(state) or now - since < ORPHAN_CHECK_S:
                continue
            del self.handed[vm_id]
            self._say(f"{vm_id}: handed out, but no container took it: deleted")
            delete_vm(self.ctx, vm_id, self._say)

    # -- bounds -----------------------------------------------------------

    def _cost_kib(self) -> int:
        return sum(vm.cost_kib if vm.made else self.largest_kib for vm in self.vms.values())

    def _keep_within_memory(self) -> None:
        """Newest first: ends waiting VMs while the host is short of memory
        or they cost more than the budget (a first estimate was low)."""
        waiting = sorted((vm for vm in self.vms.values() if vm.waiting),
                         key=lambda vm: vm.since, reverse=True)
        now = time.monotonic()
        if now >= self.next_measure:
            self.next_measure = now + MEASURE_S
            for vm in waiting:
                vm.cost_kib = sum(pss_kib(pid) for pid in vm.pids) or vm.cost_kib
        for vm in waiting:
            short = available_mib() < self.settings.min_available_mib
            over = self._cost_kib() > self.settings.budget_mib << 10
            if not (short or over):
                break
            self._say(f"{vm.id} ended: {'the host is short of memory' if short else 'over budget'}")
            self._end(vm)

    # -- clients ----------------------------------------------------------

    def _accept(self, listener: socket.socket) -> None:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        keep = False
        try:
            conn.settimeout(CLIENT_TIMEOUT_S)
            pid, uid = peer(conn)
            if uid not in (0, os.getuid()):
                return
            message, _ = poolwire.receive(conn)
            if "lease" in message:
                keep = self._lease(conn, pid, message["lease"])
            elif "claim" in message:
                self._claim(conn, message["claim"])
            elif "status" in message:
                poolwire.send(conn, self.status())
        except (OSError, ParacellError):
            pass
        finally:
            if not keep:
                conn.close()

    def _lease(self, conn: socket.socket, pid: int, vm_id: object) -> bool:
        vm = self.vms.get(vm_id) if isinstance(vm_id, str) else None
        if vm is None or vm.lease is not None or not vm.worker:
            return False
        conn.settimeout(None)
        vm.lease, vm.lease_pid = conn, pid
        return True

    def _claim(self, conn: socket.socket, kind: object) -> None:
        waiting = [vm for vm in self.vms.values() if vm.waiting and vm.kind == kind]
        if not waiting:
            poolwire.send(conn, {"id": poolwire.NONE_WAITING})
            return
        vm = min(waiting, key=lambda vm: vm.since)
        assert vm.lease is not None
        # The janitor hears first: from now on the VM is its container's.
        self._tell_janitor(f"claimed {vm.id}")
        try:
            poolwire.send(conn, {"id": vm.id}, fds=(vm.lease.fileno(),))
        except OSError:
            self._end(vm)  # the claimant is gone: so is the VM
            return
        # Sent: the container's now. Ours would keep the VM past it.
        vm.lease.close()
        vm.lease = None
        del self.vms[vm.id]
        self.claimed += 1
        self.handed[vm.id] = time.monotonic()
        self._say(f"{vm.id} claimed after {time.monotonic() - vm.since:.1f} s")

    def status(self) -> dict[str, object]:
        now = time.monotonic()
        return {
            "root": self.ctx.root, "kinds": list(self.kinds), "size": self.settings.size,
            "budget_mib": self.settings.budget_mib,
            "min_available_mib": self.settings.min_available_mib,
            "available_mib": available_mib(), "claimed": self.claimed,
            "cost_mib": round(self._cost_kib() / 1024, 1),
            "vms": [{"id": vm.id, "kind": vm.kind,
                     "state": "waiting" if vm.waiting else "making",
                     "cost_mib": round(vm.cost_kib / 1024, 1), "age_s": round(now - vm.since, 1)}
                    for vm in self.vms.values()],
            "last_error": self.last_error,
        }

    # -- ending -----------------------------------------------------------

    def _end(self, vm: PooledVm) -> None:
        """Its lease closes (its shim powers the VM off), and its state goes."""

        self.vms.pop(vm.id, None)
        if vm.lease is not None:
            vm.lease.close()
            vm.lease = None
        if vm.worker:
            with contextlib.suppress(ProcessLookupError):
                os.kill(vm.worker, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(vm.worker, 0)
        delete_vm(self.ctx, vm.id, self._say)

    def _end_all(self) -> None:
        ending = list(self.vms.values())
        for vm in ending:
            self._end(vm)
        self._say(f"stopped: {len(ending)} VM(s) ended, {self.claimed} handed out")
        if self.janitor_w >= 0:
            self._tell_janitor("done")
            os.close(self.janitor_w)

    def _sweep(self) -> None:
        """Pooled VMs that an earlier pool of this root left and that no
        container took: deleted."""
        from paracell.runtime.verbs import lifecycle

        store = self.ctx.store
        taken = set()
        ids = store.list_ids()
        for other in ids:
            with contextlib.suppress(ParacellError):
                taken.add(store.load(other).pool_vm)
        for vm_id in ids:
            if poolwire.is_pool_vm(vm_id) and vm_id not in taken:
                with contextlib.suppress(ParacellError):
                    lifecycle.delete(self.ctx, vm_id, force=True)

    # -- the janitor ------------------------------------------------------

    def _start_janitor(self) -> None:
        read_end, self.janitor_w = os.pipe()
        pid = os.fork()
        if pid != 0:
            os.close(read_end)
            return
        status = 0
        try:
            os.closerange(3, read_end)
            os.closerange(read_end + 1, 65536)  # the pool's lock too: it must not outlive us
            # A ^C or `pkill -f 'pool serve'` is for the daemon: the janitor
            # ends when the daemon has, and cleans up after it if need be.
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_IGN)
            os.setsid()
            janitor(self.ctx, read_end)
        except BaseException:  # never back into the daemon's loop
            status = 1
        finally:
            os._exit(status)

    def _tell_janitor(self, line: str) -> None:
        if self.janitor_w >= 0:
            # A janitor killed by hand: the daemon goes on, and ends as it would.
            with contextlib.suppress(OSError):
                os.write(self.janitor_w, line.encode() + b"\n")

    def _say(self, line: str) -> None:
        # A supervisor that closed our stdout must not end the pool (and so
        # every VM waiting in it): --log still has the line.
        with contextlib.suppress(OSError, ValueError):
            print(f"pool: {line}", flush=True)
        self.ctx.log.warning(f"pool: {line}")


def janitor(ctx: Context, pipe: int) -> None:
    """Outlives the daemon only to delete what it made and did not hand out."""

    made: set[str] = set()
    with os.fdopen(pipe, "rb") as lines:
        for raw in lines:
            word, _, vm_id = raw.decode(errors="replace").strip().partition(" ")
            if word == "made":
                made.add(vm_id)
            elif word == "claimed":
                made.discard(vm_id)
            elif word == "done":
                return
    for vm_id in sorted(made):
        delete_vm(ctx, vm_id, lambda _line: None)
    lock = os.open(poolwire.pool_dir(ctx.root) / poolwire.LOCK, os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        remove_pool_dir(ctx.root)  # no pool serves the root now
    except BlockingIOError:
        pass  # a new pool serves it already
    finally:
        os.close(lock)


def delete_vm(ctx: Context, vm_id: str, say: Callable[[str], None]) -> None:
    """A pooled VM, and its warm-up where a worker was stopped in it: the
    member first, whose directory in the VM's pod share the VM's delete
    would otherwise find bound."""
    from paracell.runtime.verbs import lifecycle

    for container_id in (bundles.warm_up_id(vm_id), vm_id):
        try:
            lifecycle.delete(ctx, container_id, force=True)
        except ParacellError as err:
            say(f"{container_id}: deleting it: {err}")


def remove_pool_dir(root: str) -> None:
    """The pool's own files, by name only (its lock's holder calls this)."""
    where = poolwire.pool_dir(root)
    rootfs = where / "rootfs"
    vm_bundles = bundles.vm_bundles(where)
    names = [d / "config.json" for d in (*vm_bundles, where / "warm-up")]
    names += [rootfs / name for name, _ in (bundles.TRUE, bundles.PAUSE)]
    for path in (*names, where / poolwire.SOCKET, where / poolwire.LOCK):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    # Creates made their mount points in the rootfs: empty directories,
    # removed bottom up (rmdir never follows a link, nor removes what is
    # not empty: anything else is left).
    for path in sorted((Path(d) for d, _, _ in os.walk(rootfs)), reverse=True):
        with contextlib.suppress(OSError):
            path.rmdir()
    for path in (*vm_bundles, where / "warm-up", where):
        with contextlib.suppress(OSError):
            path.rmdir()
