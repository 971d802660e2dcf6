"""The shim's relay (csrc/relay.c) around a checkpoint's QUIESCE and with
stdin flow control (docs/agent-protocol.md): the real C relay runs in a
thread, the test plays the guest at the other end of the agent channel and
the relay's clients (exec proxies, the snapshot service) on its socket.

Checks that something does not arrive wait a little and can only pass
sooner on a slow host, never fail because of one."""

from __future__ import annotations

import os
import socket
import struct
import threading
from collections.abc import Iterator

import pytest
from paracell._native import ffi, lib

U32 = struct.Struct("<I")
QUIET_S = 0.5


def frame(ftype: int, chan: int = 0, payload: bytes = b"") -> bytes:
    return struct.pack("<IHH", len(payload), ftype, chan) + payload


def read_frame(sock: socket.socket) -> tuple[int, int, bytes]:
    length, ftype, chan = struct.unpack("<IHH", _exact(sock, 8))
    return ftype, chan, _exact(sock, length)


def _exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError("closed")
        data += chunk
    return data


def nothing_comes(sock: socket.socket) -> bool:
    sock.settimeout(QUIET_S)
    try:
        return not sock.recv(1, socket.MSG_PEEK)  # b"": closed, which is something too
    except TimeoutError:
        return True
    finally:
        sock.settimeout(10)


class Shim:
    """The relay in shim mode; `guest` is the test's end of the agent channel."""

    def __init__(self, tmp_path, stdin_fd: int = -1) -> None:
        self.path = str(tmp_path / "shim.sock")
        self.ours, self.guest = socket.socketpair()
        self.guest.settimeout(10)
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(self.path)
        self.listener.listen(16)
        cfg = self.cfg = ffi.new("struct pc_relay_cfg *")
        cfg.chan_fd, cfg.listen_fd = self.ours.fileno(), self.listener.fileno()
        cfg.in_fd, cfg.out_fd, cfg.err_fd, cfg.tty_fd, cfg.abort_fd = stdin_fd, -1, -1, -1, -1
        cfg.lease_fd = -1
        cfg.control_fd = -1
        cfg.fwd = ffi.NULL
        self.res = ffi.new("struct pc_relay_result *")
        self.thread = threading.Thread(target=lib.pc_relay, args=(self.cfg, self.res))
        self.thread.start()

    def client(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX)
        sock.settimeout(10)
        sock.connect(self.path)
        return sock

    def expect(self, ftype: int, chan: int | None = None) -> bytes:
        got, got_chan, payload = read_frame(self.guest)
        assert got == ftype and chan in (None, got_chan), (got, got_chan, payload[:32])
        return payload

    def exec_session(self) -> tuple[socket.socket, int]:
        """An exec proxy's connection, its process created and started."""
        proxy = self.client()
        proxy.sendall(frame(lib.PC_SPEC, 0, b"container=c\0arg=cat\0"))
        got, chan, _ = read_frame(self.guest)
        assert got == lib.PC_SPEC and chan > 0
        self.guest.sendall(frame(lib.PC_CREATED, chan, U32.pack(42)))
        assert read_frame(proxy)[0] == lib.PC_CREATED
        proxy.sendall(frame(lib.PC_START))
        self.expect(lib.PC_START, chan)
        return proxy, chan

    def quiesce(self) -> tuple[socket.socket, int]:
        """The snapshot service's connection, and the QUIESCE's number."""
        asker = self.client()
        asker.sendall(frame(lib.PC_QUIESCE))
        payload = self.expect(lib.PC_QUIESCE, 0)
        assert len(payload) == U32.size
        return asker, U32.unpack(payload)[0]

    def end(self) -> None:
        if self.thread.is_alive():
            self.guest.sendall(frame(lib.PC_EXIT, 0, struct.pack("<i", 0)))
        self.thread.join(20)
        assert not self.thread.is_alive()
        for s in (self.ours, self.guest, self.listener):
            s.close()


@pytest.fixture
def shim(tmp_path) -> Iterator[Shim]:
    side = Shim(tmp_path)
    yield side
    side.end()


def test_a_stale_quiesced_never_answers_a_later_quiesce(shim):
    """An asker that gave up gets a RESUME sent for it; the guest's answer
    to its QUIESCE, late, is not the answer to the next one."""
    first, seq1 = shim.quiesce()
    first.close()
    assert U32.unpack(shim.expect(lib.PC_RESUME, 0))[0] == 0
    second, seq2 = shim.quiesce()
    assert seq2 != seq1
    shim.guest.sendall(frame(lib.PC_QUIESCED, 0, U32.pack(seq1)))
    assert nothing_comes(second)
    shim.guest.sendall(frame(lib.PC_QUIESCED, 0, U32.pack(seq2)))
    assert read_frame(second)[0] == lib.PC_QUIESCED
    second.sendall(frame(lib.PC_RESUME, 0, U32.pack(0)))
    assert read_frame(second)[0] == lib.PC_HOST_ACK
    assert U32.unpack(shim.expect(lib.PC_RESUME, 0))[0] == 0
    second.close()


def test_requests_during_a_quiesce_reach_the_guest_after_its_resume(shim):
    proxy, chan = shim.exec_session()
    asker, seq = shim.quiesce()
    # A new exec, a signal to a running one, a `kill` of the container: all wait.
    newcomer = shim.client()
    newcomer.sendall(frame(lib.PC_SPEC, 0, b"container=c\0arg=true\0"))
    proxy.sendall(frame(lib.PC_SIGNAL, 0, struct.pack("<II", 15, 0)))
    killer = shim.client()
    killer.sendall(frame(lib.PC_SIGNAL, 0, struct.pack("<II", 9, 1)))
    assert nothing_comes(shim.guest)
    shim.guest.sendall(frame(lib.PC_QUIESCED, 0, U32.pack(seq)))
    assert read_frame(asker)[0] == lib.PC_QUIESCED
    assert nothing_comes(shim.guest)
    asker.sendall(frame(lib.PC_RESUME, 0, U32.pack(0)))
    # RESUME first, then what waited.
    assert U32.unpack(shim.expect(lib.PC_RESUME, 0))[0] == 0
    after = {read_frame(shim.guest)[:2] for _ in range(3)}
    assert {(lib.PC_SIGNAL, chan), (lib.PC_SIGNAL, 0)} < after
    assert any(ftype == lib.PC_SPEC for ftype, _ in after)
    assert read_frame(killer)[0] == lib.PC_HOST_ACK
    for s in (proxy, asker, newcomer, killer):
        s.close()


def test_a_rollback_ends_the_sessions_and_drops_what_waited_for_them(shim):
    proxy, chan = shim.exec_session()
    asker, seq = shim.quiesce()
    proxy.sendall(frame(lib.PC_STDIN, 0, b"for a process the rollback ends"))
    shim.guest.sendall(frame(lib.PC_QUIESCED, 0, U32.pack(seq)))
    assert read_frame(asker)[0] == lib.PC_QUIESCED
    asker.sendall(frame(lib.PC_RESUME, 0, U32.pack(lib.PC_RESUME_ROLLED_BACK)))
    assert U32.unpack(shim.expect(lib.PC_RESUME, 0))[0] == lib.PC_RESUME_ROLLED_BACK
    ftype, _, why = read_frame(proxy)
    assert (ftype, why) == (lib.PC_ERROR, b"the sandbox was rolled back to a checkpoint: "
                                          b"this session ended")
    ftype, _, status = read_frame(proxy)
    assert (ftype, struct.unpack("<i", status)[0]) == (lib.PC_EXIT, 137)
    assert nothing_comes(shim.guest)
    proxy.close()
    asker.close()


def stdin_in_background(proxy: socket.socket, data: bytes) -> threading.Thread:
    """A proxy's stdin, more than its socket holds while the relay takes none."""
    frames = b"".join(frame(lib.PC_STDIN, 0, data[at:at + 65536])
                      for at in range(0, len(data), 65536))

    def send() -> None:
        try:
            proxy.sendall(frames)
        except OSError:
            pass  # the test ended the session first

    sender = threading.Thread(target=send)
    sender.start()
    return sender


def received_stdin(shim: Shim, chan: int, until: int) -> bytes:
    data = b""
    while len(data) < until:
        data += shim.expect(lib.PC_STDIN, chan)
    return data


def test_stdin_beyond_its_window_waits_for_credit_and_holds_back_only_its_session(shim):
    proxy, chan = shim.exec_session()
    window = lib.PC_STDIN_WINDOW
    sent = os.urandom(4 * window)
    sender = stdin_in_background(proxy, sent)
    got = received_stdin(shim, chan, window)
    assert got == sent[:window] and nothing_comes(shim.guest)
    # The channel's stdin waits; the VM's other traffic does not.
    other, other_chan = shim.exec_session()
    asker, seq = shim.quiesce()
    shim.guest.sendall(frame(lib.PC_QUIESCED, 0, U32.pack(seq)))
    assert read_frame(asker)[0] == lib.PC_QUIESCED
    asker.sendall(frame(lib.PC_RESUME, 0, U32.pack(0)))
    shim.expect(lib.PC_RESUME, 0)
    assert nothing_comes(shim.guest)
    # Each credit lets that much more go, in order.
    while len(got) < len(sent):
        shim.guest.sendall(frame(lib.PC_STDIN_CREDIT, chan, U32.pack(window // 2)))
        got += received_stdin(shim, chan, window // 2)
    assert got == sent
    sender.join()
    # Credit beyond the window is clamped: no more than a window goes after it.
    shim.guest.sendall(frame(lib.PC_STDIN_CREDIT, chan, U32.pack(10 * window)))
    sender = stdin_in_background(proxy, sent[:3 * 65536])
    assert len(received_stdin(shim, chan, window)) == window and nothing_comes(shim.guest)
    for s in (proxy, other, asker):
        s.close()
    sender.join()


def test_a_session_held_back_by_its_stdin_that_hangs_up_has_its_process_killed(shim):
    proxy, chan = shim.exec_session()
    sender = stdin_in_background(proxy, b"x" * 4 * 65536)
    received_stdin(shim, chan, lib.PC_STDIN_WINDOW)
    proxy.shutdown(socket.SHUT_RDWR)
    sender.join()
    proxy.close()
    assert shim.expect(lib.PC_SIGNAL, chan) == struct.pack("<II", 9, 0)


def test_the_inits_stdin_keeps_its_window_and_restarts_it_after_a_rollback(tmp_path):
    r, w = os.pipe()
    window = lib.PC_STDIN_WINDOW
    # What the test never takes fits in the pipe, so the feeder ends.
    data = os.urandom(2 * window)
    feeder = threading.Thread(target=lambda: (os.write(w, data), os.close(w)))
    feeder.start()
    shim = Shim(tmp_path, stdin_fd=r)
    try:
        starter = shim.client()
        starter.sendall(frame(lib.PC_START))
        shim.expect(lib.PC_START, 0)
        got = received_stdin(shim, 0, window)
        assert got == data[:window] and nothing_comes(shim.guest)
        asker, seq = shim.quiesce()
        shim.guest.sendall(frame(lib.PC_QUIESCED, 0, U32.pack(seq)))
        assert read_frame(asker)[0] == lib.PC_QUIESCED
        asker.sendall(frame(lib.PC_RESUME, 0, U32.pack(lib.PC_RESUME_ROLLED_BACK)))
        shim.expect(lib.PC_RESUME, 0)
        # The agent's count after the rollback: its checkpoint still held
        # 1000 bytes of this stdin, so the window has that much less room.
        assert nothing_comes(shim.guest)
        shim.guest.sendall(frame(lib.PC_STDIN_CREDIT, 0, U32.pack(window - 1000)))
        got += received_stdin(shim, 0, window - 1000)
        assert got == data[:2 * window - 1000] and nothing_comes(shim.guest)
        for s in (starter, asker):
            s.close()
    finally:
        shim.end()
        feeder.join()
        os.close(r)


def test_an_exec_proxy_reads_all_its_shim_sent_before_the_shim_closed(tmp_path):
    """The shim sent the output and the EXIT, and closed the session, before
    the proxy's relay ran: the proxy's first write fails, and it must still
    read (and pass on) all of it and report the exit, not a lost channel."""
    ours, shim = socket.socketpair()
    # Room for it all (the kernel clamps this to twice net.core.wmem_max,
    # 416 KiB by default); it is more than the relay reads at once.
    shim.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    output = os.urandom(256 << 10)
    for at in range(0, len(output), 65536):
        shim.sendall(frame(lib.PC_STDOUT, 0, output[at:at + 65536]))
    shim.sendall(frame(lib.PC_EXIT, 0, struct.pack("<i", 3)))
    shim.close()
    stdin_file = tmp_path / "stdin"
    stdin_file.write_bytes(b"input the shim never takes")
    in_fd = os.open(stdin_file, os.O_RDONLY)
    out_r, out_w = os.pipe()
    collected = bytearray()

    def drain() -> None:
        with os.fdopen(out_r, "rb") as f:
            collected.extend(f.read())

    reader = threading.Thread(target=drain)
    reader.start()
    cfg = ffi.new("struct pc_relay_cfg *")
    cfg.chan_fd, cfg.listen_fd = ours.fileno(), -1
    cfg.in_fd, cfg.out_fd, cfg.err_fd, cfg.tty_fd, cfg.abort_fd = in_fd, out_w, -1, -1, -1
    cfg.lease_fd = -1
    cfg.control_fd = -1
    cfg.fwd = ffi.NULL
    res = ffi.new("struct pc_relay_result *")
    lib.pc_relay(cfg, res)
    os.close(out_w)
    reader.join()
    os.close(in_fd)
    ours.close()
    assert (res.end, res.status) == (lib.PC_END_EXIT, 3), ffi.string(res.message)
    assert bytes(collected) == output
