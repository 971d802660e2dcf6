"""The host relay (csrc/relay.c) against a hostile guest: the test writes the
guest's side of the agent channel byte by byte, the real C relay reads it."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest
from paracell._native import ffi, lib

STDOUT, STDERR, EXIT = 18, 19, 20


def frame(ftype: int, chan: int, payload: bytes = b"", length: int | None = None) -> bytes:
    return struct.pack("<IHH", len(payload) if length is None else length, ftype, chan) + payload


def relay(guest_bytes: bytes, tmp_path, close_guest: bool = True):
    ours, guest = socket.socketpair()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "shim.sock"))
    listener.listen(1)
    out_r, out_w = os.pipe()

    def play_guest() -> None:
        guest.sendall(guest_bytes)
        if close_guest:
            guest.close()

    writer = threading.Thread(target=play_guest)
    writer.start()
    collected = bytearray()
    reader = threading.Thread(target=lambda: collected.extend(_read_all(out_r)))
    reader.start()
    cfg = ffi.new("struct pc_relay_cfg *")
    cfg.chan_fd, cfg.listen_fd = ours.fileno(), listener.fileno()
    cfg.in_fd, cfg.out_fd, cfg.err_fd, cfg.tty_fd, cfg.abort_fd = -1, out_w, -1, -1, -1
    cfg.lease_fd = -1
    cfg.control_fd = -1
    cfg.forward_mask = 0
    res = ffi.new("struct pc_relay_result *")
    lib.pc_relay(cfg, res)
    writer.join()
    os.close(out_w)
    reader.join()
    for s in (ours, listener, guest):
        s.close()
    return res.end, res.status, ffi.string(res.message).decode(), bytes(collected)


def _read_all(fd: int) -> bytes:
    with os.fdopen(fd, "rb") as f:
        return f.read()


def test_output_then_exit(tmp_path):
    data = bytes(range(256)) * 1000
    chunks = [data[i:i + 65536] for i in range(0, len(data), 65536)]
    stream = b"".join(frame(STDOUT, 0, c) for c in chunks) + frame(EXIT, 0, struct.pack("<i", 7))
    end, status, _, output = relay(stream, tmp_path)
    assert (end, status) == (lib.PC_END_EXIT, 7)
    assert output == data


@pytest.mark.parametrize(
    "stream",
    [
        frame(STDOUT, 0, length=0xFFFFFFFF),  # length far beyond the bound
        frame(STDOUT, 0, length=65537),  # one byte over
        frame(999, 0, b"x"),  # unknown type
        frame(STDOUT, 5000, b"x"),  # channel out of range
        frame(EXIT, 0, b"\x01\x02"),  # EXIT with a short status
        frame(1, 0, b"spec"),  # a host-to-guest type coming from the guest
    ],
)
def test_malformed_frames_end_the_container_not_the_host(tmp_path, stream):
    end, _, message, _ = relay(stream, tmp_path, close_guest=False)
    assert end == lib.PC_END_VIOLATION
    assert message == "agent protocol violation: malformed frame from the guest"


def test_guest_that_vanishes_is_a_hangup(tmp_path):
    end, _, message, output = relay(frame(STDOUT, 0, b"partial"), tmp_path)
    assert end == lib.PC_END_HANGUP and "exited unexpectedly" in message
    assert output == b"partial"


def test_frames_for_unknown_exec_channels_are_dropped(tmp_path):
    stream = frame(STDOUT, 3, b"nobody owns chan 3") + frame(EXIT, 0, struct.pack("<i", 0))
    end, status, _, output = relay(stream, tmp_path)
    assert (end, status, output) == (lib.PC_END_EXIT, 0, b"")


def test_exit_wins_over_a_shim_that_hangs_up_right_after(tmp_path):
    """An exec proxy whose shim sends EXIT and hangs up while the proxy still has
    stdin queued for it reports the exit status, not a lost channel (137)."""
    ours, shim = socket.socketpair()
    # Input the shim never reads: the proxy's queue to it stays non-empty.
    stdin_file = tmp_path / "stdin"
    stdin_file.write_bytes(b"x" * (3 << 20))
    in_fd = os.open(stdin_file, os.O_RDONLY)
    cfg = ffi.new("struct pc_relay_cfg *")
    cfg.chan_fd, cfg.listen_fd = ours.fileno(), -1
    cfg.in_fd, cfg.out_fd, cfg.err_fd, cfg.tty_fd, cfg.abort_fd = in_fd, -1, -1, -1, -1
    cfg.lease_fd = -1
    cfg.control_fd = -1
    cfg.forward_mask = 0
    res = ffi.new("struct pc_relay_result *")

    def play_shim() -> None:
        time.sleep(0.3)  # long enough for the proxy to fill the socket
        shim.sendall(frame(EXIT, 0, struct.pack("<i", 3)))
        shim.close()

    player = threading.Thread(target=play_shim)
    player.start()
    lib.pc_relay(cfg, res)
    player.join()
    os.close(in_fd)
    ours.close()
    assert (res.end, res.status) == (lib.PC_END_EXIT, 3), ffi.string(res.message)


def test_a_failed_vm_service_ends_the_relay_at_once(tmp_path):
    """The Pager's abort eventfd: readable means the guest broke its protocol."""
    ours, guest = socket.socketpair()
    abort = os.eventfd(0)
    os.eventfd_write(abort, 1)
    cfg = ffi.new("struct pc_relay_cfg *")
    cfg.chan_fd, cfg.listen_fd = ours.fileno(), -1
    cfg.in_fd, cfg.out_fd, cfg.err_fd, cfg.tty_fd, cfg.abort_fd = -1, -1, -1, -1, abort
    cfg.lease_fd = -1
    cfg.control_fd = -1
    res = ffi.new("struct pc_relay_result *")
    lib.pc_relay(cfg, res)
    for fd in (ours, guest):
        fd.close()
    os.close(abort)
    assert res.end == lib.PC_END_ERROR
    assert ffi.string(res.message).decode() == "a VM service failed"


@contextlib.contextmanager
def _leased_relay() -> Iterator[tuple[socket.socket, threading.Event, object]]:
    """A relay that holds a pooled VM's lease, running in a thread; the test
    holds the other end (closed at the end, which ends the relay)."""
    ours, guest = socket.socketpair()
    lease, holder = socket.socketpair()
    cfg = ffi.new("struct pc_relay_cfg *")
    cfg.chan_fd, cfg.listen_fd = ours.fileno(), -1
    cfg.in_fd, cfg.out_fd, cfg.err_fd, cfg.tty_fd, cfg.abort_fd = -1, -1, -1, -1, -1
    cfg.lease_fd, cfg.control_fd = lease.fileno(), -1
    res = ffi.new("struct pc_relay_result *")
    ended = threading.Event()
    relay = threading.Thread(target=lambda: (lib.pc_relay(cfg, res), ended.set()))
    relay.start()
    try:
        yield holder, ended, res
    finally:
        holder.close()
        relay.join(10)
        for fd in (ours, guest, lease):
            fd.close()


def test_a_pooled_vms_relay_ends_when_its_lease_holder_is_gone():
    """While the lease's holder lives the relay runs on; once every copy of
    the other end is closed, it ends."""
    with _leased_relay() as (holder, ended, res):
        time.sleep(0.3)
        assert not ended.is_set(), "the relay ended while its lease was held"
    assert ended.is_set()
    assert res.end == lib.PC_END_RELEASED
    assert ffi.string(res.message).decode() == "the VM's lease ended"


@pytest.mark.parametrize("count, nfds", [(0, 0), (3, 1), (9, 2), (2, 2)],
                         ids=["no-fds", "fewer-fds", "bad-count", "proxy-mode"])
def test_what_a_lease_brings_that_the_relay_cannot_use_is_closed_and_the_vm_goes_on(
        count, nfds):
    """The one message a lease may carry (csrc/relay.h, PC_LEASE_FORWARD_*):
    a malformed one, or one to a relay that is no VM's shim, changes nothing
    and leaves none of its fds open; only the holder's end ends the VM."""
    with _leased_relay() as (holder, ended, res):
        pipes = [os.pipe() for _ in range(nfds)]
        socket.send_fds(holder, [bytes([count])], [w for _, w in pipes])
        for _, w in pipes:
            os.close(w)
        for r, _ in pipes:
            # EOF once the relay closed the copy it was sent.
            ready, _, _ = select.select([r], [], [], 10)
            assert ready and os.read(r, 1) == b"", "the relay kept an fd its lease brought"
            os.close(r)
        time.sleep(0.2)
        assert not ended.is_set(), "a message on the lease ended the VM"
    assert res.end == lib.PC_END_RELEASED
