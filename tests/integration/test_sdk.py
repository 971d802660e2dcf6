"""The Python SDK (paracell/sandbox/, docs/sdk.md) on real VMs, from this
test process: commands over the sandbox's own channel with their output,
exit codes, stdin, timeouts and bounds; files; checkpoint, rollback and fork;
typed errors for a sandbox that is gone; nothing left after kill."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

from paracell.sandbox import (
    CommandTimeout,
    FileError,
    OutputTooLarge,
    Sandbox,
    SandboxError,
    SandboxNotFound,
    SandboxNotRunning,
    SessionEnded,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def sdk(runtime, monkeypatch):
    """The runtime fixture's settings, for the SDK calls made in this process."""
    for key in ("PARACELL_ENGINE", "PARACELL_MEMORY_DIR", "PARACELL_TEMPLATES",
                "PARACELL_ROOTDISKS", "PARACELL_VMM", "PARACELL_LIBVIRT_URI"):
        if key in runtime.env:
            monkeypatch.setenv(key, runtime.env[key])
    return runtime


def test_commands_give_output_exit_codes_and_are_bounded(sdk, make_bundle, writable_rootfs):
    bundle = make_bundle(["sleep", "600"], rootfs=writable_rootfs, readonly=False)
    with Sandbox.create(str(bundle), "sdk-run", root=str(sdk.root), snapshot=False) as box:
        assert box.status() == "running"
        done = box.run(["sh", "-c", "echo out; echo err >&2; echo $FOO; pwd; exit 3"],
                       env={"FOO": "bar"}, cwd="/tmp")
        assert (done.stdout, done.stderr, done.exit_code) == (b"out\nbar\n/tmp\n", b"err\n", 3)
        # More than the channel's stdin window, and back.
        data = bytes(range(256)) * 1024
        assert box.run(["cat"], stdin=data).stdout == data
        began = time.monotonic()
        with pytest.raises(CommandTimeout, match="timeout of 1 s and was killed"):
            box.run(["sleep", "77"], timeout=1)
        assert time.monotonic() - began < 30
        with pytest.raises(OutputTooLarge, match="more than 100000 bytes"):
            box.run(["sh", "-c", "while :; do echo yyyyyyyyyyyyyyyy; done"], max_output=100_000)
        # What was killed is gone from the guest.
        ps = box.run(["ps", "-o", "args"]).stdout.decode()
        assert "sleep 77" not in ps and "yyyy" not in ps
        # Streaming: a line before the command ends.
        proc = box.start(["sh", "-c", "echo one; sleep 1; echo two"])
        assert proc.stdout.readline() == b"one\n"
        assert proc.wait(30) == 0 and proc.stdout.read() == b"two\n"
        # One that is never waited for leaves no fd behind once it ended.
        fds = len(os.listdir("/proc/self/fd"))
        forgotten = box.start(["true"], stdin=True)
        assert forgotten.stdout.read() == b"" and forgotten.stderr.read() == b""
        forgotten._thread.join(30)
        forgotten.stdout.close()
        forgotten.stderr.close()
        assert len(os.listdir("/proc/self/fd")) == fds
        # In the background, past this process's interest: a relay of its own.
        relay = box.spawn(["sleep", "300"])
        assert psutil.pid_exists(relay)
        assert "sleep 300" in box.run(["ps", "-o", "args"]).stdout.decode()
        assert box.run(["false"]).exit_code == 1
        with pytest.raises(SandboxError, match='"nonexistent-tool": executable file not found'):
            box.run(["nonexistent-tool"])
    with pytest.raises(SandboxNotFound, match="^sandbox sdk-run does not exist$"):
        Sandbox.connect("sdk-run", root=str(sdk.root))
    sdk.assert_no_leaks()


def test_files_through_the_sandbox(sdk, make_bundle, writable_rootfs):
    bundle = make_bundle(["sleep", "600"], rootfs=writable_rootfs, readonly=False)
    with Sandbox.create(str(bundle), "sdk-files", root=str(sdk.root), snapshot=False) as box:
        payload = b"\x00\xffline\n" * 5000
        box.files.write("/tmp/data.bin", payload)
        assert box.files.read("/tmp/data.bin") == payload
        box.run(["mkdir", "/tmp/d"])
        box.files.write("/tmp/d/a b\nc", b"odd name")
        assert box.files.list("/tmp/d") == ["a b\nc"]
        assert "data.bin" in box.files.list("/tmp")
        box.files.remove("/tmp/data.bin")
        with pytest.raises(FileError, match="^/tmp/data.bin: .*No such file"):
            box.files.read("/tmp/data.bin")
        box.files.remove("/tmp/d", recursive=True)
        # An execve that fails after the start (no #! line) says why.
        box.files.write("/tmp/noshebang", b"echo hi\n")
        assert box.run(["chmod", "+x", "/tmp/noshebang"]).exit_code == 0
        with pytest.raises(SandboxError, match="exec format error|Exec format error"):
            box.run(["/tmp/noshebang"])
        # A command that stops reading its stdin early: the feeder stops, nothing breaks.
        done = box.run(["head", "-c", "1"], stdin=b"x" * (10 << 20), timeout=60)
        assert (done.stdout, done.exit_code) == (b"x", 0)
        with pytest.raises(FileError, match="must be absolute"):
            box.files.read("relative/path")
    sdk.assert_no_leaks()


def test_a_sandbox_that_is_gone_or_stopped_raises_and_nothing_hangs(sdk, make_bundle):
    box = Sandbox.create(str(make_bundle(["sh", "-c", "sleep 2"])), "sdk-ends",
                         root=str(sdk.root), snapshot=False)
    deadline = time.monotonic() + 60
    while box.status() != "stopped":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    with pytest.raises(SandboxNotRunning, match="^sandbox sdk-ends is stopped$"):
        box.run(["true"])
    box.kill()
    for call in (lambda: box.run(["true"]), box.status, lambda: box.checkpoint("x"),
                 lambda: box.files.read("/etc/hostname")):
        with pytest.raises(SandboxNotFound, match="sdk-ends does not exist"):
            call()
    sdk.assert_no_leaks()


def test_checkpoint_rollback_and_fork_through_the_sdk(sdk, make_bundle, writable_rootfs):
    bundle = make_bundle(["sleep", "600"], rootfs=writable_rootfs, readonly=False)
    with Sandbox.create(str(bundle), "sdk-snap", root=str(sdk.root), snapshot=True) as box:
        box.files.write("/state", b"before")
        box.checkpoint("base")
        box.files.write("/state", b"after")
        running = box.start(["sleep", "300"])
        box.rollback("base")
        with pytest.raises(SessionEnded, match="rolled back to a checkpoint"):
            running.wait(60)
        assert box.files.read("/state") == b"before"
        [fork] = box.fork("base", count=1)
        try:
            assert fork.files.read("/state") == b"before"
            fork.files.write("/state", b"fork's own")
            assert box.files.read("/state") == b"before"
        finally:
            fork.kill()
    sdk.assert_no_leaks()


def test_the_callers_bundle_is_never_written(sdk, make_bundle):
    bundle = Path(make_bundle(["sleep", "60"]))
    before = (bundle / "config.json").read_bytes()
    with Sandbox.create(str(bundle), "sdk-bundle", root=str(sdk.root), snapshot=True) as box:
        assert box.run(["true"]).exit_code == 0
    assert (bundle / "config.json").read_bytes() == before
    sdk.assert_no_leaks()
