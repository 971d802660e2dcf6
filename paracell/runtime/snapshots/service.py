"""The shim's checkpoint service (docs/snapshots.md): a thread of a
snapshot-mode container's shim that checkpoints its VM, rolls it back, and
removes checkpoints, on requests that arrive on `snap.sock` in the state
directory.

The shim owns the VM, so the work runs here and not in the CLI that asked:
a client that dies half-way (SIGKILL) changes nothing, and the operation
runs to its end. Each operation, with the VM's stdio relay still serving:
  1. QUIESCE on the shim's control socket: the relay stops sending to the
     guest and the agent answers QUIESCED once it has sent all it had, so
     the agent channel is empty both ways;
  2. the backend's snapshot step (paracell/vmm/hypervisor.py, Snapshots):
     the vCPUs stop; with the Pager's thread held off, guest RAM's pages are
     captured (csrc/checkpoint.c) or put back; the device state is saved
     as, or loaded from, the checkpoint's tag in the backend's store
     (checkpoints/.vmstate.qcow2); the vCPUs run again;
  3. RESUME: after a rollback the relay ends every exec session and
     port-forward stream, and the agent kills the exec'd processes.

Requests and answers are one JSON object each, on one line (`request` and
`answer` below are the one definition of that format).
"""

from __future__ import annotations

import json
import mmap
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paracell import unixsock
from paracell.errors import ParacellError
from paracell.images import rootdisk
from paracell.runtime.snapshots.checkpoints import (
    FORK_RAM,
    HASHES,
    KEPT,
    LOC,
    PAGES,
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    check_name,
    digest,
)
from paracell.runtime.snapshots.writelog import EVERY_PAGE, WRITTEN_PAGES, WriteLog
from paracell.vmm.hypervisor import Hypervisor

SOCKET = "snap.sock"
MAX_LINE = 4096
QUIESCE_TIMEOUT_S = 10.0
OPS = ("checkpoint", "rollback", "remove")


def request(op: str, **args: Any) -> bytes:
    return json.dumps({"op": op, **args}).encode() + b"\n"


def answer(ok: bool, **fields: Any) -> bytes:
    return json.dumps({"ok": ok, **fields}).encode() + b"\n"


@dataclass
class Base:
    """What the VM's RAM now derives from: the last checkpoint taken or
    rolled back to. The next checkpoint saves only what differs from it."""

    seq: int = 0
    hashes: Any = None  # uint64_t[pages]
    loc: Any = None     # struct pc_ckpt_loc[pages]


class Quiesced:
    """The agent channel held empty: a control client of the shim's relay."""

    def __init__(self, control: Path) -> None:
        from paracell._native import lib
        from paracell.runtime.agent import channel

        self.sock = unixsock.connect(control)
        try:
            channel.send(self.sock.fileno(), lib.PC_QUIESCE, 0, b"")
            frame = channel.recv(self.sock.fileno(), QUIESCE_TIMEOUT_S, "QUIESCE")
            kind, payload = frame.type, frame.payload
        except ParacellError as err:
            self.sock.close()
            raise ParacellError(f"the guest did not quiesce: {err}") from None
        if kind != lib.PC_QUIESCED:
            self.sock.close()
            why = payload.decode(errors="replace")[:200] if kind == lib.PC_ERROR else \
                f"frame {kind}"
            raise ParacellError(f"the guest did not quiesce: {why}")

    def resume(self, rolled_back: bool) -> None:
        from paracell._native import lib
        from paracell.runtime.agent import channel

        flags = lib.PC_RESUME_ROLLED_BACK if rolled_back else 0
        try:
            channel.send(self.sock.fileno(), lib.PC_RESUME, 0, flags.to_bytes(4, "little"))
            channel.recv(self.sock.fileno(), QUIESCE_TIMEOUT_S, "RESUME")
        finally:
            # Closing it resumes the guest too, if RESUME did not get through.
            self.sock.close()


class SnapshotService:
    """One snapshot-mode VM's checkpoints, served from its shim."""

    def __init__(self, state_dir: Path, hypervisor: Hypervisor, control: Path, ram_path: Path,
                 ram_bytes: int, key: str, limit: int, pager: Any, rootdisk: Path,
                 log: Callable[[str], None], writes: WriteLog | None = None) -> None:
        """writes: QEMU's log of writes to guest RAM, where its RAM plugin keeps one."""
        self.state_dir, self.hypervisor, self.control = state_dir, hypervisor, control
        self.ram_path, self.ram_bytes, self.key, self.limit = ram_path, ram_bytes, key, limit
        self.pager, self.log, self.rootdisk = pager, log, rootdisk
        self.writes = writes
        self._ram_map: mmap.mmap | None = None  # guest RAM, mapped for the service's life
        self.store = CheckpointStore(state_dir)
        self.snapshots = hypervisor.snapshots(self.store.vmstate)
        self.base = Base()
        # Whether the log has seen every write since the RAM was self.base;
        # and whether it has since the operation in progress took it (which
        # becomes the former only once that operation has moved the base).
        self.logged_since_base = False
        self._logged_since_take = False
        self.listener: socket.socket | None = None
        self.lock = threading.Lock()

    # ---- serving ----

    def start(self) -> None:
        self.store.ensure()
        self.store.sweep()
        fd = os.open(self.ram_path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            self._ram_map = mmap.mmap(fd, self.ram_bytes, mmap.MAP_SHARED,
                                      mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.listener = unixsock.listen(self.state_dir / SOCKET)
        threading.Thread(target=self._serve, name="snapshots", daemon=True).start()

    def _serve(self) -> None:
        import signal

        assert self.listener is not None
        # Every signal sent to the shim is the relay's, to pass on to the container.
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(10)
                try:
                    reply = self._handle(self._read_request(conn))
                except ParacellError as err:
                    reply = answer(False, error=str(err))
                except Exception as err:  # a bug must not end the shim's VM
                    reply = answer(False, error=f"internal error: {type(err).__name__}: {err}")
                try:
                    conn.sendall(reply)
                except OSError:
                    pass  # its client is gone: the work was done all the same

    @staticmethod
    def _read_request(conn: socket.socket) -> dict[str, Any]:
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(MAX_LINE + 1 - len(data))
            if not chunk:
                break
            data += chunk
            if len(data) > MAX_LINE:
                raise ParacellError("request too long")
        try:
            req = json.loads(data)
        except ValueError:
            raise ParacellError("request is not JSON") from None
        if not isinstance(req, dict) or req.get("op") not in OPS:
            raise ParacellError("unknown request")
        return req

    def _handle(self, req: dict[str, Any]) -> bytes:
        name = req.get("name")
        with self.lock:
            if req["op"] == "checkpoint":
                return answer(True, **self.checkpoint(None if name is None else check_name(name)))
            if req["op"] == "rollback":
                return answer(True, **self.rollback(check_name(name)))
            return answer(True, **self.remove(check_name(name)))

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
            unixsock.unlink(self.state_dir / SOCKET)
        with self.lock:  # after the operation in progress, which uses both
            if self.writes is not None:
                self.writes.close()
            if self._ram_map is not None:
                self._ram_map.close()
                self._ram_map = None

    def _moved_base(self, base: Base) -> None:
        """The operation made the RAM `base`'s: the log taken during it
        counts from there."""
        self.base = base
        self.logged_since_base = self._logged_since_take

    def _ram(self) -> Any:
        """The service's own mapping of guest RAM, for the C code: the pages it
        reads and writes keep their page-table entries between operations."""
        from paracell._native import ffi

        return ffi.from_buffer("uint8_t[]", self._ram_map) if self._ram_map is not None \
            else ffi.NULL

    def _changes(self) -> tuple[Any, str]:
        """With the VM stopped and the Pager paused: the pages that may
        differ from self.base (a byte each), or NULL where every page must
        be read; and the method, as the answer says it. The log is taken
        either way, so that it counts from now on."""
        from paracell._native import ffi

        changed = ffi.new("uint8_t[]", self.ram_bytes // 4096)
        logged = self.writes is not None and self.writes.take(changed)
        if self.pager is not None:
            self.pager.take_unbound(changed)
        whole = logged and self.logged_since_base and bool(self.base.seq)
        # What was written before this take is in `changed` only: until the
        # base moves (_moved_base), a failed operation leaves a base the log
        # no longer covers, and the next one reads every page.
        self.logged_since_base = False
        self._logged_since_take = logged
        return (changed, WRITTEN_PAGES) if whole else (ffi.NULL, EVERY_PAGE)

    # ---- the operations ----

    def checkpoint(self, name: str | None) -> dict[str, Any]:
        from paracell._native import ffi, lib

        live = self.store.all(self.log)
        if len(live) >= self.limit:
            raise CheckpointError(f"this sandbox has {len(live)} checkpoints, its limit "
                                  f"({self.limit}): remove one first (sandbox rm-checkpoint)")
        seq = max([c.seq for c in live] + [self._retained_max()]) + 1
        name = name or f"ckpt-{seq}"
        if (self.store.dir / name).exists():
            raise CheckpointError(f"checkpoint {name!r} exists already")
        pages = self.ram_bytes // 4096
        hashes = ffi.new("uint64_t[]", pages)
        loc = ffi.new("struct pc_ckpt_loc[]", pages)
        fig = ffi.new("struct pc_ckpt_figures *")
        err = ffi.new("char[]", 256)
        seed = self.store.seed()
        staging = self.store.staging()
        timing: dict[str, Any] = {}

        def capture() -> None:
            began = time.monotonic()
            ram = os.open(self.ram_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            out = os.open(staging / PAGES, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                          0o600)
            if self.pager is not None:
                self.pager.pause()
            try:
                changed, timing["method"] = self._changes()
                prev = self.base.hashes if self.base.seq else ffi.NULL
                parent = self.base.loc if self.base.seq else ffi.NULL
                if lib.pc_ckpt_capture(ram, self._ram(), self.ram_bytes, seed, prev, parent,
                                       changed, seq, hashes, loc, out, fig, err, 256) != 0:
                    raise ParacellError(ffi.string(err).decode(errors="replace"))
            finally:
                if self.pager is not None:
                    self.pager.resume(False)
                os.close(out)
                os.close(ram)
            timing["ram_s"] = time.monotonic() - began

        began = time.monotonic()
        try:
            quiet = Quiesced(self.control)
        except BaseException:
            self.store.discard(staging)
            raise
        try:
            stopped = time.monotonic()
            self.snapshots.save(f"pc-{seq}", capture)
            resumed = time.monotonic()
        except BaseException:
            self._recover()
            quiet.resume(False)
            self.store.discard(staging)
            raise
        quiet.resume(False)
        answered = time.monotonic()
        for file, data in ((HASHES, hashes), (LOC, loc)):
            (staging / file).write_bytes(ffi.buffer(data))
        ckpt = Checkpoint(name=name, seq=seq, parent=self.base.seq, created=time.time(),
                          key=self.key, ram_bytes=self.ram_bytes, pages_saved=int(fig.changed),
                          vmstate_tag=f"pc-{seq}",
                          sha256={f: digest(staging / f) for f in (HASHES, LOC)},
                          rootdisk_sha256=rootdisk.digest_of(self.rootdisk))
        try:
            self.store.commit(staging, ckpt)
        except BaseException:
            self.store.discard(staging)
            raise
        self.store.remember(ckpt, hashes, loc)
        self._moved_base(Base(seq, hashes, loc))
        return {"name": name, "seq": seq, "paused_s": round(resumed - stopped, 6),
                "quiesce_s": round(stopped - began, 6), "ram_s": round(timing["ram_s"], 6),
                "total_s": round(answered - began, 6), "pages_saved": int(fig.changed),
                "pages_present": int(fig.present), "pages_read": int(fig.looked),
                "method": timing["method"], "bytes": int(fig.bytes)}

    def _recover(self) -> None:
        """After a failed save: the VM goes on as it was."""
        try:
            self.hypervisor.resume()
        except ParacellError as err:
            self.log(f"checkpoint: the VM could not be resumed: {err}")

    def rollback(self, name: str) -> dict[str, Any]:
        from paracell._native import ffi, lib

        began = time.monotonic()
        ckpt = self.store.load(name)
        hashes, loc = self.store.checked_tables(ckpt, self.key, self.ram_bytes)
        seed = self.store.seed()
        fig = ffi.new("struct pc_ckpt_figures *")
        err = ffi.new("char[]", 256)
        seqs, fds = self.store.page_files()
        state: dict[str, Any] = {"reverted": False}

        def revert() -> None:
            ram = os.open(self.ram_path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            if self.pager is not None:
                self.pager.pause()
            try:
                reverting = time.monotonic()
                changed, state["method"] = self._changes()
                base = self.base.hashes if changed != ffi.NULL else ffi.NULL
                rc = lib.pc_ckpt_revert(ram, self._ram(), self.ram_bytes, seed, hashes, loc,
                                        ffi.new("uint32_t[]", seqs), ffi.new("int[]", fds),
                                        len(fds), base, changed, fig, err, 256)
                state["ram_s"] = time.monotonic() - reverting
                # The C code checks every page before it writes one: a failure
                # with nothing changed leaves the VM as it was.
                state["reverted"] = fig.changed > 0 or rc == 0
                if rc != 0:
                    raise CheckpointError(f"checkpoint {name}: "
                                          f"{ffi.string(err).decode(errors='replace')}")
            finally:
                if self.pager is not None:
                    self.pager.resume(bool(state["reverted"]))
                os.close(ram)

        try:
            quiet = Quiesced(self.control)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        try:
            stopped = time.monotonic()
            self.snapshots.load(ckpt.vmstate_tag, revert)
            resumed = time.monotonic()
            self._moved_base(Base(ckpt.seq, hashes, loc))  # RAM and devices are its now
        except BaseException as failure:
            if state["reverted"]:
                # Half a rollback is no state to run on: the container stops.
                self.log(f"rollback to {name} failed after guest RAM was rewritten: {failure}; "
                         "stopping the VM")
                self._quit()
                raise ParacellError(f"rollback to {name} failed ({failure}); the container "
                                    "was stopped") from None
            self._recover()
            quiet.resume(False)
            raise
        finally:
            for fd in fds:
                os.close(fd)
        quiet.resume(True)
        return {"name": name, "seq": ckpt.seq, "paused_s": round(resumed - stopped, 6),
                "total_s": round(time.monotonic() - began, 6),
                "ram_s": round(state["ram_s"], 6), "pages_rewritten": int(fig.changed),
                "pages_read": int(fig.looked), "method": state["method"]}

    def _quit(self) -> None:
        try:
            self.hypervisor.stop()
        except ParacellError:
            pass

    # ---- removal, and the page files that outlive their checkpoints ----

    def _retained_max(self) -> int:
        return max((seq for seq, _ in self.store.retained()), default=0)

    def remove(self, name: str) -> dict[str, Any]:
        """The checkpoint's name and device state go at once; its page file
        stays while a remaining checkpoint (or the running VM's base) keeps
        pages in it, and goes with the last of them."""
        ckpt = self.store.load(name)
        try:
            self.snapshots.delete(ckpt.vmstate_tag)
        except ParacellError as err:
            self.log(f"checkpoint {name}: its device state was not deleted: {err}")
        kept = self.store.dir / f"{KEPT}{ckpt.seq}"
        with self.store.held(name):  # no fork's RAM file is being made in it
            os.rename(self.store.dir / name, kept)
        for file in ("meta.json", HASHES, LOC, FORK_RAM):
            (kept / file).unlink(missing_ok=True)
        freed = self._collect()
        return {"name": name, "seq": ckpt.seq, "page_files_freed": freed}

    def _collect(self) -> int:
        from paracell._native import ffi, lib

        top = max([c.seq for c in self.store.all()] + [self._retained_max(), self.base.seq]) + 1
        used = ffi.new("uint8_t[]", top)
        for ckpt in self.store.all():
            _, loc = self.store.tables(ckpt)
            lib.pc_ckpt_uses(loc, ckpt.pages, used, top)
        if self.base.seq:
            lib.pc_ckpt_uses(self.base.loc, self.ram_bytes // 4096, used, top)
        freed = 0
        for seq, path in self.store.retained():
            if not used[seq]:
                self.store.discard(path)
                freed += 1
        return freed
