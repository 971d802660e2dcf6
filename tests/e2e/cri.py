"""A real containerd with its CRI plugin, private state, a locally built pause
image, Debian's CNI plugins on a bridge of the fixture's own, and ParaCell
registered as the runtime handlers `paracell` (the runc v2 shim with
BinaryName) and `paracell-v2` (the shim v2), as oci/containerd/config.toml
does. The CRI client in paracell.cri plays kubelet."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from paracell import settings
from paracell.cri.client import CriClient
from paracell.vmm import memory
from tests.conftest import PARACELL, REPO
from tests.e2e.conftest import IMAGE, SHIM_BINARY, oci_image_tar, stop_containerd, wait_for

PAUSE_IMAGE = "localhost/pause:paracell"
HANDLER = "paracell"  # containerd's runc v2 shim, paracell as its BinaryName
HANDLER_V2 = "paracell-v2"  # paracell's own shim v2 (paracell/shimv2/)
BRIDGE = "pccri0"
SUBNET = "10.217.0.0/24"
CNI_BIN = "/usr/lib/cni"


@dataclass
class Cri:
    client: CriClient
    base: Path
    socket: Path
    paracell_root: Path  # the runtime's state root of the handler's containers
    logs: Path
    handler: str = HANDLER

    def ctr(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["ctr", "--address", str(self.socket), "-n", "k8s.io", *args],
                              capture_output=True, timeout=120, stdin=subprocess.DEVNULL)

    def paracell(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PARACELL, "--root", str(self.paracell_root / "k8s.io"), *args],
                              capture_output=True, text=True, timeout=60)

    def pod_config(self, name: str, **extra: object) -> dict[str, object]:
        logs = self.logs / name
        logs.mkdir(parents=True, exist_ok=True)
        # kubelet always gives a pod a cgroup parent; this one is the fixture's own.
        return {"metadata": {"name": name, "uid": f"uid-{name}", "namespace": "paracell-test"},
                "hostname": name, "log_directory": str(logs),
                "linux": {"cgroup_parent": self.cgroup_parent,
                          "security_context": {"namespace_options": {"pid": "CONTAINER"}}},
                **extra}

    @property
    def cgroup_parent(self) -> str:
        return f"/paracell-cri-{os.getpid()}"

    def host_cgroups_left(self) -> list[str]:
        return [str(p) for p in Path("/sys/fs/cgroup").glob(f"*{self.cgroup_parent}")]

    def container_config(self, name: str, command: list[str], **extra: object) -> dict[str, object]:
        return {"metadata": {"name": name}, "image": {"image": IMAGE}, "command": command,
                "log_path": f"{name}.log", **extra}

    def qemu_pids(self) -> list[int]:
        """QEMU processes of this fixture's containers: their command lines
        name state files under the fixture's private runtime root."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"qemu-system" in cmdline and str(self.paracell_root).encode() in cmdline:
                found.append(int(entry.name))
        return found

    def remove_pod_and_wait(self, pod_id: str) -> None:
        """Stops and removes the pod, waits (bounded) for its VM to go, and
        checks that nothing of it is left: process, mount, RAM file, network
        device or host cgroup."""
        self.client.stop_pod(pod_id)
        self.client.remove_pod(pod_id)
        deadline = time.monotonic() + 20
        while self.qemu_pids() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert self.qemu_pids() == []
        with open("/proc/self/mountinfo") as f:
            assert [ln for ln in f if str(self.paracell_root) in ln] == []
        # The pod's own RAM file, by its name (another user of the default
        # memory directory may come and go meanwhile).
        ram = memory.path_for(str(self.paracell_root / "k8s.io"), pod_id)
        assert not ram.exists(), f"the pod's guest RAM file was left: {ram}"
        ports = subprocess.run(["ip", "-o", "link", "show", "master", BRIDGE],
                               capture_output=True, text=True).stdout
        assert ports.strip() == "", f"a veth was left on {BRIDGE}: {ports}"
        assert self.host_cgroups_left() == []

    def running(self, pod_id: str, pod_config: dict[str, object],
                *configs: dict[str, object]) -> list[str]:
        """Creates and starts each container in the pod, in order, and waits
        until every one runs; their IDs."""
        ids = []
        for config in configs:
            ids.append(self.client.create(pod_id, config, pod_config))
            self.client.start(ids[-1])
        for container_id in ids:
            self.wait_state(container_id, "CONTAINER_RUNNING")
        return ids

    def fetch_local(self, container_id: str, url: str) -> bytes:
        """What `wget` in the container gets from url, retried (bounded)
        while a server in the pod may still be binding."""
        reply = None
        for _ in range(50):
            reply = self.client.exec_sync(container_id, ["wget", "-q", "-O", "-", url])
            if reply.exit_code == 0:
                return reply.stdout
            time.sleep(0.2)
        raise AssertionError(f"wget {url} in {container_id}: {reply.stderr if reply else ''}")

    def wait_state(self, container_id: str, state: str, timeout_s: float = 60) -> object:
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.client.status(container_id)
            if self.client.pb.ContainerState.Name(status.state) == state:
                return status
            if time.monotonic() > deadline:
                raise AssertionError(f"{container_id} still {status.state} after {timeout_s} s")
            time.sleep(0.2)


def _config(base: Path, socket: Path, paracell_root: Path, binary: str) -> str:
    """Both handlers, as oci/containerd/config.toml offers them."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{base}/root"
state = "{base}/state"
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[debug]
  address = "{base}/debug.sock"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  # Root here lacks CAP_SYS_RESOURCE: without this even runc fails.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.{HANDLER}]
  runtime_type = "io.containerd.runc.v2"
  # Pods choose ParaCell's settings (io.paracell.vmm, ...) by annotation.
  pod_annotations = ["io.paracell.*"]
[{cri}.containerd.runtimes.{HANDLER}.options]
  BinaryName = "{binary}"
  Root = "{paracell_root}"
[{cri}.containerd.runtimes.{HANDLER_V2}]
  runtime_type = "io.containerd.paracell.v2"
  pod_annotations = ["io.paracell.*"]
[{cri}.cni]
  bin_dir = "{CNI_BIN}"
  conf_dir = "{base}/cni"
"""


def _cni_config(base: Path) -> str:
    return f"""{{
  "cniVersion": "0.4.0",
  "name": "paracell-cri-test",
  "plugins": [
    {{"type": "bridge", "bridge": "{BRIDGE}", "isGateway": true, "ipMasq": false,
      "hairpinMode": true,
      "ipam": {{"type": "host-local", "ranges": [[{{"subnet": "{SUBNET}"}}]],
               "dataDir": "{base}/ipam"}}}},
    {{"type": "loopback"}}
  ]
}}
"""


def _pause_image(base: Path) -> Path:
    rootfs = base / "pause-rootfs"
    rootfs.mkdir()
    subprocess.run(["gcc", "-static", "-O2", "-o", str(rootfs / "pause"),
                    str(REPO / "oci" / "kubernetes" / "pause.c")], check=True)
    return oci_image_tar(rootfs, base / "pause.tar", name=PAUSE_IMAGE, cmd=("/pause",))


def runtime_wrapper(base: Path, env: dict[str, str]) -> str:
    """A BinaryName that runs paracell with `env` added: containerd strips the
    runtime's environment, as it would an operator's settings but for
    /etc/paracell/config.json, which a test must not touch."""
    wrapper = base / "bin" / "paracell"
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    assigns = " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items())
    wrapper.write_text(f'#!/bin/sh\n{assigns} exec {shlex.quote(PARACELL)} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def running_cri(base: Path, busybox_rootfs: Path, binary: str = PARACELL,
                handler: str = HANDLER) -> Iterator[Cri]:
    """Yields a started daemon; a module's `cri` fixture wraps it. binary:
    the BinaryName containerd runs (a wrapper that sets an environment);
    handler: the one the tests run their pods with."""
    if not shutil.which("containerd"):
        pytest.fail("containerd is not installed: run `make deps`")
    if settings.cache_dir() != Path(settings.SYSTEM_CACHE):
        pytest.fail(f"the CRI tests need the guest built in {settings.SYSTEM_CACHE}, where "
                    "ParaCell finds it under containerd's stripped environment: "
                    "unset PARACELL_CACHE and XDG_CACHE_HOME and run as root")
    socket = base / "containerd.sock"
    paracell_root = base / "paracell"
    shim_root = base / "shim"
    (base / "cni").mkdir()
    (base / "cni" / "10-paracell-test.conflist").write_text(_cni_config(base))
    config = base / "config.toml"
    config.write_text(_config(base, socket, paracell_root, binary))
    log = open(base / "containerd.log", "wb")  # noqa: SIM115 - outlives this block
    # The runc shim strips the runtime's environment to PATH, HOME and LANG,
    # so ParaCell below runs exactly as it would on a node: system paths
    # only. The shim v2 is found on containerd's PATH, as on a node where
    # `make venv` installed it; its state root is the fixture's own.
    env = dict(os.environ, PATH=f"{Path(SHIM_BINARY).parent}:{os.environ.get('PATH', '')}",
               PARACELL_SHIM_ROOT=str(shim_root))
    proc = subprocess.Popen(["containerd", "--config", str(config)], stdout=log, stderr=log,
                            start_new_session=True, env=env)
    client = None
    try:
        wait_for(socket, proc, f"containerd (see {base}/containerd.log)")
        daemon = Cri(CriClient(socket), base, socket,
                     shim_root if handler == HANDLER_V2 else paracell_root, base / "logs",
                     handler)
        client = daemon.client
        for tar in (_pause_image(base), oci_image_tar(busybox_rootfs, base / "bb.tar")):
            imported = daemon.ctr("images", "import", "--platform", "linux/amd64", str(tar))
            assert imported.returncode == 0, imported.stderr
        yield daemon
    finally:
        if client is not None:
            for pod in _safe(client.pods):
                _safe(lambda p=pod: client.stop_pod(p.id))
                _safe(lambda p=pod: client.remove_pod(p.id))
            client.close()
        stop_containerd(proc, log, base)
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)


def _safe(call):  # noqa: ANN001, ANN202 - teardown helper: best effort, never raises
    try:
        return call()
    except Exception:
        return []
