"""containerd's `ctr run --cni` with ParaCell: a CNI bridge network that this
test writes (its own bridge, subnet, IPAM directory), reached both ways.

ctr reads the first config in /etc/cni/net.d and runs plugins from
/opt/cni/bin (go-cni's defaults; ctr has no flag for either), so the test
puts a uniquely named config first there and, where /opt/cni/bin is missing,
a link to Debian's plugins in /usr/lib/cni; it removes both, the bridge and
its IPAM state afterwards. Traffic goes only to the container's address and
to the bridge's, both from that config; no DNS."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from pyroute2 import IPRoute

from tests.e2e.conftest import IMAGE
from tests.netutil import container_fetches_from, http_get, wait_route_via

pytestmark = pytest.mark.e2e

CNI_CONF_DIR = Path("/etc/cni/net.d")
CNI_BIN_DIR = Path("/opt/cni/bin")
DEBIAN_PLUGINS = Path("/usr/lib/cni")


@pytest.fixture
def cni_network(tmp_path):
    """(container address, gateway address, bridge) of a one-address bridge network."""
    if not (DEBIAN_PLUGINS / "bridge").exists():
        pytest.fail("CNI plugins are not installed: run `make deps` "
                    "(Debian's containernetworking-plugins)")
    tag = os.getpid() % 10000
    with IPRoute() as ipr:
        used = {str(r.get("dst")) for r in ipr.get_routes(family=2)}
    third = next(n for n in range(tag % 200 + 20, 255) if f"10.123.{n}.0" not in used)
    subnet, gateway, address = f"10.123.{third}.0/24", f"10.123.{third}.1", f"10.123.{third}.2"
    bridge = f"pcbr{tag}"
    conf = CNI_CONF_DIR / f"00-paracell-test-{os.getpid()}.conflist"
    conf.write_text(json.dumps({
        "cniVersion": "0.4.0", "name": f"paracell-test-{os.getpid()}",
        "plugins": [{
            "type": "bridge", "bridge": bridge, "isGateway": True, "ipMasq": False,
            "ipam": {"type": "host-local", "dataDir": str(tmp_path / "ipam"),
                     "ranges": [[{"subnet": subnet, "rangeStart": address,
                                  "rangeEnd": address, "gateway": gateway}]],
                     "routes": [{"dst": "0.0.0.0/0"}]},
        }],
    }))
    made_bin = not CNI_BIN_DIR.exists()
    made_parent = not CNI_BIN_DIR.parent.exists()
    if made_bin:
        CNI_BIN_DIR.parent.mkdir(exist_ok=True)
        CNI_BIN_DIR.symlink_to(DEBIAN_PLUGINS)
    try:
        yield address, gateway, bridge
    finally:
        conf.unlink(missing_ok=True)
        if made_bin:
            CNI_BIN_DIR.unlink()
        if made_parent:
            shutil.rmtree(CNI_BIN_DIR.parent, ignore_errors=True)
        with IPRoute() as ipr:
            for index in ipr.link_lookup(ifname=bridge):
                ipr.link("del", index=index)


def _run_web(containerd, name: str, address: str, gateway: str, bridge: str,
             *flags: str) -> dict:
    script = ("mkdir -p /tmp/www && ip addr > /tmp/www/index.html && "
              "exec httpd -f -p 80 -h /tmp/www")
    cmd = ["ctr", "--address", str(containerd.socket), "run", *containerd.run_args(), "--rm",
           "--cni", *flags, IMAGE, name, "sh", "-c", script]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=containerd.env)
    try:
        # The bridge, and so the route to the container, exists once CNI ran.
        wait_route_via(address, bridge)
        page = http_get(None, address, 80, timeout=90).decode()
        assert f"inet {address}/24" in page, page
        container_fetches_from(gateway, lambda cmd: containerd.ctr(
            "task", "exec", "--exec-id", "nc", name, "sh", "-c", cmd))
        state_file = containerd.runc_root / "default" / name / "state.json"
        state = json.loads(state_file.read_text())
        # What the container's host process runs now: the Python shim, or
        # paracell-vmshim once nothing of the VM needs Python.
        return {**state["vm"], "shim_exe": os.readlink(f"/proc/{state['shim_pid']}/exe"),
                "pool_vm": state["pool_vm"]}
    finally:
        containerd.ctr("task", "kill", "-s", "SIGKILL", name)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        containerd.ctr("task", "delete", "--force", name)
        containerd.ctr("containers", "delete", name)
        assert name.encode() not in containerd.ctr("containers", "ls").stdout


def test_ctr_run_cni_reaches_the_vm_both_ways(containerd, cni_network):
    _run_web(containerd, "ctr-net", *cni_network)


def test_ctr_run_cni_reaches_a_vm_restored_from_a_template(containerd, cni_network):
    """`ctr run --cni` adds the veth between create and start: a restored
    VM takes it on a spare NIC of the template's, as a cold one does."""
    if containerd.env.get("PARACELL_VMM") == "libvirt":
        pytest.skip("VM templates are direct QEMU's only (docs/libvirt.md)")
    # The first VM of this shape boots cold and leaves the template behind.
    seeded = containerd.ctr("run", *containerd.run_args(), "--rm", "--cni", IMAGE,
                            "ctr-seed", "true")
    assert seeded.returncode == 0, seeded.stderr
    vm = _run_web(containerd, "ctr-restored", *cni_network)
    assert vm["template"].startswith("restored "), vm["template"]
    # Its shim is C by then: the veth was mirrored by paracell.net.latestart.
    assert vm["shim_exe"].endswith("/paracell-vmshim"), vm["shim_exe"]


def test_ctr_run_cni_on_a_vm_from_the_warm_pool(containerd, cni_network):
    """A task that takes a pooled VM (docs/pool.md): CNI works on the
    namespace its proxy made, never the host's, and at start the pooled VM's
    spare takes the veth over."""
    from tests import poolutil

    if containerd.env.get("PARACELL_VMM") == "libvirt":
        pytest.skip("the warm pool keeps VMs restored from templates, which only direct "
                    "QEMU saves (docs/pool.md)")
    with poolutil.serving(containerd.runc_root / "default", env=containerd.env) as pool:
        (waiting,) = pool.waiting()
        vm = _run_web(containerd, "ctr-pooled", *cni_network)
        assert vm["pool_vm"] == waiting
