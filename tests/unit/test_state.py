"""The state store and the spawn handshake against killed creators, on real
directories and real processes."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap
import time

import pytest

from paracell.errors import NotExistError, ParacellError
from paracell.runtime.state import status
from paracell.runtime.state.store import ContainerState, StateStore
from paracell.vmm import memory


def test_create_appears_whole_and_refuses_a_duplicate(tmp_path):
    store = StateStore(str(tmp_path / "root"))
    fd = store.create(ContainerState(id="c", status=status.CREATING))
    os.close(fd)
    assert sorted(os.listdir(store.path("c"))) == ["lock", "state.json"]
    with pytest.raises(ParacellError, match="container with id exists: c"):
        store.create(ContainerState(id="c", status=status.CREATING))
    assert os.listdir(store.root) == ["c"]  # no temporary directory left behind


def test_remains_of_killed_creates_and_removals_do_not_block_the_id(tmp_path):
    store = StateStore(str(tmp_path / "root"))
    os.makedirs(store.root)
    # A create killed before its rename (a temporary directory nobody locks)...
    dead = subprocess.Popen(["true"])
    dead.wait()
    os.makedirs(os.path.join(store.root, f"~new-{dead.pid}-abcd"))
    open(os.path.join(store.root, f"~new-{dead.pid}-abcd", "lock"), "w").close()
    # ...and one of a live create that has not locked it yet: not taken.
    live = os.path.join(store.root, f"~new-{os.getpid()}-beef")
    os.makedirs(live)
    # ...and a removal killed after the state file went (the old runtime's
    # `lock` plus a stray temporary state file).
    os.makedirs(store.path("c"))
    open(store.path("c", "lock"), "w").close()
    open(store.path("c", ".state.json.123"), "w").close()
    with pytest.raises(NotExistError):
        store.load("c")
    os.close(store.create(ContainerState(id="c", status=status.CREATING)))
    assert store.load("c").status == status.STOPPED  # its creator (pid 0) is gone
    assert sorted(os.listdir(store.root)) == ["c", os.path.basename(live)]


def test_the_sweep_never_takes_a_real_container(tmp_path):
    store = StateStore(str(tmp_path / "root"))
    os.close(store.create(ContainerState(id=".new-1-abcd", status=status.CREATING)))
    os.close(store.create(ContainerState(id="other", status=status.CREATING)))
    assert store.list_ids() == [".new-1-abcd", "other"]


def test_a_directory_someone_holds_is_not_taken(tmp_path):
    store = StateStore(str(tmp_path / "root"))
    os.makedirs(store.path("c"))
    fd = os.open(store.path("c", "lock"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(ParacellError, match="exists"):
            store.create(ContainerState(id="c", status=status.CREATING))
    finally:
        os.close(fd)


def test_creating_settles_by_its_creator():
    def alive():
        return True

    def dead():
        return False

    def unasked():
        raise AssertionError("a check the status does not need was run")

    assert status.settle(status.CREATING, unasked, alive) == status.CREATING
    assert status.settle(status.CREATING, unasked, dead) == status.STOPPED
    assert status.settle(status.RUNNING, dead, unasked) == status.STOPPED
    assert status.settle(status.RUNNING, alive, unasked) == status.RUNNING
    assert status.settle(status.STOPPED, unasked, unasked) == status.STOPPED


def test_ram_file_names_are_fixed_length_for_255_byte_ids():
    long_id = "x" * 255
    path = memory.path_for("/run/paracell", long_id)
    assert len(path.name) < 64
    assert path != memory.path_for("/run/other", long_id)


def test_a_child_waiting_for_commit_ends_when_its_creator_dies(tmp_path):
    """The shim's side of the handshake: a creator killed before it recorded the
    child leaves no child running."""
    marker = tmp_path / "child"
    script = textwrap.dedent(f"""
        import os, sys, time
        from paracell.runtime.vm import spawn

        def body(handshake):
            handshake.report(spawn.Ready(pid=os.getpid()))
            ok = handshake.committed()
            open({str(marker)!r}, "w").write(f"{{os.getpid()}} {{ok}}")
            return 0

        spawned = spawn.spawn(body, True, print)
        print(spawned.pid, flush=True)
        os._exit(0)  # the creator dies without commit
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    child = int(out.split()[0])
    deadline = time.monotonic() + 10
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert marker.read_text() == f"{child} False"


def test_commit_to_a_child_that_died_after_its_report_is_not_an_error():
    from paracell.runtime.vm import spawn

    def body(handshake):
        handshake.report(spawn.Ready(pid=os.getpid()))
        return 0  # gone without waiting for the commit

    spawned = spawn.spawn(body, False, print)
    os.waitpid(spawned.pid, 0)
    spawned.commit()  # EPIPE: the record will settle to stopped
    assert spawned.commit_fd == -1


def test_a_symlink_in_the_state_root_is_never_followed(tmp_path):
    """An entry of the root that is a symlink is not a container: no verb
    reads, writes or removes through it (`delete --force` once emptied the
    link's target: /etc, in a review)."""
    import subprocess

    from tests.conftest import PARACELL

    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "a").write_text("keep")
    (victim / "sub" / "b").write_text("keep")
    (victim / "state.json").write_text("{}")
    (victim / "lock").write_text("")
    root = tmp_path / "root"
    root.mkdir()
    (root / "linkdir").symlink_to(victim)
    real = root / "real"
    real.mkdir()
    (real / "lock").write_text("")
    (real / "state.json").symlink_to(victim / "a")

    def paracell(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PARACELL, "--root", str(root), *args], capture_output=True,
                              text=True, timeout=60, stdin=subprocess.DEVNULL)

    assert "container linkdir does not exist" in paracell("state", "linkdir").stderr
    assert "is a symlink, which is never followed" in paracell("state", "real").stderr
    listed = paracell("list", "--format", "json")
    assert listed.returncode == 0 and listed.stdout.strip() in ("[]", "null")
    for cid in ("linkdir", "real"):
        assert paracell("delete", "--force", cid).returncode == 0
    assert sorted(str(p.relative_to(victim)) for p in victim.rglob("*")) == [
        "a", "lock", "state.json", "sub", "sub/b"]
    assert (victim / "a").read_text() == "keep"
    assert (root / "linkdir").is_symlink() and not real.exists()
