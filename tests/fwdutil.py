"""Clients for the port-forwarding tests: connections made inside a network
namespace on the host to its loopback, as containerd's PortForward makes
them, and the checks of what fwdpeer (paracell/bench/programs/fwdpeer.c)
answers. Only loopback addresses, in namespaces the tests made; every wait
is bounded."""

from __future__ import annotations

import socket
import time

from paracell.net import netns as pc_netns
from tests.netutil import Netns

IO_TIMEOUT_S = 60


def lo_up(ns: Netns) -> None:
    """What CNI's loopback plugin does for a pod's namespace."""
    ns.ipr(lambda ipr: ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up"))


def fnv1a64(data: bytes) -> int:
    value = 0xCBF29CE484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return value


def pattern(n: int) -> bytes:
    """What fwdpeer's server half-close port sends: byte i is i % 251."""
    return bytes(i % 251 for i in range(251)) * (n // 251) + bytes(range(n % 251))


def connect(netns_path: str, address: str, port: int, timeout: float = IO_TIMEOUT_S,
            rcvbuf: int = 0) -> socket.socket:
    """A TCP connection to address:port from inside the namespace: the socket
    is made there (a socket's namespace is the one it was made in). rcvbuf:
    a receive buffer this small, for a client that takes little."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = pc_netns.run_inside(netns_path, lambda: socket.socket(family, socket.SOCK_STREAM))
    assert sock is not None, f"network namespace {netns_path} is gone"
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(timeout)
    try:
        sock.connect((address, port))
    except OSError:
        sock.close()
        raise
    return sock


def read_to_eof(sock: socket.socket, limit: int = 64 << 20) -> bytes:
    chunks, total = [], 0
    while total <= limit and (chunk := sock.recv(1 << 16)):
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def echo(netns_path: str, address: str, port: int, data: bytes) -> bytes:
    """Sends data, half-closes, and returns everything up to the server's EOF:
    a sender thread, so that neither side's buffers have to hold it all."""
    import threading

    with connect(netns_path, address, port) as sock:
        def send() -> None:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        sender = threading.Thread(target=send)
        sender.start()
        try:
            return read_to_eof(sock)
        finally:
            sender.join(IO_TIMEOUT_S)


def wait_for_echo(netns_path: str, address: str, port: int, timeout: float = 90) -> None:
    """Until the container's server answers: before it listens, the guest
    refuses and the connection is reset."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = echo(netns_path, address, port, b"ping")
            if last == b"ping" + b"done 4\n":
                return
        except OSError as err:
            last = err
        time.sleep(0.3)
    raise AssertionError(f"no echo from {address}:{port} in {timeout:.0f} s: {last!r}")


def refused(netns_path: str, address: str, port: int) -> bool:
    """Whether a connection there ends without a byte: refused at connect (no
    steering), or accepted by the steering and reset once the guest refused."""
    try:
        with connect(netns_path, address, port, timeout=30) as sock:
            return read_to_eof(sock) == b""
    except (ConnectionRefusedError, ConnectionResetError):
        return True
