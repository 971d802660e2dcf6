"""Shared fixtures: the real `paracell` binary, a private state root and
memory directory per test, and busybox bundles built from Debian's busybox-static."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

# A suite started in the background of a script (`make test &`) inherits
# Ctrl-C ignored, and so would every `paracell` it spawns: the tests that
# interrupt a bench could then not. Ctrl-C handled here is reset to the default
# across exec, so the children see it as a terminal's foreground job would.
signal.signal(signal.SIGINT, signal.default_int_handler)

REPO = Path(__file__).resolve().parents[1]
PARACELL = str(Path(sys.executable).with_name("paracell"))

sys.path.insert(0, str(REPO))
from paracell.runtime.bundle import defaultspec  # noqa: E402


def own_memory_cgroups() -> list[str]:
    """Sub-cgroups of this process's memory cgroup, where a container whose
    spec has no cgroupsPath gets its own (runtime/host/cgroups/)."""
    try:
        own = next(line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text()
                   .splitlines() if line.split(":")[1] == "memory")
        base = Path("/sys/fs/cgroup/memory") / own.lstrip("/")
        return [p.name for p in base.iterdir() if p.is_dir()]
    except (OSError, StopIteration):
        return []


@dataclass
class Runtime:
    root: Path
    memory_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    cgroups_before: set[str] = field(default_factory=lambda: set(own_memory_cgroups()))
    # The private daemon of a runtime whose VMs are libvirt domains.
    libvirtd: object | None = None

    @property
    def vmm(self) -> str:
        return "libvirt" if self.libvirtd is not None else "qemu"

    def __call__(self, *args: str, input: bytes | None = None, timeout: float = 120,
                 check: bool = False) -> subprocess.CompletedProcess[bytes]:
        # Files, not pipes: a detached shim keeps the container's stdio open
        # for its whole life, as containerd expects, and a pipe would never hit EOF.
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.run(
                [PARACELL, "--root", str(self.root), *args], input=input,
                stdin=subprocess.DEVNULL if input is None else None, stdout=out, stderr=err,
                timeout=timeout, env=self.env,
            )
            out.seek(0)
            err.seek(0)
            result = subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read())
        if check and result.returncode != 0:
            raise AssertionError(f"paracell {' '.join(args)} failed: {result.stderr.decode()}")
        return result

    def qemu_processes(self) -> list[int]:
        """QEMU processes whose guest RAM lives in this test's memory directory,
        or (copy-on-write from a template, with no RAM file) whose console
        log is in its state root."""
        import psutil

        found = []
        for proc in psutil.process_iter(["cmdline"]):
            cmd = " ".join(proc.info["cmdline"] or [])
            if "qemu-system" in cmd and (str(self.memory_dir) in cmd or str(self.root) in cmd):
                found.append(proc.pid)
        return found

    def assert_no_leaks(self) -> None:
        assert self.qemu_processes() == [], "a QEMU process was left running"
        leftovers = list(self.memory_dir.glob("*")) if self.memory_dir.exists() else []
        assert leftovers == [], f"guest memory files left behind: {leftovers}"
        with open("/proc/self/mountinfo") as f:
            mounted = [ln for ln in f if str(self.memory_dir) in ln]
        assert mounted == [], f"guest memory mount left behind: {mounted}"
        states = [p for p in self.root.iterdir()] if self.root.exists() else []
        assert states == [], f"state left behind: {states}"
        cgroups = sorted(set(own_memory_cgroups()) - self.cgroups_before)
        assert cgroups == [], f"host cgroups left behind: {cgroups}"
        if self.libvirtd is not None:
            domains = self.libvirtd.domains()
            assert domains == [], f"libvirt domains left behind: {domains}"
            # A domain's TAPs are lent to this namespace while it starts.
            taps = [name for name in os.listdir("/sys/class/net") if name.startswith("pctap")]
            assert taps == [], f"TAP devices left behind in the host's namespace: {taps}"


def state_of(runtime: Runtime, cid: str) -> dict:
    return json.loads(runtime("state", cid, check=True).stdout)


def wait_status(runtime: Runtime, cid: str, status: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if state_of(runtime, cid)["status"] == status:
            return
        time.sleep(0.1)
    raise AssertionError(f"{cid} never became {status}")


BACKENDS = ("qemu", "libvirt")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked both_vmms runs once per backend (docs/libvirt.md)."""
    if "vmm" in metafunc.fixturenames and metafunc.definition.get_closest_marker("both_vmms"):
        metafunc.parametrize("vmm", BACKENDS, indirect=True)


@pytest.fixture
def vmm(request: pytest.FixtureRequest) -> str:
    return getattr(request, "param", "qemu")


@pytest.fixture(scope="session")
def libvirtd():
    """A private libvirt daemon for the session (tests/libvirtd.py)."""
    from tests.libvirtd import PrivateLibvirtd, missing

    why = missing()
    if why:
        pytest.skip(f"no private libvirt daemon: {why}")
    # Short: podman refuses a run root of over 50 characters, and clients' paths live here.
    base = Path(tempfile.mkdtemp(prefix="pclv-", dir="/tmp"))
    daemon = PrivateLibvirtd(base)
    try:
        daemon.start()
        yield daemon
    finally:
        daemon.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def vet_cache_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("xgate-vet")


_vet_caches = itertools.count()


@pytest.fixture(autouse=True)
def private_vet_cache(vet_cache_base: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """XGates verdicts (paracell/xgate/vetcache.py) of this test's own: no test
    believes one that another test left, nor reads or writes the host's. The
    runtime fixture's processes inherit it."""
    path = vet_cache_base / str(next(_vet_caches))
    monkeypatch.setenv("PARACELL_VET_CACHE", str(path))
    return path


@pytest.fixture
def runtime(tmp_path_factory: pytest.TempPathFactory, vmm: str,
            request: pytest.FixtureRequest) -> Runtime:
    base = tmp_path_factory.mktemp("rt")
    env = dict(os.environ, PARACELL_ENGINE="auto")
    daemon = None
    if vmm == "libvirt":
        # Under the daemon's shared directory: the RAM tmpfs and the shares'
        # bind mounts made there reach its QEMUs (tests/libvirtd.py).
        daemon = request.getfixturevalue("libvirtd")
        base = daemon.workdir / base.name
        base.mkdir()
        memory_dir = base / "shm"
        env.update(PARACELL_VMM="libvirt", PARACELL_LIBVIRT_URI=daemon.uri)
    else:
        memory_dir = Path("/dev/shm") / f"paracell-test-{os.getpid()}-{base.name}"
    env["PARACELL_MEMORY_DIR"] = str(memory_dir)
    # Templates stay on, as for a user, in a store of this test's own: no test
    # restores what another one saved, and the host's store is never touched.
    env["PARACELL_TEMPLATES"] = str(base / "templates")
    # Snapshot mode's rootfs images: this test's own too.
    env["PARACELL_ROOTDISKS"] = str(base / "rootdisks")
    rt = Runtime(base / "state", memory_dir, env, libvirtd=daemon)
    yield rt
    for cid in (rt.root.iterdir() if rt.root.exists() else []):
        rt("delete", "--force", cid.name)
    subprocess.run(["umount", "-l", str(memory_dir)], capture_output=True)
    shutil.rmtree(memory_dir, ignore_errors=True)
    # A template is tens of MiB of guest RAM: a few hundred tests' worth would
    # fill a small CI disk before pytest prunes its old directories.
    shutil.rmtree(env["PARACELL_TEMPLATES"], ignore_errors=True)
    shutil.rmtree(env["PARACELL_ROOTDISKS"], ignore_errors=True)
    memory_dir.with_name(f".{memory_dir.name}.lock").unlink(missing_ok=True)


@pytest.fixture(scope="session")
def busybox_rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return defaultspec.busybox_rootfs(tmp_path_factory.mktemp("busybox") / "rootfs")


@pytest.fixture
def make_bundle(tmp_path: Path, busybox_rootfs: Path):
    """make_bundle(args, **process overrides) -> bundle dir sharing one read-only rootfs."""
    counter = iter(range(1000))

    def make(args: list[str], *, rootfs: Path | None = None, readonly: bool = True,
             mutate=None, **process) -> Path:
        bundle = tmp_path / f"bundle{next(counter)}"
        bundle.mkdir()
        config = defaultspec.default_config(args)
        config["root"] = {"path": str(rootfs or busybox_rootfs), "readonly": readonly}
        config["process"].update(process)
        if mutate:
            mutate(config)
        (bundle / "config.json").write_text(json.dumps(config))
        return bundle

    return make


@pytest.fixture
def writable_rootfs(tmp_path: Path, busybox_rootfs: Path) -> Path:
    target = tmp_path / "rwrootfs"
    shutil.copytree(busybox_rootfs, target, symlinks=True)
    return target


def cri_pod(kind: str, sandbox_id: str):
    """A config mutation: containerd CRI's pod annotations; a sandbox also
    gets the network namespace of its own that CRI always gives one (a VM
    runtime refuses a pod on the host's)."""
    def mutate(config: dict) -> None:
        config["annotations"] = {"io.kubernetes.cri.container-type": kind,
                                 "io.kubernetes.cri.sandbox-id": sandbox_id}
        if kind == "sandbox":
            config["linux"]["namespaces"].append({"type": "network"})
    return mutate
