"""Network namespaces, veth pairs and tiny servers that tests make for
themselves. Traffic in the tests goes only to addresses made here (or by the
podman/containerd networks a test sets up): no DNS, nothing outside, and
every wait is bounded in time."""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from pyroute2 import IPRoute
from pyroute2 import netns as pr_netns

from paracell.net import netns as pc_netns

T = TypeVar("T")
_counter = itertools.count()


@dataclass
class Netns:
    name: str
    # Another namespace file than /run/netns/NAME (a process's /proc/PID/ns/net).
    at: str = ""

    @property
    def path(self) -> str:
        return self.at or f"/run/netns/{self.name}"

    def run(self, body: Callable[[], T]) -> T:
        """body() in a thread inside this namespace."""
        return pc_netns.run_inside(self.path, body)  # type: ignore[return-value]

    def ipr(self, body: Callable[[IPRoute], T]) -> T:
        def inside() -> T:
            with IPRoute() as ipr:
                return body(ipr)
        return pc_netns.run_inside(self.path, inside)  # type: ignore[return-value]

    def link(self, name: str) -> dict[str, Any]:
        def get(ipr: IPRoute) -> dict[str, Any]:
            (link,) = ipr.get_links(ifname=name)
            return {"index": link["index"], "mac": link.get("address"), "mtu": link.get("mtu")}
        return self.ipr(get)

    def link_names(self) -> list[str]:
        return self.ipr(lambda ipr: [str(lk.get("ifname")) for lk in ipr.get_links()])

    def ingress_qdiscs(self) -> list[str]:
        """Every ingress (or clsact) qdisc in the namespace, as 'ifname'."""
        def get(ipr: IPRoute) -> list[str]:
            names = {lk["index"]: lk.get("ifname") for lk in ipr.get_links()}
            return [str(names.get(q["index"])) for q in ipr.get_qdiscs()
                    if q.get_attr("TCA_KIND") in ("ingress", "clsact")]
        return self.ipr(get)


@contextmanager
def netns(prefix: str = "pct") -> Iterator[Netns]:
    """A new, empty network namespace under /run/netns, removed afterwards."""
    ns = Netns(f"{prefix}{os.getpid()}x{next(_counter)}")
    pr_netns.create(ns.name)
    try:
        yield ns
    finally:
        pr_netns.remove(ns.name)


def veth(a: Netns, a_name: str, b: Netns, b_name: str, *, mtu: int = 1500,
         a_addrs: tuple[str, ...] = (), b_addrs: tuple[str, ...] = ()) -> None:
    """A veth pair between two namespaces, up, with addresses ("10.1.0.2/24")."""
    tmp = f"pcv{os.getpid() % 100000}{next(_counter)}"

    def make(ipr: IPRoute) -> None:
        ipr.link("add", ifname=tmp, kind="veth", peer={"ifname": b_name, "net_ns_fd": b.path})
        ipr.link("set", index=ipr.link_lookup(ifname=tmp)[0], ifname=a_name)
    a.ipr(make)
    for ns, name, addrs in ((a, a_name, a_addrs), (b, b_name, b_addrs)):
        def configure(ipr: IPRoute, name: str = name, addrs: tuple[str, ...] = addrs) -> None:
            index = ipr.link_lookup(ifname=name)[0]
            ipr.link("set", index=index, mtu=mtu, state="up")
            for addr in addrs:
                address, prefix = addr.split("/")
                # No duplicate detection: the address is usable at once.
                ipr.addr("add", index=index, address=address, prefixlen=int(prefix),
                         **({"IFA_FLAGS": 0x02} if ":" in address else {}))
        ns.ipr(configure)


def route(ns: Netns, dst: str, gateway: str) -> None:
    ns.ipr(lambda ipr: ipr.route("add", dst=dst, gateway=gateway))


class Server:
    """A TCP server in a thread: answers each connection with `reply` and
    records what each sent first. Its socket is made inside `ns` (None: here)."""

    def __init__(self, ns: Netns | None, address: str, reply: bytes, port: int = 0) -> None:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET

        def make() -> socket.socket:
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
            sock.listen(16)
            return sock
        self.sock = ns.run(make) if ns else make()
        self.port = self.sock.getsockname()[1]
        self.reply = reply
        self.received: list[bytes] = []
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            with conn:
                conn.settimeout(5)
                try:
                    self.received.append(conn.recv(4096))
                    conn.sendall(self.reply)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


def http_get(ns: Netns | None, address: str, port: int, timeout: float = 60,
             path: str = "/") -> bytes:
    """GET path from address:port, retried until it answers or `timeout`
    passes (the container may still be booting); its socket is made inside `ns`."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        def attempt() -> bytes:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.settimeout(5)
                sock.connect((address, port))
                sock.sendall(f"GET {path} HTTP/1.0\r\nHost: test\r\n\r\n".encode())
                chunks = []
                while chunk := sock.recv(65536):
                    chunks.append(chunk)
                return b"".join(chunks)
        try:
            return ns.run(attempt) if ns else attempt()
        except OSError as err:
            last = err
            time.sleep(0.3)
    raise AssertionError(f"no answer from {address}:{port} in {timeout:.0f} s: {last}")


def wait_route_via(address: str, ifname: str, timeout: float = 90) -> None:
    """Waits until this namespace routes `address` through `ifname` (a bridge
    that CNI makes only when the container starts). Until then a packet to it
    would follow the default route off the machine, so nothing is sent before."""
    deadline = time.monotonic() + timeout
    with IPRoute() as ipr:
        while time.monotonic() < deadline:
            wanted = ipr.link_lookup(ifname=ifname)
            if wanted:
                routes = ipr.route("get", dst=address)
                if routes and routes[0].get("oif") == wanted[0]:
                    return
            time.sleep(0.2)
    raise AssertionError(f"{address} is not routed through {ifname} after {timeout:.0f} s")


def container_fetches_from(address: str,
                           run_inside: Callable[[str], subprocess.CompletedProcess[bytes]]) -> None:
    """The container (run_inside runs a shell command in it) fetches a page
    from a server this test starts on `address`, one of the host's. busybox
    nc, not wget: Debian's static wget crashes (under runc too) once podman's
    /etc files are mounted."""
    server = Server(None, address, b"HTTP/1.0 200 OK\r\n\r\nfrom-host\n")
    try:
        got = run_inside(f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 10 {address} {server.port}")
    finally:
        server.close()
    assert got.returncode == 0, got.stderr
    assert got.stdout.endswith(b"\r\n\r\nfrom-host\n"), got.stdout
    assert server.received and server.received[0].startswith(b"GET / ")
