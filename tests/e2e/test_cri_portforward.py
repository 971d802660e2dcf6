"""`kubectl port-forward` on a ParaCell pod: containerd's CRI PortForward,
driven through its streaming server with a real client, and a plain
`nsenter` into the pod's network namespace, both reaching a server that
listens on the guest's loopback (docs/networking.md, "Port forwarding").

containerd 1.6 serves PortForward with Kubernetes' streaming code, which
speaks SPDY (kubectl's way) and WebSocket (the v4 channel protocol): this test
is a WebSocket client. Either way, containerd then enters the pod's network
namespace and dials localhost:PORT there, as it would for a runc pod."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from paracell.bench import programs
from paracell.net.portforward import attached_links
from tests import fwdutil
from tests.e2e.conftest import oci_image_tar
from tests.e2e.cri import HANDLER, Cri, running_cri

pytestmark = pytest.mark.e2e

FWD_IMAGE = "localhost/fwdpeer:latest"
ECHO, NOBODY = 7300, 7309
# The v4 channel protocol: every message starts with its channel's number;
# channel 2i carries port i's bytes, 2i+1 its errors.
V4 = "v4.channel.k8s.io"
DATA_CH, ERROR_CH = 0, 1


@pytest.fixture(scope="module")
def cri(tmp_path_factory: pytest.TempPathFactory, busybox_rootfs_module: Path) -> Iterator[Cri]:
    base = tmp_path_factory.mktemp("cri")
    for daemon in running_cri(base, busybox_rootfs_module):
        rootfs = programs.busybox_rootfs_with("fwdpeer", base / "fwd-rootfs")
        image = oci_image_tar(rootfs, base / "fwd.tar", name=FWD_IMAGE,
                              cmd=("/usr/local/bin/fwdpeer", str(ECHO)))
        imported = daemon.ctr("images", "import", "--platform", "linux/amd64", str(image))
        assert imported.returncode == 0, imported.stderr
        yield daemon


class PortForwardSocket:
    """One port of a PortForward session, over containerd's streaming server."""

    def __init__(self, url: str, port: int) -> None:
        import websocket

        ws_url = url.replace("http://", "ws://", 1) + f"?port={port}"
        self.ws = websocket.create_connection(ws_url, subprotocols=[V4], timeout=60)
        self.errors = b""
        # The server opens each channel with the port number, little-endian.
        opened = {self._message()[0] for _ in range(2)}
        assert opened == {DATA_CH, ERROR_CH}

    def _message(self) -> tuple[int, bytes]:
        import websocket

        try:
            _, data = self.ws.recv_data()
        except websocket.WebSocketConnectionClosedException:
            return -1, b""
        if not data:
            return -1, b""
        return data[0], data[1:]

    def send(self, data: bytes) -> None:
        for at in range(0, len(data), 32 << 10):
            self.ws.send_binary(bytes([DATA_CH]) + data[at:at + (32 << 10)])

    def receive(self, limit: int) -> bytes:
        """Data until `limit` bytes came or the session ended (bounded by the
        socket's timeout); error-channel text is kept in self.errors."""
        got = b""
        while len(got) < limit:
            channel, payload = self._message()
            if channel == DATA_CH:
                got += payload
            elif channel == ERROR_CH:
                self.errors += payload
            else:
                break
        return got

    def close(self) -> None:
        self.ws.close()


def _sandbox_netns(cri: Cri, pod: str) -> str:
    """The pod's network namespace as containerd sees it: the sandbox
    shim's, since containerd hands the shim that namespace."""
    import json

    state = cri.paracell("state", pod)
    assert state.returncode == 0, state.stderr
    return f"/proc/{json.loads(state.stdout)['pid']}/ns/net"


def test_port_forward_reaches_the_pods_localhost(cri: Cri):
    client = cri.client
    pod_config = cri.pod_config("portfwd")
    pod = client.run_pod(pod_config, HANDLER)
    [server] = cri.running(pod, pod_config, {
        **cri.container_config("server", ["/usr/local/bin/fwdpeer", str(ECHO)]),
        "image": {"image": FWD_IMAGE}})
    netns = _sandbox_netns(cri, pod)
    # Held open across the removal: the namespace outlives the pod for us to
    # look at (CNI's teardown has taken its loopback down by then).
    held = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
    try:
        assert attached_links(netns) == 1
        fwdutil.wait_for_echo(netns, "127.0.0.1", ECHO)

        # containerd's own path: PortForward, its streaming server, its dial.
        url = client.port_forward(pod, [ECHO])
        session = PortForwardSocket(url, ECHO)
        data = os.urandom(1 << 20)
        sender = threading.Thread(target=session.send, args=(data,))
        sender.start()
        try:
            assert session.receive(len(data)) == data, session.errors
        finally:
            sender.join(60)
            session.close()
        assert session.errors == b""
        # Nothing listens on that port in the guest: the session ends with no byte.
        empty = PortForwardSocket(client.port_forward(pod, [NOBODY]), NOBODY)
        empty.send(b"anyone?")
        assert empty.receive(1) == b""
        empty.close()

        # And a plain nsenter into the pod's namespace, both families.
        for address in ("127.0.0.1", "::1"):
            got = subprocess.run(["nsenter", f"--net={netns}", "busybox", "nc", address,
                                  str(ECHO)], input=b"over nsenter\n", capture_output=True,
                                 timeout=60)
            assert (got.returncode, got.stdout) == (0, b"over nsenter\ndone 13\n"), got.stderr
        assert client.exec_sync(server, ["echo", "alive"]).stdout == b"alive\n"

        cri.remove_pod_and_wait(pod)
        pod = ""
        # The steering went with the sandbox's shim: nothing is left in the namespace.
        deadline = time.monotonic() + 20
        while attached_links(f"/proc/self/fd/{held}") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert attached_links(f"/proc/self/fd/{held}") == 0
    finally:
        os.close(held)
        if pod:
            cri.remove_pod_and_wait(pod)
