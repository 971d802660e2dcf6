"""podman 4.3 on its default bridge network (CNI, 10.88.0.0/16) with ParaCell:
the container's veth reaches the VM. Traffic goes only to the container, to
the bridge's gateway address that podman's CNI made, and to a port that
podman maps for this test; no DNS."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from paracell.settings import DEFAULT_ROOT
from tests.e2e.conftest import IMAGE
from tests.netutil import container_fetches_from, http_get, wait_route_via

pytestmark = pytest.mark.e2e

GATEWAY = "10.88.0.1"  # /etc/cni/net.d/87-podman-bridge.conflist
BRIDGE = "cni-podman0"
NAME = "pcnet-web"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def web(podman):
    """A busybox httpd in a ParaCell container on podman's bridge, port 80
    also published on the host."""
    host_port = _free_port()
    script = "mkdir -p /tmp/www && echo from-vm > /tmp/www/index.html && " \
             "exec httpd -f -p 80 -h /tmp/www"
    started = podman("run", "-d", "--name", NAME, "--network", "bridge",
                     "-p", f"{host_port}:80", IMAGE, "sh", "-c", script)
    assert started.returncode == 0, started.stderr
    try:
        ip = podman("inspect", "-f", "{{.NetworkSettings.IPAddress}}", NAME).stdout.decode().strip()
        assert ip.startswith("10.88."), ip
        wait_route_via(ip, BRIDGE)
        yield ip, host_port
    finally:
        removed = podman("rm", "-f", NAME)
        assert removed.returncode == 0, removed.stderr


def test_host_reaches_httpd_by_container_ip(web):
    ip, _ = web
    page = http_get(None, ip, 80)
    assert page.split(b"\r\n")[0].endswith(b"200 OK") and page.endswith(b"from-vm\n"), page


def test_container_reaches_a_server_on_the_bridge_gateway(podman, web):
    container_fetches_from(GATEWAY, lambda cmd: podman("exec", NAME, "sh", "-c", cmd))


def test_published_port_reaches_the_container(web):
    # The portmap plugin's DNAT catches any local address; the gateway's is ours.
    _, host_port = web
    page = http_get(None, GATEWAY, host_port)
    assert page.endswith(b"from-vm\n"), page


def test_hosts_resolv_conf_and_hostname_bind_mounts(podman, web):
    ip, _ = web
    inside = podman("exec", NAME, "sh", "-c",
                    "cat /etc/hostname; echo ---; cat /etc/hosts; echo ---; cat /etc/resolv.conf")
    assert inside.returncode == 0, inside.stderr
    hostname, hosts, resolv = inside.stdout.decode().split("---\n")
    container_id = podman("inspect", "-f", "{{.Id}}", NAME).stdout.decode().strip()
    assert hostname.strip() == container_id[:12]
    assert any(line.split()[:1] == [ip] for line in hosts.splitlines()), hosts
    path = podman("inspect", "-f", "{{.ResolvConfPath}}", NAME).stdout.decode().strip()
    assert resolv == Path(path).read_text()


def test_a_sandbox_restored_from_a_template_serves_on_the_bridge(podman):
    if podman.env.get("PARACELL_VMM") == "libvirt":
        pytest.skip("VM templates are direct QEMU's only (docs/libvirt.md)")
    # The first VM of this shape boots cold and leaves the template behind.
    seeded = podman("run", "--rm", "--network", "bridge", IMAGE, "true")
    assert seeded.returncode == 0, seeded.stderr
    name = "pcnet-restored"
    script = "mkdir -p /tmp/www && echo restored > /tmp/www/index.html && " \
             "exec httpd -f -p 80 -h /tmp/www"
    started = podman("run", "-d", "--name", name, "--network", "bridge", IMAGE,
                     "sh", "-c", script)
    assert started.returncode == 0, started.stderr
    try:
        full_id = podman("inspect", "-f", "{{.Id}}", name).stdout.decode().strip()
        ip = podman("inspect", "-f", "{{.NetworkSettings.IPAddress}}", name).stdout.decode().strip()
        wait_route_via(ip, BRIDGE)
        page = http_get(None, ip, 80)
        assert page.endswith(b"restored\n"), page
        # podman passes paracell no --root: its state is in the default root.
        state = json.loads((Path(DEFAULT_ROOT) / full_id / "state.json").read_text())
        assert state["vm"]["template"].startswith("restored "), state["vm"]["template"]
    finally:
        removed = podman("rm", "-f", name)
        assert removed.returncode == 0, removed.stderr
