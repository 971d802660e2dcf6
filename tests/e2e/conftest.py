"""Real containerd and real podman from Debian, each with private state in a
temp dir, and a busybox image built offline from Debian's busybox-static."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

from paracell.images.ocilayout import oci_image_tar
from tests.conftest import BACKENDS, PARACELL

IMAGE = "localhost/bb:latest"


def wait_for(path: Path, proc: subprocess.Popen, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start")
        time.sleep(0.1)


def stop_containerd(proc: subprocess.Popen[bytes], log: IO[bytes], base: Path) -> None:
    """Ends a fixture's containerd and unmounts what its private state holds."""
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()
    subprocess.run(["umount", "-R", "-l", str(base / "state")], capture_output=True)


def e2e_env(memory_dir: Path) -> dict[str, str]:
    return dict(os.environ, PARACELL_MEMORY_DIR=str(memory_dir))


def backend_base(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                 name: str, backend: str | None = None) -> tuple[Path, Path, dict[str, str]]:
    """A client fixture's base directory, RAM directory and environment for
    `backend` (else request.param): with libvirt, all of it under the private
    daemon's shared directory (tests/libvirtd.py), where the mounts the
    client and the runtime make reach the daemon's QEMUs."""
    base = tmp_path_factory.mktemp(name)
    if (backend or request.param) != "libvirt":
        return base, Path("/dev/shm") / f"paracell-{name}-{os.getpid()}", {}
    daemon = request.getfixturevalue("libvirtd")
    base = daemon.workdir / base.name
    base.mkdir()
    return base, base / "shm", {"PARACELL_VMM": "libvirt", "PARACELL_LIBVIRT_URI": daemon.uri}


def client_runtime(base: Path) -> str:
    """The paracell a client (podman's conmon) runs.  Clients start the
    runtime with an environment of their own, so a PARACELL_CACHE given to
    the tests (a checkout's own guest build) is carried by a wrapper named
    paracell, the name podman knows."""
    cache = os.environ.get("PARACELL_CACHE")
    if not cache:
        return PARACELL
    wrapper = base / "bin" / "paracell"
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    wrapper.write_text(f'#!/bin/sh\nPARACELL_CACHE={shlex.quote(cache)} '
                       f'exec {shlex.quote(PARACELL)} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


# How containerd reaches paracell: its runc v2 shim running `paracell` as
# BinaryName, or paracell's own shim v2 (paracell/shimv2/).
SHIM_RUNC, SHIM_V2 = "runc-v2", "paracell-v2"
SHIM_BINARY = str(Path(PARACELL).with_name("containerd-shim-paracell-v2"))


@dataclass
class Containerd:
    socket: Path
    runc_root: Path  # the runtime's state root, per namespace below it
    env: dict[str, str]
    memory_dir: Path  # the guests' RAM files
    libvirtd: object | None = None  # the private daemon of a libvirt backend
    shim: str = SHIM_RUNC
    proc: subprocess.Popen[bytes] | None = None
    config: Path | None = None

    def restart(self) -> None:
        """containerd stopped and started again, its tasks left running: it
        finds their shims again by the address in each bundle."""
        assert self.proc is not None and self.config is not None
        self.proc.terminate()
        self.proc.wait(timeout=20)
        log = open(self.config.with_name("containerd.log"), "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(["containerd", "--config", str(self.config)], stdout=log,
                                     stderr=log, env=self.env, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 30
        while self.ctr("version").returncode != 0:
            assert time.monotonic() < deadline, "containerd did not come back"
            time.sleep(0.2)

    def leftovers(self, container_id: str) -> list[str]:
        """Whatever of a deleted container is still on the host: its state,
        a QEMU, a RAM file, its host cgroup (containerd's /default/ID), a
        libvirt domain, a shim v2 process."""
        import psutil

        found = [f"state {p}" for p in [self.runc_root / "default" / container_id]
                 if p.exists()]
        # A VM restored copy-on-write has no RAM file: its console log is in the state root.
        ours = (str(self.memory_dir), str(self.runc_root))
        found += [f"qemu pid {proc.pid}" for proc in psutil.process_iter(["cmdline"])
                  if "qemu-system" in " ".join(proc.info["cmdline"] or [])
                  and any(mark in " ".join(proc.info["cmdline"] or []) for mark in ours)]
        found += [f"RAM file {p}" for p in (self.memory_dir.glob("*") if
                                            self.memory_dir.exists() else [])]
        found += [f"cgroup {p}" for p in Path("/sys/fs/cgroup").glob(f"*/default/{container_id}")]
        if self.libvirtd is not None:
            found += [f"domain {d}" for d in self.libvirtd.domains()]  # type: ignore[attr-defined]
        found += [f"shim pid {pid}" for pid in self.shim_pids()
                  if container_id in self.shim_ids(pid)]
        if not self.shim_pids() and (self.runc_root / "s").is_dir():
            found += [f"shim socket {p}" for p in (self.runc_root / "s").iterdir()]
        return found

    def shim_pids(self) -> list[int]:
        """This containerd's shim v2 daemons."""
        import psutil

        found = {proc.pid: proc.info["ppid"] for proc in psutil.process_iter(["cmdline", "ppid"])
                 if "paracell.shimv2.command" in " ".join(proc.info["cmdline"] or [])
                 and str(self.socket) in " ".join(proc.info["cmdline"] or [])}
        # The processes a shim forks for its tasks carry its command line too.
        return sorted(pid for pid, parent in found.items() if parent not in found)

    @staticmethod
    def shim_ids(pid: int) -> str:
        import psutil

        try:
            return " ".join(psutil.Process(pid).cmdline())
        except psutil.Error:
            return ""

    def ctr(self, *args: str, timeout: float = 180, input: bytes | None = None,
            tty: bool = False) -> subprocess.CompletedProcess[bytes]:
        cmd = ["ctr", "--address", str(self.socket), *args]
        if tty:
            cmd = ["script", "-qfec", " ".join(cmd), "/dev/null"]
        return subprocess.run(cmd, capture_output=True, timeout=timeout, env=self.env,
                              input=input, stdin=None if input is not None else subprocess.DEVNULL)

    def run_args(self) -> list[str]:
        if self.shim == SHIM_V2:
            return ["--runtime", "io.containerd.paracell.v2"]
        return ["--runtime", "io.containerd.runc.v2", "--runc-binary", PARACELL,
                "--runc-root", str(self.runc_root)]


@pytest.fixture(scope="module", params=[(b, SHIM_RUNC) for b in BACKENDS] + [("qemu", SHIM_V2)],
                ids=lambda p: p[0] if p[1] == SHIM_RUNC else p[1])
def containerd(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
               busybox_rootfs_module: Path):
    if not shutil.which("containerd"):
        pytest.fail("containerd is not installed: run `make deps`")
    backend, shim = request.param
    base, memory_dir, backend_env = backend_base(request, tmp_path_factory, "containerd",
                                                 backend)
    sock = base / "containerd.sock"
    config = base / "config.toml"
    config.write_text(
        f'version = 2\nroot = "{base}/root"\nstate = "{base}/state"\n'
        f'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        f'[grpc]\n  address = "{sock}"\n[ttrpc]\n  address = "{sock}.ttrpc"\n'
        f'[debug]\n  address = "{base}/debug.sock"\n'
    )
    # VM templates in a store of the fixture's own, never the system's; the
    # shim v2 on containerd's PATH, its state in the fixture's directory.
    runtime_root = base / ("runc" if shim == SHIM_RUNC else "shim")
    env = e2e_env(memory_dir) | backend_env | {
        "PARACELL_TEMPLATES": str(base / "templates"), "PARACELL_SHIM_ROOT": str(runtime_root),
        "PATH": f"{Path(SHIM_BINARY).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    log = open(base / "containerd.log", "wb")  # noqa: SIM115 - outlives this block
    proc = subprocess.Popen(["containerd", "--config", str(config)], stdout=log, stderr=log,
                            env=env, start_new_session=True)
    daemon = None
    try:
        wait_for(sock, proc, "containerd")
        lv = request.getfixturevalue("libvirtd") if backend_env else None
        daemon = Containerd(sock, runtime_root, env, memory_dir, lv, shim, proc, config)
        image = oci_image_tar(busybox_rootfs_module, base / "bb.tar")
        imported = daemon.ctr("images", "import", "--platform", "linux/amd64", str(image))
        assert imported.returncode == 0, imported.stderr
        yield daemon
    finally:
        stop_containerd(daemon.proc if daemon is not None and daemon.proc else proc, log, base)
        shutil.rmtree(memory_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def busybox_rootfs_module(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from paracell.runtime.bundle import defaultspec

    return defaultspec.busybox_rootfs(tmp_path_factory.mktemp("bbrootfs") / "rootfs")


@dataclass
class Podman:
    base: Path
    env: dict[str, str]
    runtime: str = PARACELL

    def __call__(self, *args: str, timeout: float = 180, tty: bool = False,
                 input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        cmd = ["podman", "--root", str(self.base / "storage"), "--runroot",
               str(self.base / "run"), "--runtime", self.runtime, "--cgroup-manager", "cgroupfs",
               "--events-backend", "file", *args]
        if tty:
            cmd = ["script", "-qfec", " ".join(cmd), "/dev/null"]
        return subprocess.run(cmd, capture_output=True, timeout=timeout, env=self.env,
                              input=input, stdin=None if input is not None else subprocess.DEVNULL)


@pytest.fixture(scope="module", params=BACKENDS)
def podman(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           busybox_rootfs_module: Path):
    if not shutil.which("podman"):
        pytest.fail("podman is not installed: run `make deps`")
    base, memory_dir, backend_env = backend_base(request, tmp_path_factory, "podman")
    conf = base / "containers.conf"
    conf.write_text(
        '[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\n'
        'netns = "none"\n'
        '[engine]\nruntime_supports_json = ["crun", "runc", "paracell"]\n'
    )
    env = dict(e2e_env(memory_dir), CONTAINERS_CONF=str(conf)) | backend_env | {
        "PARACELL_TEMPLATES": str(base / "templates")}
    daemon = Podman(base, env, client_runtime(base))
    tar_path = base / "rootfs.tar"
    with tarfile.open(tar_path, "w") as tar:
        for path in sorted(busybox_rootfs_module.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(busybox_rootfs_module)), recursive=False)
    imported = daemon("import", "--change", 'CMD ["/bin/sh"]', str(tar_path), IMAGE)
    assert imported.returncode == 0, imported.stderr
    try:
        yield daemon
    finally:
        daemon("rm", "--all", "--force", timeout=120)
        daemon("system", "reset", "--force", timeout=120)
        shutil.rmtree(memory_dir, ignore_errors=True)
