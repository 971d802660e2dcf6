"""VM templates on real VMs (docs/templates.md): a create with no template
boots cold and leaves one; the next create of the same shape restores it,
and the restored sandbox is its own: its process, stdio, exec and signals,
its entropy, hostname, clock and NIC. Unusable templates are booted past and
replaced. The Pager's own restores are in test_pager.py. Each test has a template store of
its own. Behaviour only: no timing is asserted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.netutil import Server, netns, route, veth

pytestmark = pytest.mark.integration

# The VM with no memory manager: its restores are the quickest to test, and
# the Pager's are tested in test_pager.py.
MANAGER = ("--memory-manager", "none")

# A static helper: 16 bytes of AT_RANDOM (the kernel's per-exec randomness,
# which seeds the stack canary) and 16 from getrandom(), in hex.
RANDOM_C = r"""
#include <stdio.h>
#include <sys/auxv.h>
#include <sys/random.h>
int main(void) {
    const unsigned char *at = (const unsigned char *)getauxval(AT_RANDOM);
    unsigned char buf[16];
    if (!at || getrandom(buf, sizeof buf, 0) != sizeof buf) return 1;
    for (int i = 0; i < 16; i++) printf("%02x", at[i]);
    printf(" ");
    for (int i = 0; i < 16; i++) printf("%02x", buf[i]);
    printf("\n");
    return 0;
}
"""


@pytest.fixture
def templates(runtime, tmp_path: Path) -> Path:
    store = tmp_path / "templates"
    runtime.env["PARACELL_TEMPLATES"] = str(store)
    return store


def keys(store: Path) -> list[str]:
    return sorted(p.name for p in store.iterdir() if len(p.name) == 32) if store.exists() else []


def created(runtime, bundle: Path, cid: str, *flags: str) -> dict:
    result = runtime(*MANAGER, *flags, "create", "--bundle", str(bundle), cid)
    assert result.returncode == 0, result.stderr
    return json.loads((runtime.root / cid / "state.json").read_text())["vm"]


def runtime_argv(runtime) -> list[str]:
    from tests.conftest import PARACELL

    return [PARACELL, "--root", str(runtime.root)]


def test_the_first_create_leaves_a_template_and_the_next_one_restores_it(
        runtime, make_bundle, templates):
    bundle = make_bundle(["sh", "-c", "yes 0123456789abcdef | head -c 1048576; exit 7"])
    first = created(runtime, bundle, "cold")
    assert first["template"].startswith("saved ") and keys(templates) == [first["template"][6:]]
    runtime("delete", "--force", "cold", check=True)

    log = runtime.root.parent / "restored.log"
    result = runtime("--debug", "--log", str(log), *MANAGER, "run", "--bundle", str(bundle),
                     "warm")
    expected = (b"0123456789abcdef\n" * (1048576 // 17 + 1))[:1048576]
    assert (result.returncode, result.stdout) == (7, expected), result.stderr
    assert f"restored from template {keys(templates)[0]}" in log.read_text()
    runtime.assert_no_leaks()


def test_a_restored_container_serves_exec_and_signals(runtime, make_bundle, templates):
    # PID 1 of its namespace: only a signal it handles reaches it.
    bundle = make_bundle(["sh", "-c", "trap 'exit 42' TERM; sleep 60 & wait"])
    created(runtime, bundle, "seed")
    runtime("delete", "--force", "seed", check=True)
    vm = created(runtime, bundle, "sig")
    assert vm["template"].startswith("restored ")
    runtime("start", "sig", check=True)
    result = runtime("exec", "sig", "sh", "-c", "echo from-exec; exit 3")
    assert (result.returncode, result.stdout) == (3, b"from-exec\n"), result.stderr
    runtime("kill", "sig", "TERM", check=True)
    deadline = time.monotonic() + 30
    while json.loads(runtime("state", "sig", check=True).stdout)["status"] != "stopped":
        assert time.monotonic() < deadline, "SIGTERM did not end the restored container"
        time.sleep(0.2)
    runtime("delete", "sig", check=True)
    runtime.assert_no_leaks()


def test_clones_of_one_template_are_each_their_own(runtime, make_bundle, templates,
                                                   writable_rootfs, tmp_path):
    helper = tmp_path / "random.c"
    helper.write_text(RANDOM_C)
    subprocess.run(["gcc", "-O2", "-static", "-o", str(writable_rootfs / "bin" / "rnd"),
                    str(helper)], check=True)
    script = ("rnd; od -An -tx1 -N16 /dev/urandom | tr -d ' \\n'; echo; hostname; date +%s")

    def bundle(name: str) -> Path:
        def mutate(config: dict) -> None:
            config["hostname"] = name
        return make_bundle(["sh", "-c", script], rootfs=writable_rootfs, readonly=False,
                           mutate=mutate)

    created(runtime, bundle("seed"), "seed")
    runtime("delete", "--force", "seed", check=True)
    outputs: dict[str, list[str]] = {}

    def run(name: str) -> None:
        log = tmp_path / f"{name}.log"
        result = runtime("--debug", "--log", str(log), *MANAGER, "run", "--bundle",
                         str(bundle(name)), name)
        assert result.returncode == 0, result.stderr
        assert "restored from template" in log.read_text()
        outputs[name] = result.stdout.decode().split()

    # At the same time: two VMs of one saved state, side by side.
    threads = [threading.Thread(target=run, args=(n,)) for n in ("alpha", "beta")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    a, b = outputs["alpha"], outputs["beta"]
    assert len(a) == len(b) == 5, outputs
    assert a[0] != b[0], "the same AT_RANDOM, so the same stack canary, in two clones"
    assert a[1] != b[1], "the same getrandom() bytes in two clones"
    assert a[2] != b[2], "the same /dev/urandom bytes in two clones"
    assert (a[3], b[3]) == ("alpha", "beta")
    for clone in (a, b):
        assert abs(int(clone[4]) - time.time()) < 30  # the guest read it while the run went on
    runtime.assert_no_leaks()


def test_the_guest_clock_is_the_hosts_after_a_restore(runtime, make_bundle, templates):
    bundle = make_bundle(["sleep", "60"])
    created(runtime, bundle, "seed")
    runtime("delete", "--force", "seed", check=True)
    time.sleep(2)  # the saved guest's clock stopped at the save; the host's went on
    assert created(runtime, bundle, "clock")["template"].startswith("restored ")
    runtime("start", "clock", check=True)
    before = time.time()
    result = runtime("exec", "clock", "date", "+%s")
    after = time.time()
    assert result.returncode == 0, result.stderr
    guest = int(result.stdout)  # whole seconds: busybox's date has no %N
    assert int(before) - 1 <= guest <= after + 1, (before, guest, after)
    runtime("delete", "--force", "clock", check=True)


def test_a_restored_sandbox_gets_its_own_nic(runtime, make_bundle, templates):
    script = ("cat /sys/class/net/eth0/address; ip -4 addr show eth0; "
              "wget -q -O - http://10.78.0.1:{}/")
    with netns() as first, netns() as ns, netns() as peer:
        veth(first, "eth0", peer, "seed0", a_addrs=("10.79.0.2/24",), b_addrs=("10.79.0.1/24",))
        veth(ns, "eth0", peer, "peer0", mtu=1400, a_addrs=("10.78.0.2/24",),
             b_addrs=("10.78.0.1/24",))
        route(ns, "0.0.0.0/0", "10.78.0.1")

        def in_ns(path: str):
            def mutate(config: dict) -> None:
                config["linux"]["namespaces"].append({"type": "network", "path": path})
            return mutate

        seed = make_bundle(["true"], mutate=in_ns(first.path))
        assert created(runtime, seed, "seed")["template"].startswith("saved ")
        runtime("delete", "--force", "seed", check=True)
        server = Server(peer, "10.78.0.1", b"HTTP/1.0 200 OK\r\n\r\nover-the-wire\n")
        try:
            bundle = make_bundle(["sh", "-c", script.format(server.port)], mutate=in_ns(ns.path))
            log = runtime.root.parent / "net.log"
            result = runtime("--debug", "--log", str(log), *MANAGER, "run", "--bundle",
                             str(bundle), "nic")
        finally:
            server.close()
        assert result.returncode == 0, result.stderr
        assert "restored from template" in log.read_text()
        out = result.stdout.decode().splitlines()
        assert out[0] == ns.link("eth0")["mac"], "the NIC kept the template's MAC"
        assert any("inet 10.78.0.2/24" in line for line in out)
        assert out[-1] == "over-the-wire"
    runtime.assert_no_leaks()


def _truncated_and_extended(t: Path) -> None:
    size = (t / "ram").stat().st_size
    os.truncate(t / "ram", 0)
    os.truncate(t / "ram", size)


def _kernel_overwritten(t: Path) -> None:
    """2 MiB of random bytes over the guest kernel's text (loaded at 16 MiB)."""
    with open(t / "ram", "r+b") as f:
        f.seek(16 << 20)
        f.write(os.urandom(2 << 20))


def _overwritten_and_digests_redone(t: Path) -> None:
    """The same, by someone who also rewrote the digests: every check
    passes, and the guest dies after its restore, before its SANDBOX reply."""
    from paracell.vmm.templatestore import ram_copy

    _kernel_overwritten(t)
    meta = json.loads((t / "meta.json").read_text())
    fd = os.open(t / "ram", os.O_RDONLY)
    try:
        meta["ram_digest"] = ram_copy(fd, -1, meta["ram_bytes"])
    finally:
        os.close(fd)
    (t / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("damage, why", [
    (lambda t: (t / "device.state").write_bytes(os.urandom((t / "device.state").stat().st_size)),
     "template {} cannot be used"),
    (lambda t: (t / "meta.json").write_text("{"), "template {} cannot be used"),
    (lambda t: os.truncate(t / "ram", 4096), "template {} cannot be used"),
    (lambda t: (t / "ram").unlink() or (t / "ram").symlink_to("/etc/passwd"),
     "template {} cannot be used"),
    (_truncated_and_extended, "restoring from template {} failed"),
    (_kernel_overwritten, "restoring from template {} failed"),
    (_overwritten_and_digests_redone,
     "the VM restored from template {} failed before its sandbox was attached"),
], ids=["state", "meta", "truncated", "link", "re-extended", "overwritten", "consistent"])
def test_a_damaged_template_gives_a_cold_boot_and_is_made_again(
        runtime, make_bundle, templates, damage, why):
    bundle = make_bundle(["sh", "-c", "echo ok"])
    key = created(runtime, bundle, "seed")["template"].split()[1]
    runtime("delete", "--force", "seed", check=True)
    damage(templates / key)
    log = runtime.root.parent / "damaged.log"
    result = runtime("--log", str(log), *MANAGER, "run", "--bundle", str(bundle), "cold")
    assert (result.returncode, result.stdout) == (0, b"ok\n"), result.stderr
    warned = [ln for ln in log.read_text().splitlines() if why.format(key) in ln]
    assert len(warned) == 1 and "booting cold, and making it again" in warned[0], \
        log.read_text()
    # Made again, whole: the next create restores it.
    assert created(runtime, bundle, "again")["template"] == f"restored {key}"
    runtime("delete", "--force", "again", check=True)
    runtime.assert_no_leaks()


def test_ram_from_one_save_beside_the_state_of_another_gives_a_cold_boot(
        runtime, make_bundle, templates, tmp_path):
    bundle = make_bundle(["sh", "-c", "echo ok"])
    key = created(runtime, bundle, "first")["template"].split()[1]
    runtime("delete", "--force", "first", check=True)
    shutil.copyfile(templates / key / "ram", tmp_path / "first-ram")
    runtime("template", "rm", key, check=True)
    assert created(runtime, bundle, "second")["template"] == f"saved {key}"
    runtime("delete", "--force", "second", check=True)
    shutil.copyfile(tmp_path / "first-ram", templates / key / "ram")
    log = runtime.root.parent / "mixed.log"
    result = runtime("--log", str(log), *MANAGER, "run", "--bundle", str(bundle), "mixed")
    assert (result.returncode, result.stdout) == (0, b"ok\n"), result.stderr
    assert "ram does not match its digest" in log.read_text()
    assert created(runtime, bundle, "again")["template"] == f"restored {key}"
    runtime("delete", "--force", "again", check=True)
    runtime.assert_no_leaks()


def test_a_template_store_others_can_write_is_never_restored_from(
        runtime, make_bundle, templates):
    """Another user who can write the store would choose the memory root's
    next guest runs: such a store is refused in one line, as sshd's StrictModes."""
    bundle = make_bundle(["sh", "-c", "echo ok"])
    key = created(runtime, bundle, "seed")["template"].split()[1]
    runtime("delete", "--force", "seed", check=True)
    os.chown(templates, 1000, 1000)
    os.chmod(templates, 0o777)
    log = runtime.root.parent / "foreign.log"
    result = runtime("--log", str(log), *MANAGER, "run", "--bundle", str(bundle), "cold")
    assert (result.returncode, result.stdout) == (0, b"ok\n"), result.stderr
    refused = [ln for ln in log.read_text().splitlines() if "writable by others" in ln]
    assert len(refused) == 1 and "owner uid 1000, mode 0777" in refused[0], log.read_text()
    state = created(runtime, bundle, "still")
    assert state["template"] == ""  # neither restored nor saved there
    listed = runtime("template", "list")
    assert listed.returncode == 1 and b"writable by others" in listed.stderr
    assert len(listed.stderr.splitlines()) == 1
    assert keys(templates) == [key]
    runtime("delete", "--force", "still", check=True)
    os.chown(templates, 0, 0)
    os.chmod(templates, 0o700)
    runtime.assert_no_leaks()


def test_parallel_creates_of_one_shape_leave_one_consistent_template(
        runtime, make_bundle, templates, tmp_path):
    bundle = make_bundle(["true"])
    ids = [f"par{i}" for i in range(8)]
    # Files, not pipes: a detached shim holds the create's stdio for its life.
    errs = [tmp_path / f"{cid}.err" for cid in ids]
    procs = []
    for cid, err in zip(ids, errs, strict=True):
        with err.open("wb") as stderr:
            procs.append(subprocess.Popen(
                [*runtime_argv(runtime), *MANAGER, "create", "--bundle", str(bundle), cid],
                env=runtime.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=stderr))
    codes = [p.wait(timeout=250) for p in procs]
    assert codes == [0] * 8, [e.read_text() for e in errs]
    outcomes = [json.loads((runtime.root / cid / "state.json").read_text())["vm"]["template"]
                for cid in ids]
    assert len(keys(templates)) == 1
    assert sum(o.startswith("saved ") for o in outcomes) == 1, outcomes
    for cid in ids:
        runtime("delete", "--force", cid, check=True)
    assert created(runtime, bundle, "after")["template"] == f"restored {keys(templates)[0]}"
    runtime("delete", "--force", "after", check=True)
    assert [p.name for p in templates.iterdir() if p.name.startswith(".new-")] == []
    runtime.assert_no_leaks()


def test_what_turns_templates_off(runtime, make_bundle, templates, tmp_path):
    bundle = make_bundle(["true"])
    assert created(runtime, bundle, "flag", "--no-template")["template"] == ""

    def annotated(value: str) -> Path:
        def mutate(config: dict) -> None:
            config["annotations"] = {"io.paracell.template": value}
        return make_bundle(["true"], mutate=mutate)

    assert created(runtime, annotated("off"), "note")["template"] == ""
    settings = tmp_path / "config.json"
    settings.write_text('{"templates": false}')
    runtime.env["PARACELL_CONFIG"] = str(settings)
    assert created(runtime, bundle, "file")["template"] == ""
    assert keys(templates) == []
    # The bundle's word wins over the operator's.
    assert created(runtime, annotated("on"), "on")["template"].startswith("saved ")
    bad = runtime(*MANAGER, "create", "--bundle", str(annotated("maybe")), "bad")
    assert bad.returncode == 1 and bad.stderr == (
        b"paracell: invalid annotation io.paracell.template='maybe': expected on or off\n")
    for cid in ("flag", "note", "file", "on"):
        runtime("delete", "--force", cid, check=True)
    runtime.assert_no_leaks()


def test_template_build_list_and_rm_on_an_empty_store(runtime, templates):
    listed = runtime("template", "list", check=True).stdout.decode()
    assert listed.splitlines() == [listed.splitlines()[0]] and listed.startswith("KEY")
    assert runtime("template", "list", "--format", "json", check=True).stdout == b"[]\n"
    built = runtime("template", "build", check=True).stdout.decode()  # the Pager's, by default
    (pager,) = keys(templates)
    assert built == f"template {pager}: built\n"
    built = runtime(*MANAGER, "template", "build", check=True).stdout.decode()
    (key,) = set(keys(templates)) - {pager}
    assert built == f"template {key}: built\n"
    again = runtime(*MANAGER, "template", "build", check=True).stdout.decode()
    assert again == f"template {key}: already built\n"
    rows = json.loads(runtime("template", "list", "--format", "json", check=True).stdout)
    assert sorted((r["key"], r["memory_manager"], r["memory_mib"]) for r in rows) == sorted(
        [(key, "none", 256), (pager, "pager", 256)])
    assert runtime("template", "rm", pager, check=True).returncode == 0
    missing = runtime("template", "rm", "0" * 32)
    assert missing.returncode == 1
    assert missing.stderr == f"paracell: template rm: no template {'0' * 32}\n".encode()
    hostile = runtime("template", "rm", "../../etc")
    assert hostile.returncode == 1 and b"is not a template key" in hostile.stderr
    assert runtime("template", "rm", "--all", check=True).stdout == b"removed 1 template\n"
    assert keys(templates) == []
    runtime.assert_no_leaks()


def test_a_restored_balloon_vm_resizes_live(runtime, make_bundle, templates):
    bundle = make_bundle(["sleep", "60"])
    balloon = ("--memory-manager", "balloon")
    assert runtime(*balloon, "create", "--bundle", str(bundle), "seed").returncode == 0
    runtime("delete", "--force", "seed", check=True)
    result = runtime(*balloon, "create", "--bundle", str(bundle), "grow")
    assert result.returncode == 0, result.stderr
    vm = json.loads((runtime.root / "grow" / "state.json").read_text())["vm"]
    assert vm["template"].startswith("restored ")
    runtime("start", "grow", check=True)

    def guest_total_kib() -> int:
        shown = runtime("exec", "grow", "grep", "MemTotal", "/proc/meminfo", check=True)
        return int(shown.stdout.split()[1])

    before = guest_total_kib()
    assert runtime("update", "--memory", "128m", "grow").returncode == 0
    assert before - guest_total_kib() >= 100 << 10  # the template's balloon serves this VM
    runtime("delete", "--force", "grow", check=True)
    runtime.assert_no_leaks()


def test_a_pod_vm_restores_and_its_members_join_it(runtime, make_bundle, templates):
    from tests.conftest import cri_pod

    outcomes = []
    for pod in ("pod1", "pod2"):
        pause = make_bundle(["sleep", "60"], mutate=cri_pod("sandbox", pod))
        outcomes.append(created(runtime, pause, pod)["template"])
        runtime("start", pod, check=True)
        member = f"{pod}-app"
        app = make_bundle(["sleep", "60"], mutate=cri_pod("container", pod))
        result = runtime(*MANAGER, "create", "--bundle", str(app), member)
        assert result.returncode == 0, result.stderr
        runtime("start", member, check=True)
        shown = runtime("exec", member, "sh", "-c", "echo in-$(hostname)-pod; ls /")
        assert shown.returncode == 0 and shown.stdout.startswith(b"in-"), shown.stderr
        assert len(runtime.qemu_processes()) == 1
        for cid in (member, pod):
            runtime("delete", "--force", cid, check=True)
    assert outcomes[0].startswith("saved ") and outcomes[1] == f"restored {outcomes[0][6:]}"
    runtime.assert_no_leaks()


def test_the_shim_saves_into_a_store_that_its_jail_makes_read_only(runtime, make_bundle,
                                                                   tmp_path):
    # The default store is under /var, which the shim's jail binds read-only
    # (runtime/host/hostns.py, READONLY_TREES): the save must still land.
    store = Path("/var/tmp") / f"paracell-test-templates-{os.getpid()}-{tmp_path.name}"
    runtime.env["PARACELL_TEMPLATES"] = str(store)
    try:
        bundle = make_bundle(["true"])
        assert created(runtime, bundle, "jailed")["template"].startswith("saved ")
        runtime("delete", "--force", "jailed", check=True)
        assert created(runtime, bundle, "again")["template"].startswith("restored ")
        runtime("delete", "--force", "again", check=True)
    finally:
        import shutil

        shutil.rmtree(store, ignore_errors=True)
    runtime.assert_no_leaks()
