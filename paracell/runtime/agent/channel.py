"""Short blocking exchanges on the agent channel, around the C relay.

The per-message work of a running container happens in csrc/relay.c; this is
only the handful of frames before and after it (READY, SANDBOX, ATTACHED,
SPEC, CREATED, START).
Frame types, limits and payload layouts come from proto/agent_proto.h through
cffi (`lib.PC_*`); the Python encoders and decoders of payloads are here, once.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paracell import unixsock
from paracell.errors import ParacellError

# Little-endian layouts of struct pc_signal_msg and pc_created_msg; a unit test
# checks their sizes against the header's structs.
SIGNAL_MSG = struct.Struct("<II")
CREATED_MSG = struct.Struct("<I")
EXIT_MSG = struct.Struct("<i")  # struct pc_exit_msg
READY_MSG = struct.Struct("<II")  # struct pc_ready_msg: version, caps


@dataclass(frozen=True)
class Frame:
    type: int
    chan: int
    payload: bytes


def send(fd: int, ftype: int, chan: int = 0, payload: bytes = b"") -> None:
    from paracell._native import lib

    if lib.pc_send_frame(fd, ftype, chan, payload, len(payload)) < 0:
        raise ParacellError(f"agent channel: send failed: {os.strerror(_errno())}")


def _errno() -> int:
    from paracell._native import ffi

    return ffi.errno


def recv(fd: int, timeout_s: float, what: str) -> Frame:
    from paracell._native import ffi, lib

    ftype, chan = ffi.new("unsigned *"), ffi.new("unsigned *")
    buf = ffi.new("char[]", lib.PC_MAX_PAYLOAD)
    n = lib.pc_recv_frame(fd, ftype, chan, buf, lib.PC_MAX_PAYLOAD, int(timeout_s * 1000))
    if n == -2:
        raise ParacellError(f"{what}: the channel closed")
    if n < 0:
        err = _errno()
        reason = "timed out" if err == errno.ETIMEDOUT else os.strerror(err)
        raise ParacellError(f"{what}: {reason}")
    return Frame(ftype[0], chan[0], bytes(ffi.buffer(buf, n)))


def encode_signal(signo: int, all_processes: bool) -> bytes:
    from paracell._native import lib

    return SIGNAL_MSG.pack(signo, lib.PC_SIGNAL_ALL if all_processes else 0)


def decode_created(payload: bytes) -> int:
    """The guest pid in a CREATED payload."""
    if len(payload) != CREATED_MSG.size:
        raise ParacellError(f"agent protocol violation: CREATED with {len(payload)} bytes")
    return CREATED_MSG.unpack(payload)[0]


def expect_ready(fd: int, timeout_s: float) -> int:
    """Waits for READY and checks that the guest speaks our protocol with the
    capabilities we use; its capability bits."""
    from paracell._native import lib

    frame = recv(fd, timeout_s, "booting the micro-VM")
    if frame.type != lib.PC_READY:
        raise ParacellError(f"agent protocol violation: expected READY, got type {frame.type}")
    if len(frame.payload) != READY_MSG.size:
        raise ParacellError("the guest agent speaks an older protocol than this runtime "
                            f"({lib.PC_PROTO_VERSION}): rebuild the guest (paracell guest build)")
    version, caps = READY_MSG.unpack(frame.payload)
    if version != lib.PC_PROTO_VERSION:
        raise ParacellError(f"the guest agent speaks protocol {version}, this runtime "
                            f"{lib.PC_PROTO_VERSION}: rebuild the guest (paracell guest build)")
    if caps & lib.PC_AGENT_CAPS != lib.PC_AGENT_CAPS:
        raise ParacellError(f"the guest agent lacks capabilities {lib.PC_AGENT_CAPS & ~caps:#x} "
                            "that this runtime uses: rebuild the guest (paracell guest build)")
    return caps


def attach_sandbox(fd: int, payload: bytes, timeout_s: float) -> None:
    """Sends SANDBOX and waits for ATTACHED, or ERROR (the reason, as our error)."""
    from paracell._native import lib

    send(fd, lib.PC_SANDBOX, 0, payload)
    frame = recv(fd, timeout_s, "attaching the sandbox")
    if frame.type == lib.PC_ERROR:
        raise ParacellError(printable(frame.payload))
    if frame.type != lib.PC_ATTACHED or frame.payload:
        raise ParacellError(f"agent protocol violation: expected ATTACHED, got type {frame.type}")


def expect_created(fd: int, timeout_s: float) -> int:
    """Waits for CREATED (the guest pid) or ERROR (the reason, as our error)."""
    from paracell._native import lib

    frame = recv(fd, timeout_s, "waiting for the container process")
    if frame.type == lib.PC_ERROR:
        raise ParacellError(printable(frame.payload))
    if frame.type != lib.PC_CREATED:
        raise ParacellError(f"agent protocol violation: expected CREATED, got type {frame.type}")
    return decode_created(frame.payload)


@dataclass(frozen=True)
class RelayEnd:
    kind: int  # lib.PC_END_*
    status: int
    message: str


def run_relay(chan_fd: int, listen_fd: int, tty_fd: int, abort_fd: int = -1,
              control_fd: int = -1, forward: Any = None,
              start_payload: Callable[[], bytes] | None = None, lease_fd: int = -1
              ) -> RelayEnd:
    """Runs the C relay over this process's stdio (or its terminal) until the
    process exits, the channel fails, abort_fd becomes readable, or a pooled
    VM's lease_fd ends (runtime/poolwire.py).
    control_fd: a pod member proxy's socket for its container's start and kill.
    forward: the shim's struct pc_fwd_listeners * (paracell/net/portforward.py).
    start_payload: the shim's, called once when `start` asks: what the init's
    START carries; a ParacellError is the start's error."""
    from paracell._native import ffi, lib
    from paracell.runtime.agent import signals

    cfg = ffi.new("struct pc_relay_cfg *")
    cfg.chan_fd, cfg.listen_fd, cfg.abort_fd = chan_fd, listen_fd, abort_fd
    cfg.control_fd, cfg.lease_fd = control_fd, lease_fd
    cfg.fwd = forward if forward is not None else ffi.NULL
    callback = None
    if start_payload is not None:
        def fill(buf: Any, cap: int) -> int:
            try:
                data = start_payload()
            except Exception as err:  # whatever it is, the start fails in one line
                text = str(err) if isinstance(err, ParacellError) else \
                    f"start: {type(err).__name__}: {err}"
                data, status = text.encode()[:cap - 1] + b"\0", -1
            else:
                status = len(data)
                if status > cap:
                    return cap + 1
            ffi.memmove(buf, data, len(data))
            return status

        # Kept alive for as long as the relay may call it.
        callback = ffi.callback("int(char *, int)", fill, onerror=lambda *_: None, error=-2)
        cfg.start_payload = callback
    if tty_fd >= 0:
        cfg.in_fd = cfg.out_fd = cfg.tty_fd = tty_fd
        # The process's output is all on the terminal; the relay's own lines
        # (why an execve failed, that a rollback ended the session) go to our
        # stderr, as runc's errors do.
        cfg.err_fd = 2
    else:
        cfg.in_fd, cfg.out_fd, cfg.err_fd, cfg.tty_fd = 0, 1, 2, -1
    cfg.forward_mask = signals.forward_mask()
    res = ffi.new("struct pc_relay_result *")
    lib.pc_relay(cfg, res)
    del callback
    return RelayEnd(res.end, res.status, ffi.string(res.message).decode("utf-8", "replace"))


# csrc/relayexec.c, built beside the package's C modules by setup.py.
RELAY_EXEC = Path(__file__).resolve().parents[2] / "paracell-relay"


def exec_relay(chan_fd: int, tty_fd: int, control_fd: int = -1,
               unlink: tuple[Path, ...] = (), net_record: Path | None = None) -> None:
    """A proxy becomes paracell-relay for the rest of its process's life:
    the same relay (csrc/relay.c) in a process of a few hundred KiB, its pid,
    fds and blocked signals kept, instead of a Python process of tens of
    MiB per container and per exec. `net_record`: a pooled container's, whose
    proxy sits in its network namespace and makes its START's payload
    (csrc/latenet.h). Returns only if the exec failed (OSError)."""
    import sys

    from paracell.net.discover import TAP_PREFIX
    from paracell.runtime.agent import signals

    for fd in (chan_fd, tty_fd, control_fd):
        if fd >= 0:
            os.set_inheritable(fd, True)
    os.execv(RELAY_EXEC, [str(RELAY_EXEC), str(chan_fd), str(tty_fd), str(control_fd),
                          str(signals.forward_mask()), str(net_record or "-"), TAP_PREFIX,
                          sys.executable, *map(str, unlink)])


def printable(data: bytes, limit: int = 300) -> str:
    text = data[:limit].decode("utf-8", "replace")
    return "".join(c if c.isprintable() else " " for c in text).strip() or "unknown error"


def control_request(socket_path: Path, ftype: int, payload: bytes = b"") -> None:
    """One request to a container's shim (start, signal), answered by HOST_ACK."""
    from paracell._native import lib

    _request(socket_path, ftype, payload, lib.PC_HOST_ACK, "waiting for the container shim")


REQUEST_TIMEOUT_S = 10.0


def stat_names() -> list[str]:
    """STATS_REPLY's figures in their order: enum pc_stat's names without
    PC_STAT_, lowercased (the guest's own cgroup file keys)."""
    from paracell._native import ffi, lib

    names = ffi.typeof("enum pc_stat").elements
    return [names[i].removeprefix("PC_STAT_").lower() for i in range(lib.PC_STAT_COUNT)]


def decode_stats_reply(payload: bytes) -> dict[str, int]:
    from paracell._native import lib

    if len(payload) != 8 * lib.PC_STAT_COUNT:
        raise ParacellError(f"agent protocol violation: STATS_REPLY with {len(payload)} bytes")
    return dict(zip(stat_names(), struct.unpack(f"<{lib.PC_STAT_COUNT}Q", payload),
                    strict=True))


def _request(shim_socket: Path, ftype: int, payload: bytes, answer: int, what: str) -> Frame:
    """One request on its own connection to a shim: for the shim itself
    (start, signal), or handed to the agent on a channel of its own (STATS,
    LIMITS). The `answer` frame, or the ERROR as our error."""
    from paracell._native import lib

    try:
        sock = unixsock.connect(shim_socket)
    except OSError as err:
        raise ParacellError(f"container shim is not reachable: {err.strerror}") from None
    with sock:
        send(sock.fileno(), ftype, 0, payload)
        frame = recv(sock.fileno(), REQUEST_TIMEOUT_S, what)
    if frame.type == lib.PC_ERROR:
        raise ParacellError(printable(frame.payload))
    if frame.type != answer:
        raise ParacellError(f"container shim answered with unexpected type {frame.type}")
    return frame


def container_stats(shim_socket: Path, container_id: str) -> dict[str, int]:
    """The figures of a container's own cgroup in its VM (STATS), by the
    names of decode_stats_reply, through the VM's shim."""
    from paracell._native import lib

    frame = _request(shim_socket, lib.PC_STATS, container_id.encode(), lib.PC_STATS_REPLY,
                       "reading the container's figures")
    return decode_stats_reply(frame.payload)


def set_limits(shim_socket: Path, container_id: str, memory_max: int | None,
               pids_max: int | None) -> None:
    """New memory and pids limits on a running container's cgroup in its VM
    (LIMITS); None leaves one as it is, 0 lifts it."""
    from paracell import speckeys as K
    from paracell._native import lib

    records = [(K.CONTAINER, container_id)]
    for key, value in ((K.MEMORY_MAX, memory_max), (K.PIDS_MAX, pids_max)):
        if value is not None:
            records.append((key, str(value) if value > 0 else "max"))
    payload = K.encode(records)
    if len(payload) > lib.PC_LIMITS_MAX:
        raise ParacellError(f"limits for {container_id}: longer than {lib.PC_LIMITS_MAX} bytes")
    _request(shim_socket, lib.PC_LIMITS, payload, lib.PC_ATTACHED,
               "setting the container's limits")


# A process a proxy opens in a running VM: an exec, or a pod member's init.
CREATE_TIMEOUT_S = 60.0
# After an ERROR the shim sends at most an EXIT, then closes the connection.
AFTER_ERROR_TIMEOUT_S = 5.0


class SessionEnded(ParacellError):
    """The shim ended a proxy's session before its process started (a
    rollback did, docs/snapshots.md): why, and the status it ends with."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def _created_by_shim(fd: int) -> None:
    """CREATED from the shim, or ParacellError with the reason. A refusal
    is an ERROR and the connection's end; a session that existed and was
    ended is an ERROR and an EXIT: SessionEnded."""
    from paracell._native import lib

    frame = recv(fd, CREATE_TIMEOUT_S, "waiting for the container process")
    if frame.type == lib.PC_CREATED:
        decode_created(frame.payload)
        return
    if frame.type != lib.PC_ERROR:
        raise ParacellError(f"agent protocol violation: expected CREATED, got type {frame.type}")
    why = printable(frame.payload)
    try:
        after = recv(fd, AFTER_ERROR_TIMEOUT_S, "after the shim's ERROR")
    except ParacellError:
        raise ParacellError(why) from None
    if after.type == lib.PC_EXIT and len(after.payload) == EXIT_MSG.size:
        raise SessionEnded(why, EXIT_MSG.unpack(after.payload)[0] & 0xFF)
    raise ParacellError(why)


def open_process(shim_socket: Path, launch: bytes, terminal: bool, console_socket: str | None,
                 seccomp: bytes | None = None) -> tuple[socket.socket, int]:
    """A proxy's first step: the shim makes the process in the guest from
    `launch` (a pod member's init sends its seccomp program just before). The
    connection and the terminal's fd (-1 without one); ParacellError
    (SessionEnded for a session ended before its start) or OSError on failure."""
    from paracell._native import lib
    from paracell.runtime.agent import console

    conn = unixsock.connect(shim_socket)
    try:
        if seccomp:
            send(conn.fileno(), lib.PC_SECCOMP, 0, seccomp)
        send(conn.fileno(), lib.PC_SPEC, 0, launch)
        _created_by_shim(conn.fileno())
        tty_fd = console.open_for_container(console_socket) if terminal else -1
    except BaseException:
        conn.close()
        raise
    return conn, tty_fd


def say_on_stderr(message: str) -> None:
    """One line for the process's stderr, as the relay writes the shim's."""
    try:
        os.write(2, f"paracell: {message}\n".encode(errors="replace"))
    except OSError:
        pass  # nobody reads it: the status says the rest
