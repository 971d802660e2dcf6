"""`paracell bench suite`'s plumbing with real VMs, Debian's runc and the
Debian image it builds: the image holds every workload's programs, servers
start and are loaded over the suite's own bridge, batch and agent workloads
run and their results are parsed, and nothing it made is left behind, after
a full run and after an interrupt. The figures are not checked: benchmarks
are not timed tests."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from paracell.bench.suite import network
from paracell.bench.suite.workloads import BINARIES, PACKAGES, QUICK
from paracell.images import debian, debian_rootfs
from tests.conftest import PARACELL

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("runc") is None, reason="runc is not installed"),
    pytest.mark.skipif(shutil.which("mmdebstrap") is None, reason="mmdebstrap is not installed"),
]
STATE_LINE = re.compile(r"state under (\S+)")


def _suite(out: Path, *args: str) -> list[str]:
    return [PARACELL, "bench", "suite", "--quick", "-o", str(out), *args]


def _assert_nothing_left(runtime, stderr: str, tag: int) -> None:
    match = STATE_LINE.search(stderr)
    assert match, stderr
    assert runtime.qemu_processes() == [], "a QEMU process was left running"
    assert not Path(match.group(1)).exists(), f"state left behind in {match.group(1)}"
    assert network.leftovers(str(tag % 100000)) == [], "network namespaces or links left"


def test_the_image_holds_every_workload_program_and_is_built_once():
    root = debian_rootfs(PACKAGES)
    assert debian.is_valid(root, PACKAGES)
    for binary in BINARIES:
        assert (root / binary).exists(), binary
    marker = json.loads((root / debian.MARKER).read_text())
    assert marker["packages"] == sorted(PACKAGES)
    # Asked again, in another order: the same image, not a new build (its marker stays).
    assert debian_rootfs(list(reversed(PACKAGES))) == root
    assert json.loads((root / debian.MARKER).read_text())["built"] == marker["built"]
    assert not list(root.parent.glob(".build-*")), "a build directory was left behind"


def test_servers_batch_and_agent_workloads_run_and_parse_and_leave_nothing(runtime, tmp_path):
    out = tmp_path / "suite"
    proc = subprocess.run(_suite(out, "--runtimes", "runc,pager",
                                 "--workloads", "redis,memcached,sqlite,swe"),
                          env=runtime.env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((out / "suite.json").read_text())
    assert result["active"] == ["runc", "pager"]
    by = {(s["workload"], s["runtime"]): s for s in result["samples"]}
    assert set(by) == {(w, r) for w in ("redis", "memcached", "sqlite", "swe")
                       for r in ("runc", "pager")}
    for (w, r), s in by.items():
        assert s["error"] is None, (w, r, s["error"])
        assert s["cold_start_s"] > 0
    for r in ("runc", "pager"):
        assert by[("redis", r)]["metrics"]["get_plain"]["rps"] > 0
        assert by[("redis", r)]["metrics"]["set_pipelined"]["p99_ms"] >= 0
        assert by[("memcached", r)]["metrics"]["get"]["rps"] > 0
        assert by[("redis", r)]["serving_s"] >= by[("redis", r)]["cold_start_s"]
        # Loaded side by side with the other runtime, in turns.
        assert len(by[("redis", r)]["turns"]) == len(by[("memcached", r)]["turns"]) == QUICK.turns
        assert by[("sqlite", r)]["metrics"]["transactions"] == 200
        assert by[("swe", r)]["run_s"] > 0
        assert by[("swe", r)]["guest_used"], "the agent workload reported no guest memory"
    # Host memory over time is the VM's guest RAM: there is none under runc.
    assert by[("swe", "pager")]["host_ram"] and not by[("swe", "runc")]["host_ram"]
    assert result["summary"]["swe"]["pager"]["waste_pct"] is not None
    text = (out / "report.md").read_text()
    assert "What the paper claims" in text and "host memory over time" in text
    for png in ("latency.png", "coldstart.png", "memory-swe.png"):
        assert (out / png).read_bytes().startswith(b"\x89PNG")
    _assert_nothing_left(runtime, proc.stderr, _pid_of(proc.stderr))


def _pid_of(stderr: str) -> int:
    match = re.search(r"\(pid (\d+)\)", stderr)
    assert match, stderr
    return int(match.group(1))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupt_mid_run_removes_the_vm_its_network_and_its_state(runtime, tmp_path, sig):
    out = tmp_path / "suite"
    proc = subprocess.Popen(_suite(out, "--runtimes", "pager", "--workloads", "redis,skills"),
                            env=runtime.env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 300
        # Mid-run: the redis VM up and under load.
        while time.monotonic() < deadline and not runtime.qemu_processes():
            assert proc.poll() is None, "".join(lines)
            time.sleep(0.2)
        assert runtime.qemu_processes(), "".join(lines)
        time.sleep(3)
        proc.send_signal(sig)
        assert proc.wait(180) != 0
    finally:
        proc.kill()
        proc.wait()
    reader.join(10)
    assert not (out / "suite.json").exists()
    _assert_nothing_left(runtime, "".join(lines), proc.pid)


# libnettle's SM3 compress function (nettle 3.8, straight-line code) holds
# both of its split WRPKRU sites (docs/xgates.md, "Inadvertent WRPKRU bytes"):
# every 64-byte block runs both traps. This hashes 100 KiB through them, in the
# image's own python3 and libnettle.so.8.6, and compares with OpenSSL's SM3.
SM3_THROUGH_NETTLE = """
import ctypes, hashlib
lib = ctypes.CDLL("libnettle.so.8")
base = min(int(l.split("-")[0], 16) for l in open("/proc/self/maps") if "libnettle" in l)
data = bytes(range(256)) * 400
ctx, out = ctypes.create_string_buffer(512), ctypes.create_string_buffer(32)
lib.nettle_sm3_init(ctx)
lib.nettle_sm3_update(ctx, ctypes.c_size_t(len(data)), data)
lib.nettle_sm3_digest(ctx, ctypes.c_size_t(32), out)
print("site", ctypes.string_at(base + 0x27a71, 3).hex(),
      ctypes.string_at(base + 0x27dd9, 3).hex())
print("sm3 equal", out.raw.hex() == hashlib.new("sm3", data).hexdigest())
"""


@pytest.mark.parametrize("xgates, site", [("on", "0fccef"), ("off", "0f01ef")])
def test_the_images_libnettle_runs_with_xgates_its_split_sites_trapped(runtime, make_bundle,
                                                                       xgates, site):
    root = debian_rootfs(PACKAGES)
    nettle = root / "usr/lib/x86_64-linux-gnu/libnettle.so.8.6"
    assert nettle.read_bytes()[0x27a71:0x27a74] == bytes.fromhex("0f01ef")
    bundle = make_bundle(["/usr/bin/python3", "-c", SM3_THROUGH_NETTLE], rootfs=root,
                         mutate=lambda c: c.update(annotations={"io.paracell.xgates": xgates}))
    result = runtime("run", "--bundle", str(bundle), f"nettle-{xgates}", timeout=300)
    out = result.stdout.decode()
    assert result.returncode == 0, (out, result.stderr.decode()[-1000:])
    assert f"site {site} {site}\nsm3 equal True\n" in out, out


def test_the_xgates_runtime_runs_instead_of_being_skipped(runtime, tmp_path):
    out = tmp_path / "suite"
    proc = subprocess.run(_suite(out, "--runtimes", "xgates", "--workloads", "sqlite"),
                          env=runtime.env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((out / "suite.json").read_text())
    assert result["active"] == ["xgates"] and result["skipped"] == {}, result["skipped"]
    [sample] = result["samples"]
    assert sample["error"] is None and sample["metrics"]["transactions"] == 200, sample
