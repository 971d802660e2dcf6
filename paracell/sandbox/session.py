"""A command in a running sandbox, over its shim's socket, from this process:
no CLI process and no proxy. The frames are the exec protocol's
(docs/agent-protocol.md, "Exec through the host shim"); the C relay
(csrc/relay.c, proxy mode) moves them, in a thread of ours, between the
shim and pipes that this module reads. Killing it ends the relay, whose
hang-up makes the shim SIGKILL the process, as for a vanished exec proxy."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import IO, Any

from paracell.errors import ParacellError
from paracell.sandbox import errors

# What run() keeps of each stream unless told otherwise.
DEFAULT_MAX_OUTPUT = 64 << 20
READ_CHUNK = 1 << 16


@dataclass(frozen=True)
class Result:
    stdout: bytes
    stderr: bytes
    exit_code: int


class Process:
    """A started command. Read `stdout` and `stderr` (binary files) as it
    runs, or leave them to run(); wait() gives its exit code."""

    def __init__(self, conn: Any, want_stdin: bool) -> None:
        from paracell._native import ffi, lib
        from paracell.runtime.agent import channel

        self._conn = conn
        # The shim starts a created process on START; a shim that ended the
        # session answers it with its reason, which the relay reads.
        channel.send(conn.fileno(), lib.PC_START)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        self._abort_r, self._abort_w = os.pipe2(os.O_CLOEXEC)
        # kill() and write() may come from other threads (run()'s readers and
        # feeder) while the relay's thread closes these fds at its end: an fd
        # number must never be written once it may be reused.
        self._abort_lock = threading.Lock()
        self._stdin_lock = threading.Lock()
        in_r, self._stdin_w = os.pipe2(os.O_CLOEXEC) if want_stdin else (-1, -1)
        self.stdout: IO[bytes] = os.fdopen(out_r, "rb", buffering=0)
        self.stderr: IO[bytes] = os.fdopen(err_r, "rb", buffering=0)
        self._cfg = cfg = ffi.new("struct pc_relay_cfg *")
        cfg.chan_fd, cfg.listen_fd, cfg.control_fd, cfg.tty_fd = conn.fileno(), -1, -1, -1
        cfg.in_fd, cfg.out_fd, cfg.err_fd = in_r, out_w, err_w
        cfg.abort_fd, cfg.lease_fd = self._abort_r, -1
        cfg.forward_mask = 0
        cfg.fwd = ffi.NULL
        self._res = ffi.new("struct pc_relay_result *")
        self.killed = False
        self._outcome: int | Exception | None = None

        def relay() -> None:
            try:
                lib.pc_relay(self._cfg, self._res)
            finally:
                for fd in (out_w, err_w, in_r):
                    if fd >= 0:
                        os.close(fd)
                self._conn.close()  # the shim kills a process whose session is gone
                # Here, not in wait(): a Process nobody waits for leaks no fd.
                self.close_stdin()
                with self._abort_lock:
                    for fd in (self._abort_r, self._abort_w):
                        os.close(fd)
                    self._abort_r = self._abort_w = -1

        self._thread = threading.Thread(target=relay, name="paracell-sdk-relay", daemon=True)
        self._thread.start()

    def write(self, data: bytes) -> None:
        """To the process's stdin (started with stdin=True)."""
        view = memoryview(data)
        while view:
            # A chunk at a time under the lock: close_stdin() never waits long.
            with self._stdin_lock:
                if self._stdin_w < 0:
                    raise errors.SandboxError("the command's stdin is closed")
                try:
                    view = view[os.write(self._stdin_w, view[:READ_CHUNK]):]
                except BrokenPipeError:
                    raise errors.SandboxError("the command's stdin is closed") from None

    def close_stdin(self) -> None:
        with self._stdin_lock:
            if self._stdin_w >= 0:
                os.close(self._stdin_w)
                self._stdin_w = -1

    def kill(self) -> None:
        """Ends it: the relay stops, and the shim SIGKILLs the process."""
        with self._abort_lock:
            if self._abort_w < 0:
                return  # it has ended
            self.killed = True
            os.write(self._abort_w, b"k")

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code: the process's, or 128+signal. CommandTimeout after
        `timeout` seconds (it runs on; kill() it), SessionEnded when a
        rollback ended it, SandboxNotRunning when its VM went away."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise errors.CommandTimeout(f"the command still runs after {timeout:g} s")
        if self._outcome is None:
            self._outcome = self._ending()
        if isinstance(self._outcome, Exception):
            raise self._outcome
        return self._outcome

    def _ending(self) -> int | Exception:
        from paracell._native import ffi, lib

        res = self._res
        if self.killed:
            return 137
        if res.end == lib.PC_END_EXIT:
            rolled_back = ffi.string(lib.PC_ROLLED_BACK_MSG).decode()
            if ffi.string(res.error).decode(errors="replace") == rolled_back:
                return errors.SessionEnded(rolled_back)
            return int(res.status) & 0xFF
        error = ffi.string(res.error).decode(errors="replace")
        if res.end == lib.PC_END_HANGUP and error:
            # The shim ended the session after its ERROR: the execve failed.
            return errors.SandboxError(error)
        if res.end == lib.PC_END_HANGUP:
            return errors.SandboxNotRunning("the sandbox's VM went away while the command ran")
        return errors.SandboxError(ffi.string(res.message).decode(errors="replace"))


def _collect(stream: IO[bytes], into: bytearray, limit: int, proc: Process,
             over: threading.Event) -> None:
    while chunk := stream.read(READ_CHUNK):
        if len(into) + len(chunk) > limit:
            into += chunk[:limit - len(into)]
            over.set()
            proc.kill()
            while stream.read(READ_CHUNK):  # to its end, so the relay never blocks on it
                pass
            return
        into += chunk


def run_to_end(proc: Process, stdin: bytes | None, timeout: float | None,
               max_output: int) -> Result:
    """What run() does with a started Process: feeds stdin, keeps at most
    max_output bytes of each stream, and kills it at the timeout."""
    out, err = bytearray(), bytearray()
    over = threading.Event()
    readers = [threading.Thread(target=_collect, args=(s, buf, max_output, proc, over),
                                daemon=True)
               for s, buf in ((proc.stdout, out), (proc.stderr, err))]
    for reader in readers:
        reader.start()
    if stdin is not None:
        threading.Thread(target=_feed, args=(proc, stdin), daemon=True).start()
    try:
        code = proc.wait(timeout)
    except errors.CommandTimeout:
        proc.kill()
        proc.wait()
        raise errors.CommandTimeout(f"the command ran past its timeout of {timeout:g} s "
                                    "and was killed") from None
    finally:
        for reader in readers:
            reader.join()
        proc.stdout.close()
        proc.stderr.close()
    if over.is_set():
        raise errors.OutputTooLarge(f"the command wrote more than {max_output} bytes to one "
                                    "stream, and was killed")
    return Result(bytes(out), bytes(err), code)


def _feed(proc: Process, data: bytes) -> None:
    try:
        proc.write(data)
    except ParacellError:
        pass  # the process closed its stdin or ended: what it read is what it gets
    finally:
        proc.close_stdin()
