"""Kubernetes' path onto the libvirt backend: containerd's CRI plugin,
unmodified, runs a pod whose annotation io.paracell.vmm=libvirt makes its VM
a domain of the private libvirt daemon (tests/libvirtd.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.cri import HANDLER, Cri, running_cri, runtime_wrapper

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cri(libvirtd, busybox_rootfs_module: Path) -> Iterator[Cri]:
    # containerd strips the runtime's environment: the daemon's URI and a RAM
    # directory under its shared directory come from a wrapper, as an
    # operator's /etc/paracell/config.json would give them.
    base = libvirtd.workdir / "cri"
    base.mkdir()
    wrapper = runtime_wrapper(base, {"PARACELL_LIBVIRT_URI": libvirtd.uri,
                                     "PARACELL_MEMORY_DIR": str(base / "shm")})
    yield from running_cri(base, busybox_rootfs_module, binary=wrapper)


def test_the_annotation_makes_the_pod_a_libvirt_domain(cri: Cri, libvirtd):
    from paracell.vmm.libvirt import domain

    client = cri.client
    pod_config = cri.pod_config("lvpod", annotations={"io.paracell.vmm": "libvirt"})
    pod = client.run_pod(pod_config, HANDLER)
    names = libvirtd.domains()
    assert len(names) == 1 and names[0].startswith(domain.NAME_PREFIX), names
    import libvirt

    conn = libvirt.open(libvirtd.uri)
    try:
        assert domain.owner_of(conn.lookupByName(names[0]).XMLDesc())["id"] == pod
    finally:
        conn.close()
    ctr = client.create(pod, cri.container_config(
        "exits", ["/bin/sh", "-c", "echo from-libvirt; exit 3"]), pod_config)
    client.start(ctr)
    assert cri.wait_state(ctr, "CONTAINER_EXITED").exit_code == 3
    log = (cri.logs / "lvpod" / "exits.log").read_text()
    assert "from-libvirt" in log
    # The pod's members run inside its one domain: still one.
    assert libvirtd.domains() == names
    client.remove(ctr)
    cri.remove_pod_and_wait(pod)
    assert libvirtd.domains() == []
