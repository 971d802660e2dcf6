"""Port forwarding (docs/networking.md): a connection to 127.0.0.1:PORT or
[::1]:PORT inside the container's network namespace on the host, as
containerd's PortForward makes it, reaches whatever listens on that port in
the guest. Real VMs; the server is fwdpeer (paracell/bench/programs/fwdpeer.c)
on the guest's loopback; clients connect from inside namespaces the tests
made, to loopback only."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from paracell.bench import programs
from paracell.net.portforward import attached_links
from tests import fwdutil
from tests.netutil import Netns, netns

pytestmark = pytest.mark.integration

ECHO, SHUT_FIRST, NOBODY = 7300, 7301, 7309
MIB = 1 << 20


@pytest.fixture(scope="module")
def fwdpeer_rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return programs.busybox_rootfs_with("fwdpeer", tmp_path_factory.mktemp("fwd") / "rootfs")


def serving(make_bundle, rootfs: Path, network: dict[str, str]) -> Path:
    def mutate(config):
        config["linux"]["namespaces"].append({"type": "network", **network})
    return make_bundle(["fwdpeer", str(ECHO)], rootfs=rootfs, mutate=mutate)


@contextmanager
def forwarded(runtime, make_bundle, rootfs: Path, ns: Netns, cid: str) -> Iterator[None]:
    """fwdpeer running in a container in ns, with ns's lo up as CNI leaves
    it; the container is deleted afterwards."""
    fwdutil.lo_up(ns)
    started = runtime("run", "-d", "--bundle",
                      str(serving(make_bundle, rootfs, {"path": ns.path})), cid)
    assert started.returncode == 0, started.stderr
    try:
        yield
    finally:
        runtime("delete", "--force", cid)


def shim_pid(runtime, cid: str) -> int:
    return json.loads(runtime("state", cid, check=True).stdout)["pid"]


def test_any_loopback_port_reaches_the_guest_both_families(runtime, make_bundle, fwdpeer_rootfs):
    with netns() as ns:
        with forwarded(runtime, make_bundle, fwdpeer_rootfs, ns, "fwd"):
            assert attached_links(ns.path) == 1
            for address in ("127.0.0.1", "::1"):
                fwdutil.wait_for_echo(ns.path, address, ECHO)
                # 1 MiB each way, byte for byte; the client's half-close
                # reaches the server, whose answer still comes back after it.
                data = os.urandom(MIB)
                assert fwdutil.echo(ns.path, address, ECHO, data) == data + b"done 1048576\n"
                # The server half-closes first: the client reads its 1 MiB and
                # EOF, and what it sends afterwards still reaches the server.
                with fwdutil.connect(ns.path, address, SHUT_FIRST) as sock:
                    assert fwdutil.read_to_eof(sock) == fwdutil.pattern(MIB)
                    late = os.urandom(256 << 10)
                    sock.sendall(late)
                    sock.shutdown(socket.SHUT_WR)
                    assert fwdutil.read_to_eof(sock) == b""
                expected = f"got {len(late)} {fwdutil.fnv1a64(late):016x}"
                assert _last_got(runtime, "fwd") == expected
                # Nothing listens there in the guest: no byte, and the end.
                assert fwdutil.refused(ns.path, address, NOBODY)
        # The steering ended with the shim: the port is closed again.
        assert attached_links(ns.path) == 0
        assert fwdutil.refused(ns.path, "127.0.0.1", ECHO)
    runtime.assert_no_leaks()


def _last_got(runtime, cid: str) -> str:
    """fwdpeer's last record of what it read after its own half-close; it
    writes it once the stream has ended, so wait for it a bounded while."""
    deadline = time.monotonic() + 30
    lines: list[str] = []
    while time.monotonic() < deadline:
        shown = runtime("exec", cid, "cat", "/tmp/fwdpeer-got")
        lines = shown.stdout.decode().splitlines()
        if shown.returncode == 0 and lines:
            return lines[-1]
        time.sleep(0.3)
    raise AssertionError(f"fwdpeer recorded nothing: {lines}")


def test_concurrent_connections_stay_apart(runtime, make_bundle, fwdpeer_rootfs):
    """More streams at once than one window holds, in both families; each
    gets its own bytes back, whole."""
    with netns() as ns, forwarded(runtime, make_bundle, fwdpeer_rootfs, ns, "fwdmany"):
        fwdutil.wait_for_echo(ns.path, "127.0.0.1", ECHO)
        payloads = [os.urandom(384 << 10) for _ in range(8)]
        results: list[bytes | BaseException | None] = [None] * len(payloads)

        def client(i: int) -> None:
            try:
                address = "::1" if i % 2 else "127.0.0.1"
                results[i] = fwdutil.echo(ns.path, address, ECHO, payloads[i])
            except BaseException as err:  # reported below, in the test's thread
                results[i] = err
        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(payloads))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(fwdutil.IO_TIMEOUT_S * 2)
        for payload, got in zip(payloads, results, strict=True):
            assert got == payload + f"done {len(payload)}\n".encode(), \
                got if isinstance(got, BaseException) else len(got or b"")
    runtime.assert_no_leaks()


def test_killed_shim_takes_the_steering_with_it(runtime, make_bundle, fwdpeer_rootfs):
    with netns() as ns:
        fwdutil.lo_up(ns)
        created = runtime("create", "--bundle",
                          str(serving(make_bundle, fwdpeer_rootfs, {"path": ns.path})), "fwdkill")
        assert created.returncode == 0, created.stderr
        assert attached_links(ns.path) == 1
        os.kill(shim_pid(runtime, "fwdkill"), signal.SIGKILL)
        deadline = time.monotonic() + 20
        while attached_links(ns.path) and time.monotonic() < deadline:
            time.sleep(0.1)
        # Nobody cleaned up: the kernel detached it when the shim's fds closed.
        assert attached_links(ns.path) == 0
        assert fwdutil.refused(ns.path, "127.0.0.1", ECHO)
        deleted = runtime("delete", "--force", "fwdkill")
        assert deleted.returncode == 0, deleted.stderr
    runtime.assert_no_leaks()


def test_a_namespace_of_the_shims_own_is_forwarded_too(runtime, make_bundle, fwdpeer_rootfs):
    """`{"type": "network"}` without a path (ctr run, plain bundles): the
    namespace is the shim's; its lo is down until someone (CNI) brings it up."""
    started = runtime("run", "-d", "--bundle",
                      str(serving(make_bundle, fwdpeer_rootfs, {})), "fwdown")
    assert started.returncode == 0, started.stderr
    try:
        ns = Netns("shim", f"/proc/{shim_pid(runtime, 'fwdown')}/ns/net")
        fwdutil.lo_up(ns)
        fwdutil.wait_for_echo(ns.path, "::1", ECHO)
        data = os.urandom(64 << 10)
        assert fwdutil.echo(ns.path, "127.0.0.1", ECHO, data) == data + b"done 65536\n"
    finally:
        runtime("delete", "--force", "fwdown")
    runtime.assert_no_leaks()


def test_the_hosts_own_namespace_is_never_steered(runtime, make_bundle, fwdpeer_rootfs):
    """No network namespace in the spec: the VM cannot have the host's
    network, and the host's loopback stays the host's."""
    before = attached_links("/proc/self/ns/net")
    bundle = make_bundle(["fwdpeer", str(ECHO)], rootfs=fwdpeer_rootfs)
    started = runtime("run", "-d", "--bundle", str(bundle), "fwdhost")
    assert started.returncode == 0, started.stderr
    try:
        assert attached_links(f"/proc/{shim_pid(runtime, 'fwdhost')}/ns/net") == before
    finally:
        runtime("delete", "--force", "fwdhost")
    runtime.assert_no_leaks()
