"""The warm pool's parts that need no VM (docs/pool.md): its messages as
hostile input, which creates it serves, the programs it writes, its bounds,
and a state that names another container as its pooled VM."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from paracell import settings
from paracell.errors import ParacellError
from paracell.log import RuntimeLog
from paracell.runtime import poolwire
from paracell.runtime.bundle import defaultspec, podrole, spec
from paracell.runtime.context import Context
from paracell.runtime.pod import pooled
from paracell.runtime.pool import bundles, daemon
from paracell.runtime.state.store import CorruptStateError, StateStore


def test_a_message_is_one_bounded_json_object_and_extra_fds_are_closed():
    ours, theirs = socket.socketpair()
    with ours, theirs:
        r1, w1 = os.pipe()
        r2, w2 = os.pipe()
        socket.send_fds(theirs, [b'{"id": "x"}\n'], [r1, r2])
        message, fds = poolwire.receive(ours, max_fds=1)
        assert message == {"id": "x"} and len(fds) == 1
        for fd in (*fds, r1, r2, w1, w2):
            os.close(fd)
        for bad in (b"[1, 2]\n", b"not json\n", b"{" + b" " * poolwire.MESSAGE_MAX + b"}\n",
                    b'{"no": "newline"}'):
            theirs.sendall(bad)
            if not bad.endswith(b"\n"):
                theirs.shutdown(socket.SHUT_WR)
            with pytest.raises(ParacellError, match="no valid message"):
                poolwire.receive(ours)
            ours.setblocking(False)
            try:  # what was left of an over-long message
                while ours.recv(65536):
                    pass
            except BlockingIOError:
                pass
            ours.setblocking(True)


def test_a_message_too_long_to_send_is_refused():
    ours, theirs = socket.socketpair()
    with ours, theirs, pytest.raises(ParacellError, match="too long"):
        poolwire.send(ours, {"x": "y" * poolwire.MESSAGE_MAX})


def test_without_a_pool_a_claim_finds_none_at_once(tmp_path):
    began = time.monotonic()
    assert poolwire.claim(str(tmp_path), "qemu/tcg/default/256MiB") is None
    assert time.monotonic() - began < 0.5


def test_a_claim_answered_with_a_foreign_id_or_no_fd_is_refused(tmp_path):
    (tmp_path / poolwire.POOL_DIR).mkdir()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(poolwire.socket_path(str(tmp_path))))
    listener.listen(4)
    import threading

    answers = [({"id": "victim"}, True), ({"id": poolwire.VM_PREFIX + "ab"}, False)]

    def serve() -> None:
        for answer, with_fd in answers:
            conn, _ = listener.accept()
            with conn:
                poolwire.receive(conn)
                r, w = os.pipe()
                poolwire.send(conn, answer, fds=(r,) if with_fd else ())
                os.close(r)
                os.close(w)

    server = threading.Thread(target=serve)
    server.start()
    try:
        assert poolwire.claim(str(tmp_path), "k") is None  # not a pooled VM's ID
        assert poolwire.claim(str(tmp_path), "k") is None  # no lease came with it
    finally:
        server.join(10)
        listener.close()


def _bundle(tmp_path: Path, mutate=None) -> spec.Bundle:
    config = defaultspec.default_config(["true"])
    config["root"] = {"path": str(tmp_path), "readonly": True}
    if mutate:
        mutate(config)
    directory = tmp_path / "b"
    directory.mkdir(exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return spec.load_bundle(str(directory))


def _namespace(kind: str, path: str = ""):
    def mutate(config: dict) -> None:
        others = [n for n in config["linux"]["namespaces"] if n["type"] != kind]
        config["linux"]["namespaces"] = [*others,
                                         {"type": kind, **({"path": path} if path else {})}]
    return mutate


@pytest.mark.parametrize("mutate, why", [
    (None, ""),
    (_namespace("network"), ""),
    (_namespace("network", "/proc/self/ns/net"), ""),  # the host's: lo only, as without a pool
    (_namespace("ipc", "/proc/self/ns/ipc"), "a namespace to join"),
    (_namespace("network", "/nonexistent/ns"),
     "network namespace /nonexistent/ns: No such file or directory"),
    (lambda c: c.update(annotations={"io.paracell.memory-manager": "none"}),
     "an io.paracell.* annotation"),
    (lambda c: c["linux"].update(resources={"memory": {"limit": 128 << 20}}),
     "linux.resources size its VM"),
    (lambda c: c.pop("process"), "no process"),
])
def test_which_creates_the_pool_serves(tmp_path, mutate, why):
    ctx = Context(str(tmp_path / "root"), RuntimeLog())
    bundle = _bundle(tmp_path, mutate)
    role = podrole.role(bundle.annotations, "c")
    assert pooled.why_not_pooled(ctx, bundle, role, forked=False) == why


def test_a_pods_sandbox_is_served_by_a_pool_of_its_size_and_its_members_never(tmp_path):
    ctx = Context(str(tmp_path / "root"), RuntimeLog())
    sandbox, none = podrole.PodRole("sandbox"), podrole.PodRole("none")
    plain = _bundle(tmp_path)
    assert pooled.why_not_pooled(ctx, plain, sandbox, False) == ""
    # What its own VM would have had: the pod's memory, not a container's.
    assert pooled.vm_memory_mib(plain, sandbox) == settings.pod_memory_mib()
    assert pooled.vm_memory_mib(plain, none) == settings.guest_memory_mib()
    bigger = _bundle(tmp_path, lambda c: c.update(
        annotations={podrole.SANDBOX_MEMORY: str(4096 << 20)}))
    assert pooled.why_not_pooled(ctx, bigger, sandbox, False) == ""
    assert pooled.vm_memory_mib(bigger, sandbox) == 4096
    assert pooled.kind_of(ctx, 4096) != pooled.kind_of(ctx, settings.guest_memory_mib())
    bad = _bundle(tmp_path, lambda c: c.update(annotations={podrole.SANDBOX_MEMORY: "lots"}))
    assert "not a byte count" in pooled.why_not_pooled(ctx, bad, sandbox, False)
    assert pooled.why_not_pooled(ctx, plain, podrole.PodRole("member", "sb"),
                                 False) == "a pod's container"


def test_a_namespace_with_more_interfaces_than_spares_is_not_served(tmp_path):
    from tests import netutil

    ctx = Context(str(tmp_path / "root"), RuntimeLog())
    role = podrole.PodRole("sandbox")
    with netutil.netns() as pod, netutil.netns() as peer:
        bundle = _bundle(tmp_path, _namespace("network", pod.path))
        assert pooled.why_not_pooled(ctx, bundle, role, False) == ""  # lo only
        netutil.veth(pod, "eth0", peer, "p0")
        assert pooled.why_not_pooled(ctx, bundle, role, False) == ""
        netutil.veth(pod, "eth1", peer, "p1")
        assert pooled.why_not_pooled(ctx, bundle, role, False) == \
            "2 network interfaces, more than a pooled VM's spares"


def test_pod_members_forks_and_no_templates_are_never_served(tmp_path, monkeypatch):
    ctx = Context(str(tmp_path / "root"), RuntimeLog())
    bundle = _bundle(tmp_path)
    none = podrole.PodRole("none")
    assert pooled.why_not_pooled(ctx, bundle, podrole.PodRole("member", "sb"), False)
    assert pooled.why_not_pooled(ctx, bundle, podrole.PodRole("none", in_pods_network=True),
                                 False)
    assert pooled.why_not_pooled(ctx, bundle, none, forked=True) == "a fork"
    off = Context(ctx.root, ctx.log, no_template=True)
    assert pooled.why_not_pooled(off, bundle, none, False) == "templates are off"
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"warm_pool": False}))
    monkeypatch.setenv("PARACELL_CONFIG", str(config))
    assert pooled.why_not_pooled(ctx, bundle, none, False) == "warm_pool is off in the settings"
    with pytest.raises(ParacellError, match="the warm pool is off"):
        daemon.Pool(ctx, daemon.PoolSettings(1, 256, 0, (256,)), {"k": 256})


def test_the_pools_programs_run_here_as_in_the_guest(tmp_path):
    for (name, code), check in ((bundles.TRUE, "exits"), (bundles.PAUSE, "waits")):
        program = tmp_path / name
        program.write_bytes(bundles.static_program(code))
        program.chmod(0o755)
        proc = subprocess.Popen([str(program)])
        try:
            status = proc.wait(timeout=0.5 if check == "waits" else 10)
        except subprocess.TimeoutExpired:
            status = None
        finally:
            proc.kill()
            proc.wait()
        assert status == (None if check == "waits" else 0), name


@pytest.mark.parametrize("size, budget, floor, shapes, error", [
    (65, 256, 0, (256,), "pool size 65 is outside 0..64"),
    (-1, 256, 0, (256,), "pool size -1"),
    (1, 15, 0, (256,), "budget of 15 MiB"),
    (1, 256, -1, (256,), "minimum available memory"),
    (1, 256, 0, (256, 63), "pooled VM memory of 63 MiB is outside 64..65536"),
    (1, 256, 0, (), "a pool keeps 1 to 8 sizes of VM, not 0"),
    (1, 256, 0, tuple(range(64, 73)), "a pool keeps 1 to 8 sizes of VM, not 9"),
])
def test_bad_pool_settings_are_one_line(size, budget, floor, shapes, error):
    with pytest.raises(ParacellError, match=error):
        daemon.PoolSettings(size, budget, floor, shapes).check()


def test_the_pool_makes_the_kind_it_holds_fewest_of_and_none_past_its_size():
    shape = daemon.PoolSettings(2, 256, 0, (256, 512))
    pool = object.__new__(daemon.Pool)  # its fields alone: no root, no backend
    pool.settings, pool.kinds, pool.vms = shape, {"small": 256, "pod": 512}, {}
    for expected in ("small", "pod", "small", "pod"):
        kind = pool._shortest_kind()
        assert kind == expected
        vm_id = f"vm{len(pool.vms)}"
        pool.vms[vm_id] = daemon.PooledVm(vm_id, kind)
    assert pool._shortest_kind() is None
    del pool.vms["vm1"]  # a pod's VM claimed
    assert pool._shortest_kind() == "pod"


def test_a_pools_vm_bundles_are_found_by_size_and_never_through_a_link(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    pool_dir = tmp_path / "pool"
    pool_dir.mkdir()
    made = {bundles.write_vm_bundle(pool_dir, mib) for mib in (256, 512)}
    (pool_dir / "bundle-1024").symlink_to(elsewhere)
    (pool_dir / "bundle-x").mkdir()
    assert set(bundles.vm_bundles(pool_dir)) == made
    assert all((d / "config.json").is_file() for d in made)


def test_a_state_that_names_another_container_as_its_pooled_vm_is_refused(tmp_path):
    """Its delete would delete that container."""
    store = StateStore(str(tmp_path))
    for name, pool_vm in (("good", poolwire.VM_PREFIX + "0123456789ab"),
                          ("bad", "victim"), ("sneaky", poolwire.VM_PREFIX + "../x")):
        directory = tmp_path / name
        directory.mkdir()
        (directory / "lock").write_text("")
        (directory / "state.json").write_text(json.dumps({
            "id": name, "status": "stopped", "pool_vm": pool_vm,
            "vm": {"config": None, "host": {"cgroups": []}}}))
    assert store.load("good").pool_vm.startswith(poolwire.VM_PREFIX)
    for name in ("bad", "sneaky"):
        with pytest.raises(CorruptStateError):
            store.load(name)
