"""Port forwarding's host half (csrc/portfwd.c, csrc/streams.c) in real network
namespaces, no VM: the steering of loopback connections to the shim's
listeners, and the real C relay against a test that plays a hostile guest on
the agent channel. Connections go to loopback only, in namespaces made here."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest
from paracell._native import ffi, lib

from paracell.net.portforward import PortForward, attached_links
from tests import fwdutil
from tests.netutil import Netns, netns

EXIT, STDOUT = lib.PC_EXIT, lib.PC_STDOUT
OPEN, DATA, CREDIT = lib.PC_FWD_OPEN, lib.PC_FWD_DATA, lib.PC_FWD_CREDIT
SHUT, CLOSE = lib.PC_FWD_SHUT, lib.PC_FWD_CLOSE
WINDOW = lib.PC_FWD_WINDOW
MAX_PAYLOAD = lib.PC_MAX_PAYLOAD


def frame(ftype: int, chan: int, payload: bytes = b"") -> bytes:
    return struct.pack("<IHH", len(payload), ftype, chan) + payload


def credit(n: int) -> bytes:
    return struct.pack("<I", n)


@pytest.fixture
def ns() -> Iterator[Netns]:
    with netns("pcf") as made:
        fwdutil.lo_up(made)
        yield made


def test_every_loopback_port_lands_on_the_listeners_until_detach(ns):
    forward = ns.run(PortForward.attach)
    try:
        assert attached_links(ns.path) == 1
        listeners = {"127.0.0.1": forward.listeners.listen4, "::1": forward.listeners.listen6}
        for address, port in (("127.0.0.1", 40001), ("::1", 40002), ("127.0.0.1", 1)):
            with fwdutil.connect(ns.path, address, port, timeout=5):
                listener = socket.socket(fileno=os.dup(listeners[address]))
                listener.settimeout(5)
                with listener, listener.accept()[0] as accepted:
                    # The accepted socket's own address is what the client dialled.
                    assert accepted.getsockname()[:2] == (address, port)
    finally:
        forward.detach()
    assert attached_links(ns.path) == 0
    with pytest.raises(ConnectionRefusedError):
        fwdutil.connect(ns.path, "127.0.0.1", 40001, timeout=5)


class GuestSide:
    """The shim's real relay, with port forwarding, in a thread; the test is
    the guest at the other end of the agent channel."""

    def __init__(self, tmp_path, ns: Netns, forward: bool = True) -> None:
        self.ns = ns
        self.client: socket.socket | None = None
        self.forward = ns.run(PortForward.attach) if forward else None
        self.ours, self.guest = socket.socketpair()
        self.guest.settimeout(10)
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(str(tmp_path / "shim.sock"))
        self.listener.listen(1)
        self.cfg = ffi.new("struct pc_relay_cfg *")
        cfg = self.cfg
        cfg.chan_fd, cfg.listen_fd = self.ours.fileno(), self.listener.fileno()
        cfg.in_fd, cfg.out_fd, cfg.err_fd, cfg.tty_fd, cfg.abort_fd = -1, -1, -1, -1, -1
        cfg.lease_fd = -1
        cfg.control_fd = -1
        cfg.fwd = self.forward.listeners if self.forward else ffi.NULL
        self.res = ffi.new("struct pc_relay_result *")
        self.thread = threading.Thread(target=lib.pc_relay, args=(self.cfg, self.res))
        self.thread.start()

    def send(self, ftype: int, chan: int, payload: bytes = b"") -> None:
        self.guest.sendall(frame(ftype, chan, payload))

    def recv(self) -> tuple[int, int, bytes]:
        header = self._exact(8)
        length, ftype, chan = struct.unpack("<IHH", header)
        return ftype, chan, self._exact(length)

    def _exact(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.guest.recv(n - len(data))
            if not chunk:
                raise EOFError("the relay closed the channel")
            data += chunk
        return data

    def expect(self, ftype: int) -> tuple[int, bytes]:
        got, chan, payload = self.recv()
        assert got == ftype, (got, chan, payload[:40])
        return chan, payload

    def opened(self, address: str, port: int, rcvbuf: int = 0) -> tuple[socket.socket, int]:
        """A client connection, and the stream id the host opened for it."""
        client = fwdutil.connect(self.ns.path, address, port, timeout=10, rcvbuf=rcvbuf)
        chan, payload = self.expect(OPEN)
        family = lib.PC_FWD_INET6 if ":" in address else lib.PC_FWD_INET
        assert payload == struct.pack("<HH", port, family)
        assert 1 <= chan <= lib.PC_FWD_MAX_STREAMS
        return client, chan

    def end(self) -> tuple[int, str]:
        """Ends the relay (the container exits) unless it has ended already."""
        if self.thread.is_alive():
            self.send(EXIT, 0, struct.pack("<i", 0))
        self.thread.join(20)
        assert not self.thread.is_alive()
        if self.forward:
            self.forward.detach()
        for s in (self.ours, self.guest, self.listener):
            s.close()
        return self.res.end, ffi.string(self.res.message).decode()


@pytest.fixture
def guest(tmp_path, ns) -> Iterator[GuestSide]:
    side = GuestSide(tmp_path, ns)
    yield side
    if side.thread.is_alive():
        side.end()


def test_a_stream_both_ways_with_half_closes_and_credit(guest):
    client, chan = guest.opened("::1", 8080)
    guest.send(DATA, chan, b"hello from the guest")
    assert client.recv(100) == b"hello from the guest"
    # The host gives the credit back once the client has the bytes.
    assert guest.expect(CREDIT) == (chan, credit(20))
    client.sendall(b"and from the host")
    assert guest.expect(DATA) == (chan, b"and from the host")
    # The guest's server half-closes: the client reads EOF and can still send.
    guest.send(SHUT, chan)
    assert client.recv(100) == b""
    client.sendall(b"after the guest's EOF")
    assert guest.expect(DATA) == (chan, b"after the guest's EOF")
    client.shutdown(socket.SHUT_WR)
    assert guest.expect(SHUT) == (chan, b"")
    # Both sides are done: the host closes, the guest answers, the id is free.
    assert guest.expect(CLOSE) == (chan, b"")
    guest.send(CLOSE, chan)
    second, again = guest.opened("127.0.0.1", 8080)
    assert again == chan
    client.close()
    second.close()
    assert guest.end() == (lib.PC_END_EXIT, "")


def test_the_host_sends_no_more_than_the_guest_allows(guest):
    client, chan = guest.opened("127.0.0.1", 9000)
    sender = threading.Thread(target=lambda: _send_quietly(client, b"x" * (4 * WINDOW)))
    sender.start()
    got = _data_for(guest, chan, 1.0)
    assert got == WINDOW, "the host overran the guest's window"
    guest.send(CREDIT, chan, credit(MAX_PAYLOAD))
    assert _data_for(guest, chan, 1.0) == MAX_PAYLOAD
    client.close()
    sender.join(10)
    assert guest.end()[0] == lib.PC_END_EXIT


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:
        pass  # the test closed it


def _data_for(guest: GuestSide, chan: int, quiet_s: float) -> int:
    """DATA bytes for chan until nothing comes for quiet_s (bounded)."""
    total, deadline = 0, time.monotonic() + 30
    guest.guest.settimeout(quiet_s)
    try:
        while time.monotonic() < deadline:
            ftype, got_chan, payload = guest.recv()
            assert (ftype, got_chan) == (DATA, chan)
            total += len(payload)
    except TimeoutError:
        pass
    finally:
        guest.guest.settimeout(10)
    return total


def test_a_refused_connection_in_the_guest_resets_the_client(guest):
    client, chan = guest.opened("127.0.0.1", 7)
    guest.send(CLOSE, chan)  # what the agent sends when its connect fails
    assert guest.expect(CLOSE) == (chan, b"")
    with client, pytest.raises(ConnectionResetError):
        client.recv(10)
    assert guest.end()[0] == lib.PC_END_EXIT


def test_frames_racing_the_hosts_close_are_dropped(guest):
    client, chan = guest.opened("127.0.0.1", 7000)
    # The client resets: the host closes the stream at once.
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()
    assert guest.expect(CLOSE) == (chan, b"")
    # The guest had not seen it yet: its DATA, CREDIT and SHUT are no offence.
    guest.send(DATA, chan, b"late")
    guest.send(CREDIT, chan, credit(1))
    guest.send(SHUT, chan)
    guest.send(CLOSE, chan)
    assert guest.end() == (lib.PC_END_EXIT, "")


def test_at_most_max_streams_at_once(guest):
    clients, chans = [], set()
    for i in range(lib.PC_FWD_MAX_STREAMS):
        client, chan = guest.opened("127.0.0.1", 10000 + i)
        clients.append(client)
        chans.add(chan)
    assert chans == set(range(1, lib.PC_FWD_MAX_STREAMS + 1))
    # One more waits in the listener's backlog: no OPEN for it...
    waiting = fwdutil.connect(guest.ns.path, "127.0.0.1", 20000, timeout=10)
    guest.guest.settimeout(0.5)
    with pytest.raises(TimeoutError):
        guest.recv()
    guest.guest.settimeout(10)
    # ...until a stream ends.
    guest.send(CLOSE, 5)
    assert guest.expect(CLOSE) == (5, b"")
    assert guest.expect(OPEN) == (5, struct.pack("<HH", 20000, lib.PC_FWD_INET))
    for client in [*clients, waiting]:
        client.close()
    guest.end()


def _opened_stream(guest: GuestSide) -> int:
    """Stream 1, open, to a client that reads nothing, with little buffered
    on either end of its connection, so the host can give little credit
    back. The client stays referenced."""
    def small_send_buffers() -> None:
        with open("/proc/sys/net/ipv4/tcp_wmem", "w") as f:  # this namespace's
            f.write("4096 8192 8192")
    guest.ns.run(small_send_buffers)
    guest.client = guest.opened("127.0.0.1", 7100, rcvbuf=4096)[0]
    return 1


HOSTILE = {
    "data for a stream never opened": lambda g: [frame(DATA, 3, b"x")],
    "stream id 0": lambda g: [frame(CREDIT, 0, credit(1))],
    "stream id past the bound": lambda g: [frame(DATA, lib.PC_FWD_MAX_STREAMS + 1, b"x")],
    "an OPEN from the guest": lambda g: [frame(OPEN, 1, struct.pack("<HH", 80, 4))],
    # Twice the window: more than the window beyond all the client can absorb.
    "data beyond the window": lambda g: [frame(DATA, _opened_stream(g), b"x" * MAX_PAYLOAD)] * (
        2 * WINDOW // MAX_PAYLOAD),
    "empty data": lambda g: [frame(DATA, _opened_stream(g))],
    "credit for bytes never sent": lambda g: [frame(CREDIT, _opened_stream(g), credit(1))],
    "credit of the wrong size": lambda g: [frame(CREDIT, _opened_stream(g), b"\1\0")],
    "shut twice": lambda g: [frame(SHUT, _opened_stream(g)), frame(SHUT, 1)],
    "data after shut": lambda g: [frame(SHUT, _opened_stream(g)), frame(DATA, 1, b"x")],
    "close with a payload": lambda g: [frame(CLOSE, _opened_stream(g), b"x")],
    "a frame after the guest's close freed the id": lambda g: [
        frame(CLOSE, _opened_stream(g)), frame(DATA, 1, b"x")],
}


@pytest.mark.parametrize("case", list(HOSTILE), ids=list(HOSTILE))
def test_a_hostile_guest_ends_the_vm_not_the_host(guest, case):
    frames = b"".join(HOSTILE[case](guest))

    def play() -> None:
        try:
            guest.guest.sendall(frames)
        except OSError:
            pass  # the relay stopped reading at the bad frame, and the test closed it
    player = threading.Thread(target=play)
    player.start()
    guest.thread.join(20)
    end, message = guest.end()
    player.join(20)
    assert end == lib.PC_END_VIOLATION, message
    assert message.startswith("agent protocol violation: port-forward"), message


def test_port_forward_frames_to_a_vm_without_it_are_a_violation(tmp_path, ns):
    side = GuestSide(tmp_path, ns, forward=False)
    side.send(DATA, 1, b"x")
    side.thread.join(20)
    assert side.end() == (lib.PC_END_VIOLATION, "agent protocol violation: port-forward "
                                                "frame, but this VM forwards no ports")
