"""Checkpoint and rollback of a running snapshot-mode sandbox, on real VMs
(docs/snapshots.md): memory, processes and files come back exactly, over
many rounds and along a chain; exec sessions end with a clear status;
bad names, damaged checkpoints and containers not in snapshot mode are
refused in one line with nothing changed; a client killed mid-way leaves
the sandbox running; nothing is left after delete. Behaviour only: no
timing is asserted."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from paracell.runtime.bundle.spec import CAPABILITIES
from tests.caps import SHOW_CAPS, cap_masks
from tests.conftest import PARACELL, wait_status
from tests.integration.snapshots import (
    SNAPSHOT,
    bump,
    checkpoint,
    report,
    rollback,
    snapshot_bundle,
    started,
)
from tests.integration.test_terminal import ConsoleReceiver

pytestmark = pytest.mark.integration

# What an exec session that a rollback ends prints (docs/snapshots.md).
ROLLED_BACK = b"the sandbox was rolled back to a checkpoint: this session ended"

def test_rollback_restores_memory_files_pid_and_fds_exactly_for_50_rounds(
        runtime, make_bundle, memfill_rootfs: Path):
    first = started(runtime, make_bundle, memfill_rootfs, "ck-rounds")
    assert first["mem"] == "ok" and first["data"] == "1"
    seed = 1
    previous = None
    for r in range(50):
        name = f"round{r}"
        done = checkpoint(runtime, "ck-rounds", name)
        assert done["name"] == name and done["pages_saved"] > 0
        if previous:
            runtime("sandbox", "rm-checkpoint", "ck-rounds", previous, check=True)
        changed = bump(runtime, "ck-rounds", seed + 1)
        assert changed["data"] == str(seed + 1) and changed["mem"] == "ok"
        rollback(runtime, "ck-rounds", name)
        back = report(runtime, "ck-rounds")
        # /report itself is rolled back: what it says is the checkpoint's moment.
        assert back == {**first, "seed": str(seed), "data": str(seed)}, (r, back)
        # And the process goes on from there: it takes the next change.
        seed += 1
        assert bump(runtime, "ck-rounds", seed)["mem"] == "ok"
        previous = name
    listed = json.loads(runtime("sandbox", "checkpoints", "-f", "json", "ck-rounds",
                                check=True).stdout)
    assert [c["name"] for c in listed] == ["round49"]


def test_a_chain_of_three_rolls_back_to_the_first_then_the_third(
        runtime, make_bundle, memfill_rootfs: Path):
    started(runtime, make_bundle, memfill_rootfs, "ck-chain")
    saved = {}
    for k in (1, 2, 3):
        saved[k] = checkpoint(runtime, "ck-chain", f"c{k}")
        bump(runtime, "ck-chain", k + 1)
    # Incremental: the first holds the whole guest, the others what changed.
    assert saved[2]["pages_saved"] < saved[1]["pages_saved"]
    rollback(runtime, "ck-chain", "c1")
    got = report(runtime, "ck-chain")
    assert (got["seed"], got["mem"], got["data"]) == ("1", "ok", "1")
    rollback(runtime, "ck-chain", "c3")
    got = report(runtime, "ck-chain")
    assert (got["seed"], got["mem"], got["data"]) == ("3", "ok", "3")
    rollback(runtime, "ck-chain", "c2")
    got = report(runtime, "ck-chain")
    assert (got["seed"], got["mem"], got["data"]) == ("2", "ok", "2")


def test_an_open_exec_session_ends_with_a_clear_status_on_rollback(
        runtime, make_bundle, memfill_rootfs: Path, tmp_path: Path):
    started(runtime, make_bundle, memfill_rootfs, "ck-exec")
    checkpoint(runtime, "ck-exec", "before")
    session = subprocess.Popen([PARACELL, "--root", str(runtime.root), "exec", "ck-exec",
                                "sleep", "300"], env=runtime.env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    # One on a terminal too: its stderr is not the terminal, and says it as well.
    console = ConsoleReceiver(tmp_path / "console.sock")
    on_tty = subprocess.Popen([PARACELL, "--root", str(runtime.root), "exec", "--tty",
                               "--console-socket", str(tmp_path / "console.sock"), "ck-exec",
                               "sleep", "300"], env=runtime.env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    console.thread.join(timeout=60)
    time.sleep(2)
    rollback(runtime, "ck-exec", "before")
    for proc in (session, on_tty):
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 137, (proc.returncode, err)
        assert ROLLED_BACK in err, err
    # The sandbox takes new sessions after it.
    assert runtime("exec", "ck-exec", "true").returncode == 0
    ps = runtime("exec", "ck-exec", "ps", check=True).stdout
    assert b"sleep 300" not in ps


def test_bad_requests_are_refused_in_one_line_and_change_nothing(
        runtime, make_bundle, memfill_rootfs: Path, busybox_rootfs: Path):
    started(runtime, make_bundle, memfill_rootfs, "ck-bad",
            **{"io.paracell.snapshot.max-checkpoints": "2"})
    checkpoint(runtime, "ck-bad", "good")
    ckdir = runtime.root / "ck-bad" / "checkpoints"

    def refused(*args: str, says: str) -> None:
        result = runtime(*args)
        line = result.stderr.decode().strip()
        assert result.returncode != 0 and "\n" not in line and says in line, (args, line)

    for name in ("../x", "a/b", "..", "x" * 300, ".hidden", ""):
        refused("sandbox", "checkpoint", "--name", name, "ck-bad", says="checkpoint name")
        refused("sandbox", "rollback", "ck-bad", name, says="checkpoint name")
    refused("sandbox", "rollback", "ck-bad", "missing", says="no checkpoint")
    refused("sandbox", "checkpoint", "--name", "good", "ck-bad", says="exists already")
    checkpoint(runtime, "ck-bad", "second")
    refused("sandbox", "checkpoint", "ck-bad", says="limit")
    # A damaged checkpoint: its hash table truncated, then tampered with.
    bump(runtime, "ck-bad", 2)
    hashes = ckdir / "good" / "hashes.bin"
    original = hashes.read_bytes()
    hashes.write_bytes(original[:-8])
    refused("sandbox", "rollback", "ck-bad", "good", says="truncated")
    tampered_table = bytearray(original)
    tampered_table[8] ^= 1  # a change whatever page 1's hash was
    hashes.write_bytes(bytes(tampered_table))
    refused("sandbox", "rollback", "ck-bad", "good", says="digest")
    hashes.write_bytes(original)
    # Pages of its content flipped (one in 16: the rollback needs the
    # 16 MiB the change rewrote): every page is checked before any is written back.
    pages = ckdir / "good" / "pages.bin"
    kept = pages.read_bytes()
    data = bytearray(kept)
    for at in range(100, len(data), 16 * 4096):
        data[at] ^= 0xFF
    pages.write_bytes(bytes(data))
    refused("sandbox", "rollback", "ck-bad", "good", says="corrupt")
    got = report(runtime, "ck-bad")
    assert (got["seed"], got["mem"]) == ("2", "ok")  # nothing was rolled back
    pages.write_bytes(kept)
    # A link where a checkpoint's directory must be.
    (ckdir / "linked").symlink_to(ckdir / "second")
    refused("sandbox", "rollback", "ck-bad", "linked", says="no checkpoint")
    (ckdir / "linked").unlink()
    rollback(runtime, "ck-bad", "second")
    assert report(runtime, "ck-bad")["seed"] == "1"
    # Not in snapshot mode.
    plain = make_bundle(["sleep", "100"])
    runtime("run", "--detach", "--bundle", str(plain), "ck-plain", check=True)
    wait_status(runtime, "ck-plain", "running")
    refused("sandbox", "checkpoint", "ck-plain", says="not in snapshot mode")
    refused("sandbox", "checkpoint", "ck-none", says="does not exist")


def test_a_client_killed_at_any_moment_leaves_the_sandbox_running(
        runtime, make_bundle, memfill_rootfs: Path):
    started(runtime, make_bundle, memfill_rootfs, "ck-kill", mib=32)
    checkpoint(runtime, "ck-kill", "base")
    for i, delay in enumerate((0.0, 0.05, 0.15, 0.3, 0.6)):
        verb = ["checkpoint", "ck-kill", "--name", f"k{i}"] if i % 2 == 0 else \
            ["rollback", "ck-kill", "base"]
        proc = subprocess.Popen([PARACELL, "--root", str(runtime.root), "sandbox", *verb],
                                env=runtime.env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # The shim finishes what it began: the sandbox runs, whole.
        got = report(runtime, "ck-kill")
        assert got["mem"] == "ok", (delay, got)
        assert json.loads(runtime("state", "ck-kill", check=True).stdout)["status"] == "running"
    names = {c["name"] for c in json.loads(runtime("sandbox", "checkpoints", "-f", "json",
                                                   "ck-kill", check=True).stdout)}
    assert "base" in names
    assert not any(p.name.startswith(".new-") for p in
                   (runtime.root / "ck-kill" / "checkpoints").iterdir())


def test_nothing_is_left_after_delete(runtime, make_bundle, memfill_rootfs: Path):
    started(runtime, make_bundle, memfill_rootfs, "ck-gone")
    checkpoint(runtime, "ck-gone", "a")
    bump(runtime, "ck-gone", 2)
    checkpoint(runtime, "ck-gone", "b")
    rollback(runtime, "ck-gone", "a")
    runtime("kill", "ck-gone", "KILL", check=True)
    wait_status(runtime, "ck-gone", "stopped")
    runtime("delete", "ck-gone", check=True)
    assert not (runtime.root / "ck-gone").exists()
    runtime.assert_no_leaks()


def _state(runtime, cid: str) -> dict:
    return json.loads((runtime.root / cid / "state.json").read_text())


def _private_maps(pid: int, name: str) -> list[str]:
    """The permissions of each mapping of a file called `name` in pid."""
    found = []
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and os.path.basename(parts[5].strip()).startswith(name):
                found.append(parts[1])
    return found


def test_five_forks_run_at_once_each_their_own(runtime, make_bundle, memfill_rootfs: Path):
    started(runtime, make_bundle, memfill_rootfs, "ck-parent")
    checkpoint(runtime, "ck-parent", "seed")
    bump(runtime, "ck-parent", 2)  # the parent moves on; the forks start from the checkpoint
    result = runtime("sandbox", "fork", "--count", "5", "--id-prefix", "ck-f", "ck-parent",
                     "seed")
    assert result.returncode == 0, result.stderr
    forks = result.stdout.decode().split()
    assert forks == [f"ck-f{i}" for i in range(1, 6)]
    seen = {}
    for fid in forks:
        assert json.loads(runtime("state", fid, check=True).stdout)["status"] == "running"
        got = report(runtime, fid)
        assert (got["seed"], got["mem"], got["data"]) == ("1", "ok", "1"), (fid, got)
        out = runtime("exec", fid, "sh", "-c", "hostname; head -c 16 /dev/urandom | od -An -tx1 "
                      f"| tr -d ' \\n'; echo; echo {fid} > /mine", check=True).stdout.decode()
        hostname, random = out.split()
        seen[fid] = (hostname, random)
        # Its memory is the checkpoint's RAM file, mapped copy-on-write, and
        # its shim is the C relay: no RAM file and no Python of its own.
        state = _state(runtime, fid)
        assert state["vm"]["shares_memory_of"] == "checkpoint seed of ck-parent"
        assert _private_maps(state["vm"]["qemu_pid"], "fork-ram") == ["rw-p"]
        assert os.readlink(f"/proc/{state['shim_pid']}/exe").endswith("/paracell-vmshim")
    assert len({h for h, _ in seen.values()}) == 5 and len({r for _, r in seen.values()}) == 5
    assert all(seen[fid][0] == fid for fid in forks)
    # A file written in one is not in another, nor in the parent.
    for fid in forks:
        assert runtime("exec", fid, "cat", "/mine", check=True).stdout == f"{fid}\n".encode()
    assert runtime("exec", "ck-parent", "test", "-e", "/mine").returncode != 0
    # A fork that shares memory has no RAM of its own to checkpoint: one line.
    for verb in (["sandbox", "checkpoint", "ck-f1"], ["sandbox", "fork", "ck-f1"]):
        refused = runtime(*verb)
        assert refused.returncode != 0
        assert refused.stderr.decode().count("\n") == 1 and "--private-memory" in \
            refused.stderr.decode()
    # One with memory of its own is a snapshot-mode sandbox in full.
    result = runtime("sandbox", "fork", "--private-memory", "--id-prefix", "ck-p", "ck-parent",
                     "seed")
    assert result.returncode == 0, result.stderr
    assert _state(runtime, "ck-p1")["vm"]["shares_memory_of"] == ""
    checkpoint(runtime, "ck-p1", "own")
    bump(runtime, "ck-p1", 2)
    rollback(runtime, "ck-p1", "own")
    assert report(runtime, "ck-p1")["seed"] == "1"
    # Deleting the parent leaves the forks running; each goes on by itself,
    # on the RAM file that went with the parent's state.
    runtime("delete", "--force", "ck-parent", check=True)
    for fid in forks[:2]:
        assert bump(runtime, fid, 2)["mem"] == "ok"
    assert json.loads(runtime("state", "ck-f5", check=True).stdout)["status"] == "running"
    assert report(runtime, "ck-f5")["mem"] == "ok"
    for fid in [*forks, "ck-p1"]:
        runtime("delete", "--force", fid, check=True)
    runtime.assert_no_leaks()


def test_ten_forks_of_a_parent_that_keeps_writing_each_see_the_checkpoint(
        runtime, make_bundle, memfill_rootfs: Path):
    """The parent rewrites its memory and /data all the while the ten are
    made: each fork's memory (checked word by word against the pattern) and
    file are the checkpoint's. Then a fork's shim is killed, a fork of a
    fork of a fork is made, and nothing is left."""
    started(runtime, make_bundle, memfill_rootfs, "ck-busy")
    checkpoint(runtime, "ck-busy", "seed")
    stop = threading.Event()

    def keep_writing() -> None:
        for _ in range(300):  # bounded: 300 rewrites at most
            if stop.wait(0.1):
                return
            runtime("kill", "ck-busy", "USR1")
    writer = threading.Thread(target=keep_writing)
    writer.start()
    try:
        result = runtime("sandbox", "fork", "--count", "10", "--id-prefix", "ck-b", "ck-busy",
                         "seed")
    finally:
        stop.set()
        writer.join()
    assert result.returncode == 0, result.stderr
    forks = result.stdout.decode().split()
    assert len(forks) == 10
    for fid in forks:
        got = report(runtime, fid)
        assert (got["seed"], got["mem"], got["data"]) == ("1", "ok", "1"), (fid, got)
    assert int(report(runtime, "ck-busy")["seed"]) > 1  # the parent did move on meanwhile
    # A fork's shim killed: that fork stops and goes; its siblings run on.
    shim = _state(runtime, "ck-b1")["shim_pid"]
    os.kill(shim, signal.SIGKILL)
    wait_status(runtime, "ck-b1", "stopped")
    runtime("delete", "ck-b1", check=True)
    assert report(runtime, "ck-b2")["mem"] == "ok"
    # A fork of a fork of a fork: each level with memory of its own can be
    # forked again; the last one shares its parent's checkpoint.
    parent = "ck-busy"
    for level in range(1, 4):
        private = ["--private-memory"] if level < 3 else []
        result = runtime("sandbox", "fork", *private, "--id-prefix", f"ck-l{level}-", parent)
        assert result.returncode == 0, (level, result.stderr)
        parent = f"ck-l{level}-1"
        assert report(runtime, parent)["mem"] == "ok"
    assert _state(runtime, "ck-l3-1")["vm"]["shares_memory_of"].startswith("checkpoint ")
    for cid in [*forks[1:], "ck-l1-1", "ck-l2-1", "ck-l3-1", "ck-busy"]:
        runtime("delete", "--force", cid, check=True)
    runtime.assert_no_leaks()


def test_checkpoints_read_only_the_written_pages_and_miss_none(runtime, make_bundle,
                                                               writable_rootfs: Path):
    """After the first checkpoint, which reads every page, QEMU's log of
    writes says which pages to read (csrc/dirtylog.h). What it must not
    miss: pages that QEMU itself fills from the root disk (virtio-blk, a
    write from the host kernel, not a guest store), and pages the Pager
    unbinds. Rolled back and forth, a file read from disk between two
    checkpoints and a file removed between two others come back intact."""
    blob = os.urandom(6 << 20)
    (writable_rootfs / "blob").write_bytes(blob)
    want = hashlib.sha256(blob).hexdigest()
    bundle = make_bundle(["sleep", "600"], rootfs=writable_rootfs, readonly=False,
                         mutate=lambda c: c.update(annotations=SNAPSHOT))
    runtime("run", "--detach", "--bundle", str(bundle), "ck-log", check=True)
    first = checkpoint(runtime, "ck-log", "before")
    assert first["method"] == "every page" and first["pages_read"] > first["pages_present"]

    def sums() -> str:
        return runtime("exec", "ck-log", "sh", "-c", "sha256sum /blob /tmp/mine 2>&1",
                       ).stdout.decode()
    # The blob's pages reach the guest's page cache from QEMU's disk reads.
    assert want in sums()
    runtime("exec", "ck-log", "sh", "-c", "head -c 4194304 /dev/urandom > /tmp/mine", check=True)
    with_file = sums()
    read = checkpoint(runtime, "ck-log", "read")
    assert read["method"] == "written pages"
    assert read["pages_read"] < first["pages_read"] // 4, read
    # The file goes; its pages go back to the host (the Pager), and are
    # logged: a checkpoint after that sees them gone.
    runtime("exec", "ck-log", "rm", "/tmp/mine", check=True)
    time.sleep(1.5)
    gone = checkpoint(runtime, "ck-log", "gone")
    assert gone["method"] == "written pages"
    for name, expect in (("before", None), ("read", with_file), ("gone", None),
                         ("read", with_file), ("before", None), ("gone", None)):
        done = json.loads(runtime("sandbox", "rollback", "-f", "json", "ck-log", name,
                                  check=True).stdout)
        assert done["method"] == "written pages", done
        now = sums()
        assert want in now, (name, now)
        if expect is not None:
            assert now == expect, (name, now, expect)
        else:
            assert "No such file" in now, (name, now)
    runtime("delete", "--force", "ck-log", check=True)
    runtime.assert_no_leaks()


def test_a_ctrl_c_while_forks_are_made_leaves_none_of_them(runtime, make_bundle,
                                                           memfill_rootfs: Path,
                                                           tmp_path: Path):
    """SIGINT to the `fork` process's group, as a terminal's Ctrl-C sends it,
    once the first fork's create has begun: every create ends, the forks
    made are deleted, and the verb fails."""
    started(runtime, make_bundle, memfill_rootfs, "ck-int")
    checkpoint(runtime, "ck-int", "seed")
    with open(tmp_path / "out", "wb") as out:
        proc = subprocess.Popen([PARACELL, "--root", str(runtime.root), "sandbox", "fork",
                                 "--count", "6", "--id-prefix", "ck-x", "ck-int", "seed"],
                                env=runtime.env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while not any(p.name.startswith("ck-x") for p in runtime.root.iterdir()):
            assert proc.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "out").read_text()
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(120) != 0, (tmp_path / "out").read_text()
    left = [p.name for p in runtime.root.iterdir() if p.name.startswith("ck-x")]
    assert left == [], left
    assert report(runtime, "ck-int")["mem"] == "ok"  # the parent runs on
    runtime("delete", "--force", "ck-int", check=True)
    runtime.assert_no_leaks()


def test_a_fork_from_now_and_bad_fork_requests(runtime, make_bundle, memfill_rootfs: Path):
    started(runtime, make_bundle, memfill_rootfs, "ck-now")
    result = runtime("sandbox", "fork", "ck-now")
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().split() == ["ck-now-fork-1"]
    assert report(runtime, "ck-now-fork-1")["mem"] == "ok"
    # The checkpoint it took is the parent's own.
    assert len(json.loads(runtime("sandbox", "checkpoints", "-f", "json", "ck-now",
                                  check=True).stdout)) == 1
    for args, says in ((["--count", "0", "ck-now"], "--count"),
                       (["ck-now", "nope"], "no checkpoint"),
                       (["--id-prefix", "ck-now-fork-", "ck-now"], "exists already"),
                       (["--id-prefix", "bad/", "ck-now"], "")):
        result = runtime("sandbox", "fork", *args)
        assert result.returncode != 0, args
        assert len(result.stderr.strip().splitlines()) == 1 and says in result.stderr.decode()


BOOT_ID = "/proc/sys/kernel/random/boot_id"


def boot_id(runtime, cid: str) -> str:
    return runtime("exec", cid, "cat", BOOT_ID, check=True).stdout.decode().strip()


def test_a_fork_gets_a_boot_id_of_its_own(runtime, make_bundle, writable_rootfs: Path):
    """The parent has read its boot_id, so the kernel drew it before the
    checkpoint: the fork's agent renews it (guest/bootid/). A container's
    root, even with CAP_SYS_ADMIN, can neither renew nor choose it."""
    def privileged(config: dict) -> None:
        config["annotations"] = SNAPSHOT
        config["process"]["capabilities"] = {kind: ["CAP_SYS_ADMIN"] for kind in (
            "bounding", "effective", "permitted", "inheritable", "ambient")}
    bundle = make_bundle(["sleep", "600"], rootfs=writable_rootfs, readonly=False,
                         mutate=privileged)
    runtime("run", "--detach", "--bundle", str(bundle), "ck-boot", check=True)
    parent = boot_id(runtime, "ck-boot")
    result = runtime("sandbox", "fork", "ck-boot")
    assert result.returncode == 0, result.stderr
    [fork] = result.stdout.decode().split()
    first, again = boot_id(runtime, fork), boot_id(runtime, fork)
    assert len(first) == 36 and first != parent and again == first
    assert boot_id(runtime, "ck-boot") == parent
    for cid, value in (("ck-boot", parent), (fork, first)):
        refused = runtime("exec", cid, "sh", "-c",
                          f"{SHOW_CAPS}; echo 00000000-0000-4000-8000-000000000000 > {BOOT_ID}")
        assert cap_masks(refused.stdout.decode())["CapEff"] & 1 << CAPABILITIES["SYS_ADMIN"]
        # Past the file's mode (root may open it): the kernel's own check says no.
        assert refused.returncode != 0 and b"Operation not permitted" in refused.stderr
        assert boot_id(runtime, cid) == value
    for cid in ("ck-boot", fork):
        runtime("delete", "--force", cid, check=True)
    runtime.assert_no_leaks()


def test_runc_checkpoint_and_restore_into_a_new_id_and_bundle(
        runtime, make_bundle, memfill_rootfs: Path, tmp_path: Path):
    started(runtime, make_bundle, memfill_rootfs, "ck-runc")
    before = bump(runtime, "ck-runc", 2)
    image, work = tmp_path / "image", tmp_path / "work"
    result = runtime("checkpoint", "--image-path", str(image), "--work-path", str(work),
                     "--leave-running", "--tcp-established", "ck-runc")
    assert result.returncode == 0, result.stderr
    assert (image / "inventory.img").is_file() and (work / "dump.log").is_file()
    assert json.loads(runtime("state", "ck-runc", check=True).stdout)["status"] == "running"
    bump(runtime, "ck-runc", 3)
    # Another bundle of the same image, another id: it goes on from the checkpoint.
    other = snapshot_bundle(make_bundle, memfill_rootfs, ["memfill", "16"])
    pid_file = tmp_path / "restored.pid"
    result = runtime("restore", "--image-path", str(image), "--bundle", str(other), "--detach",
                     "--pid-file", str(pid_file), "ck-restored")
    assert result.returncode == 0, result.stderr
    state = json.loads(runtime("state", "ck-restored", check=True).stdout)
    assert state["status"] == "running" and int(pid_file.read_text()) == state["pid"]
    got = report(runtime, "ck-restored")
    assert (got["seed"], got["mem"], got["fds"]) == ("2", "ok", before["fds"])
    assert report(runtime, "ck-runc")["seed"] == "3"  # the original went on
    # Without --leave-running the container stops, as under runc.
    result = runtime("checkpoint", "--image-path", str(tmp_path / "image2"), "ck-runc")
    assert result.returncode == 0, result.stderr
    wait_status(runtime, "ck-runc", "stopped")


def test_runc_checkpoint_and_restore_refuse_bad_input_in_one_line(
        runtime, make_bundle, memfill_rootfs: Path, tmp_path: Path):
    started(runtime, make_bundle, memfill_rootfs, "ck-rbad")
    plain = make_bundle(["sleep", "100"])
    runtime("run", "--detach", "--bundle", str(plain), "ck-rplain", check=True)
    wait_status(runtime, "ck-rplain", "running")
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    (tmp_path / "link").symlink_to(full)
    image = tmp_path / "image"
    assert runtime("checkpoint", "--image-path", str(image), "--leave-running",
                   "ck-rbad").returncode == 0
    bundle = snapshot_bundle(make_bundle, memfill_rootfs, ["memfill", "16"])
    hashes = image / "hashes.bin"
    tampered = tmp_path / "tampered"
    shutil.copytree(image, tampered, symlinks=True)
    data = bytearray((tampered / "hashes.bin").read_bytes())
    data[8] ^= 1
    (tampered / "hashes.bin").write_bytes(bytes(data))
    cases = [
        (["checkpoint", "--image-path", str(tmp_path / "i1"), "ck-rplain"], "snapshot mode"),
        (["checkpoint", "--image-path", str(full), "ck-rbad"], "not empty"),
        (["checkpoint", "--image-path", str(tmp_path / "link"), "ck-rbad"], "not a directory"),
        (["checkpoint", "--image-path", str(tmp_path / "i2"), "--pre-dump", "ck-rbad"],
         "not supported"),
        (["restore", "--image-path", str(image), "--bundle", str(bundle), "ck-r1"], "--detach"),
        (["restore", "--image-path", str(full), "--bundle", str(bundle), "-d", "ck-r2"],
         "no ParaCell checkpoint"),
        (["restore", "--image-path", str(tampered), "--bundle", str(bundle), "-d", "ck-r3"],
         "digest"),
        (["restore", "--image-path", str(image), "--bundle", str(plain), "-d", "ck-r4"],
         "snapshot-mode"),
    ]
    for args, says in cases:
        result = runtime(*args)
        line = result.stderr.decode().strip()
        assert result.returncode != 0 and "\n" not in line and says in line, (args, line)
    assert hashes.is_file()
    for cid in ("ck-r2", "ck-r3", "ck-r4"):
        assert not (runtime.root / cid).exists()
    assert json.loads(runtime("state", "ck-rbad", check=True).stdout)["status"] == "running"


@pytest.mark.parametrize("verb", ["checkpoint", "rollback"])
def test_a_shim_killed_mid_operation_leaves_a_stopped_deletable_container(
        runtime, make_bundle, memfill_rootfs: Path, verb: str):
    """The other way a checkpoint or rollback can be cut short: the shim
    itself dies (SIGKILL). The container is then stopped, never half rolled
    back, and delete leaves nothing."""
    for i, delay in enumerate((0.05, 0.2, 0.4)):
        cid = f"ck-shim-{verb}-{i}"
        started(runtime, make_bundle, memfill_rootfs, cid)
        checkpoint(runtime, cid, "base")
        bump(runtime, cid, 2)
        args = ["checkpoint", cid] if verb == "checkpoint" else ["rollback", cid, "base"]
        proc = subprocess.Popen([PARACELL, "--root", str(runtime.root), "sandbox", *args],
                                env=runtime.env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(delay)
        shim = json.loads((runtime.root / cid / "state.json").read_text())["shim_pid"]
        os.kill(shim, signal.SIGKILL)
        proc.wait(timeout=120)
        wait_status(runtime, cid, "stopped")
        runtime("delete", cid, check=True)
    runtime.assert_no_leaks()



def sandbox_running(runtime, make_bundle, rootfs: Path, cid: str) -> None:
    bundle = snapshot_bundle(make_bundle, rootfs, ["sleep", "100000"])
    runtime("run", "--detach", "--bundle", str(bundle), cid, check=True)
    wait_status(runtime, cid, "running")


def exec_session(runtime, cid: str, *args: str, stdin=subprocess.DEVNULL) -> subprocess.Popen:
    return subprocess.Popen([PARACELL, "--root", str(runtime.root), "exec", cid, *args],
                            env=runtime.env, stdin=stdin, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def test_checkpoints_quiesce_while_an_exec_writes_steadily(
        runtime, make_bundle, writable_rootfs: Path):
    """Output keeps arriving as the agent quiesces: its answer must not wait
    for an event that quiescing itself has stopped (docs/agent-protocol.md)."""
    sandbox_running(runtime, make_bundle, writable_rootfs, "ck-steady")
    writer = exec_session(runtime, "ck-steady", "sh", "-c", "while :; do echo tick; done")
    assert writer.stdout.read(5) == b"tick\n"  # it runs
    drained = threading.Thread(target=writer.stdout.read)
    drained.start()
    for k in range(5):
        checkpoint(runtime, "ck-steady", f"s{k}")
    rollback(runtime, "ck-steady", "s0")
    assert writer.wait(timeout=60) == 137
    drained.join()
    assert ROLLED_BACK in writer.stderr.read()
    assert runtime("exec", "ck-steady", "echo", "after").stdout == b"after\n"


def test_an_exec_that_does_not_read_its_stdin_holds_back_only_itself(
        runtime, make_bundle, writable_rootfs: Path):
    """Megabytes of stdin for a process that does not read it: a checkpoint,
    other execs and a rollback go on (its stdin waits in its own window)."""
    sandbox_running(runtime, make_bundle, writable_rootfs, "ck-stdin")
    checkpoint(runtime, "ck-stdin", "base")
    stuck = exec_session(runtime, "ck-stdin", "sh", "-c", "echo reading later; sleep 600; cat",
                         stdin=subprocess.PIPE)
    feeding = threading.Thread(target=_feed, args=(stuck, b"y" * (8 << 20)))
    feeding.start()
    assert stuck.stdout.readline() == b"reading later\n"
    checkpoint(runtime, "ck-stdin", "during")
    assert runtime("exec", "ck-stdin", "echo", "another").stdout == b"another\n"
    rollback(runtime, "ck-stdin", "base")
    assert stuck.wait(timeout=60) == 137
    assert ROLLED_BACK in stuck.stderr.read()
    feeding.join(timeout=60)


def _feed(proc: subprocess.Popen, data: bytes) -> None:
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except BrokenPipeError:
        pass  # the session ended before it took it all



def test_a_guest_that_never_answers_fails_the_checkpoint_cleanly(
        runtime, make_bundle, writable_rootfs: Path):
    """The guest is hostile: one that never answers QUIESCE (here its QEMU
    is stopped) fails the operation in one line after the bounded wait, and
    the sandbox goes on as it was once it runs again."""
    sandbox_running(runtime, make_bundle, writable_rootfs, "ck-mute")
    checkpoint(runtime, "ck-mute", "before")
    [qemu] = runtime.qemu_processes()
    os.kill(qemu, signal.SIGSTOP)
    try:
        result = runtime("sandbox", "checkpoint", "--name", "never", "ck-mute", timeout=60)
    finally:
        os.kill(qemu, signal.SIGCONT)
    assert result.returncode != 0
    assert result.stderr == b"paracell: the guest did not quiesce: QUIESCE: timed out\n"
    assert not (runtime.root / "ck-mute" / "checkpoints" / "never").exists()
    assert runtime("exec", "ck-mute", "echo", "awake").stdout == b"awake\n"
    checkpoint(runtime, "ck-mute", "after")
    rollback(runtime, "ck-mute", "before")
    assert runtime("exec", "ck-mute", "echo", "again").stdout == b"again\n"


# The race of checkpoints and rollbacks with execs that start and end:
# bounded in operations and in time, so it stays short on a loaded host.
RACE_OPS = 30
RACE_SECONDS = 60.0
RACE_WORKERS = 3
RACE_INPUT = bytes(range(256)) * 600  # 150 KiB of stdin: several STDIN frames
# (what it runs, its stdin, the stdout it must print when it runs to its end)
RACE_EXECS = (
    (["true"], None, b""),
    (["echo", "short"], None, b"short\n"),
    (["cat"], RACE_INPUT, RACE_INPUT),
    (["sh", "-c", "head -c 200000 /dev/zero | tr '\\0' x"], None, b"x" * 200000),
    (["sh", "-c", "sleep 0.3; echo slept"], None, b"slept\n"),
    # A line at a time for a while: output keeps arriving as the agent quiesces.
    (["sh", "-c", "i=0; while [ $i -lt 20000 ]; do echo tick; i=$((i+1)); done"], None,
     b"tick\n" * 20000),
)


def test_checkpoints_and_rollbacks_racing_execs_all_succeed(
        runtime, make_bundle, writable_rootfs: Path):
    """Execs start and end, some with output and some with stdin, while
    checkpoints and rollbacks come one after another: every operation
    succeeds, and every exec ends with its own status and output, or, when a
    rollback ended its session, with 137 and the documented message."""
    sandbox_running(runtime, make_bundle, writable_rootfs, "ck-race")
    checkpoint(runtime, "ck-race", "base")
    stop = threading.Event()
    execs: list[tuple[list[str], int, bytes, bytes, bytes]] = []

    def worker(w: int) -> None:
        n = w
        while not stop.is_set():
            args, given, want = RACE_EXECS[n % len(RACE_EXECS)]
            n += 1
            try:
                done = subprocess.run([PARACELL, "--root", str(runtime.root), "exec", "ck-race",
                                       *args], input=given, capture_output=True,
                                      stdin=None if given else subprocess.DEVNULL,
                                      env=runtime.env, timeout=90)
                execs.append((args, done.returncode, done.stdout, done.stderr, want))
            except subprocess.TimeoutExpired:
                execs.append((args, -1, b"", b"timed out", want))

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(RACE_WORKERS)]
    for t in threads:
        t.start()
    ops: list[tuple[str, int, bytes]] = []
    taken = ["base"]
    deadline = time.monotonic() + RACE_SECONDS
    try:
        for i in range(RACE_OPS):
            if time.monotonic() > deadline:
                break
            if i % 2 == 0:
                args = ["checkpoint", "--name", f"r{i}", "ck-race"]
            else:  # the newest and the first, in turn
                args = ["rollback", "ck-race", taken[-1] if i % 4 == 1 else "base"]
            done = runtime("sandbox", *args, timeout=60)
            ops.append((" ".join(args), done.returncode, done.stderr))
            if i % 2 == 0 and done.returncode == 0:
                taken.append(f"r{i}")
            if len(taken) > 4:
                runtime("sandbox", "rm-checkpoint", "ck-race", taken.pop(1), check=True)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    failed_ops = [op for op in ops if op[1] != 0]
    bad = [(args, rc, err[-300:]) for args, rc, out, err, want in execs
           if not (rc == 0 and out == want) and not (rc == 137 and ROLLED_BACK in err)]
    ended = sum(rc == 137 for _, rc, *_ in execs)
    summary = (f"{len(ops)} operations ({len(failed_ops)} failed), {len(execs)} execs "
               f"({len(bad)} bad), {ended} ended by a rollback")
    print(summary)
    assert not failed_ops, (summary, failed_ops)
    assert not bad, (summary, bad)
    assert len(ops) >= 6 and len(execs) >= 10, summary
    # And it goes on serving: a last exec and a last checkpoint.
    assert runtime("exec", "ck-race", "echo", "after").stdout == b"after\n"
    checkpoint(runtime, "ck-race", "last")
