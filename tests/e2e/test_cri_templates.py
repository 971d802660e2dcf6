"""A CRI pod restored from a VM template: the pod's VM, with the network
namespace CNI gave it, comes from the template that the first pod of its
shape left, and its two members start inside it as in a cold one
(docs/templates.md). The default memory manager, the Pager: its rings are
guest RAM and come back with the rest."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.cri import HANDLER, Cri, running_cri, runtime_wrapper

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cri(tmp_path_factory: pytest.TempPathFactory, busybox_rootfs_module: Path) -> Iterator[Cri]:
    base = tmp_path_factory.mktemp("cri-templates")
    # The fixture's own template store, never the system's.
    wrapper = runtime_wrapper(base, {"PARACELL_TEMPLATES": str(base / "templates")})
    yield from running_cri(base, busybox_rootfs_module, binary=wrapper)


def vm_record(cri: Cri, pod: str) -> dict:
    return json.loads((cri.paracell_root / "k8s.io" / pod / "state.json").read_text())["vm"]


def test_a_pod_restored_from_a_template_runs_two_members(cri: Cri):
    client = cri.client
    seed_config = cri.pod_config("seed")
    seed = client.run_pod(seed_config, HANDLER)
    assert vm_record(cri, seed)["template"].startswith("saved "), vm_record(cri, seed)
    cri.remove_pod_and_wait(seed)
    pod_config = cri.pod_config("restored")
    pod = client.run_pod(pod_config, HANDLER)
    assert vm_record(cri, pod)["template"].startswith("restored "), vm_record(cri, pod)
    server, fetcher = cri.running(pod, pod_config, cri.container_config(
        "server", ["/bin/sh", "-c", "echo from-restored-pod > /tmp/index.html; "
                   "exec httpd -f -p 127.0.0.1:8080 -h /tmp"]), cri.container_config(
        "fetcher", ["sleep", "1000"]))
    assert len(cri.qemu_pids()) == 1
    assert cri.fetch_local(fetcher, "http://127.0.0.1:8080/") == b"from-restored-pod\n"
    assert client.exec_sync(server, ["hostname"]).stdout == b"restored\n"
    cri.remove_pod_and_wait(pod)
    assert client.pods() == []
