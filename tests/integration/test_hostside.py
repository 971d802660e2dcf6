"""The host side of a container on real micro-VMs: the shim's and QEMU's
namespaces seen from the host, joined namespaces, the jail's privileges, the
host cgroup at cgroupsPath with linux.resources, the guest's size seen from
inside, `update`, `events --stats`, and nothing left after delete."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

HOST_NS = ("pid", "ipc", "uts", "mnt", "cgroup")
# hostns.QEMU_CAPS: chown, dac_override, dac_read_search, fowner, fsetid, mknod, setfcap.
QEMU_CAP_MASK = sum(1 << c for c in (0, 1, 2, 3, 4, 27, 31))


def ns_of(pid: int | str, kind: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{kind}")


def status_field(pid: int, name: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{name}:"):
            return line.split(":", 1)[1].strip()
    raise KeyError(name)


def vm_record(runtime, cid: str) -> dict:
    return json.loads((runtime.root / cid / "state.json").read_text())["vm"]


def cgroup_dirs(runtime, cid: str) -> dict[str, str]:
    """controller -> directory, from the state's host record."""
    dirs = vm_record(runtime, cid)["host"]["cgroups"]
    return {c: d["path"] for d in dirs for c in d["controllers"]}


def read(path: str) -> str:
    return Path(path).read_text().strip()


def create(runtime, bundle, cid, tmp_path) -> int:
    pid_file = tmp_path / f"{cid}.pid"
    result = runtime("create", "--bundle", str(bundle), "--pid-file", str(pid_file), cid)
    assert result.returncode == 0, result.stderr
    return int(pid_file.read_text())


def qemu_of(runtime, cid: str) -> int:
    return vm_record(runtime, cid)["qemu_pid"]


def add_ns(kind, path=None):
    def mutate(config):
        entry = {"type": kind} if path is None else {"type": kind, "path": path}
        config["linux"]["namespaces"] = [n for n in config["linux"]["namespaces"]
                                         if n["type"] != kind] + [entry]
    return mutate


def test_new_namespaces_jail_and_privileges_seen_from_the_host(runtime, make_bundle, tmp_path):
    bundle = make_bundle(["sleep", "60"], mutate=add_ns("cgroup"))
    shim = create(runtime, bundle, "nsnew", tmp_path)
    qemu = qemu_of(runtime, "nsnew")
    for kind in HOST_NS:
        assert ns_of(shim, kind) != ns_of("self", kind), kind
        assert ns_of(qemu, kind) != ns_of("self", kind), kind
        # QEMU has a mount namespace of its own, nested in the shim's (its root).
        assert (ns_of(qemu, kind) == ns_of(shim, kind)) == (kind != "mnt"), kind
    # No network namespace in the spec: the host's (the net helper owns that one).
    assert ns_of(shim, "net") == ns_of("self", "net")
    # The shim is PID 1 of its PID namespace, QEMU its child there, and the
    # pid-file has the shim's host pid.
    assert status_field(shim, "NSpid").split() == [str(shim), "1"]
    assert status_field(qemu, "NSpid").split()[-1] != str(qemu)
    assert int(status_field(qemu, "PPid")) == shim
    # The jail: QEMU sees the /proc of its PID namespace, and its mounts are
    # slaves of the host's (or private), so none propagates back.
    jail_proc = os.listdir(f"/proc/{qemu}/root/proc")
    assert sorted(p for p in jail_proc if p.isdigit()) == ["1", "2"]
    # No mount of the jail is in a peer group: what is mounted in it stays in it.
    jail_mounts = Path(f"/proc/{qemu}/mountinfo").read_text().splitlines()
    assert [ln for ln in jail_mounts if "shared:" in ln] == []
    # Host trees nothing in the jail writes are read-only there, not on the host.
    host_mounts = {ln.split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines()}
    assert "/usr" not in host_mounts and "/etc" not in host_mounts
    shim_mounts = Path(f"/proc/{shim}/mountinfo").read_text().splitlines()
    shim_opts = {ln.split()[4]: ln.split()[5].split(",") for ln in shim_mounts}
    for tree in ("/usr", "/etc"):
        assert "ro" in shim_opts[tree], tree
    # QEMU's own root: a read-only tmpfs holding what its command line names,
    # /usr, /sys, a few device nodes and its /proc; not the host's /etc, not
    # the shim's state, not other containers' RAM files.
    root = Path(f"/proc/{qemu}/root")
    dev = {p.name for p in (root / "dev").iterdir()}
    assert {"null", "urandom"} <= dev and not dev - {
        "null", "zero", "full", "random", "urandom", "kvm", "net", "vhost-net", "vhost-vsock",
        "shm"}, dev  # shm: only the directory of this VM's RAM file
    assert not (root / "etc/passwd").exists() and (root / "etc/ld.so.cache").exists()
    ram = vm_record(runtime, "nsnew")["config"]["ram_file"]
    assert [p.name for p in (root / ram.lstrip("/")).parent.iterdir()] == [Path(ram).name]
    assert not (root / str(runtime.root / "nsnew/state.json").lstrip("/")).exists()
    assert [ln for ln in jail_mounts if ln.split()[4] == "/"][0].split()[5].startswith("ro")
    touch = subprocess.run(["nsenter", "-t", str(shim), "-m", "touch", "/etc/paracell-jail"],
                           capture_output=True)
    assert touch.returncode != 0 and b"Read-only file system" in touch.stderr
    # QEMU's privileges: no_new_privs and only the 9p server's capabilities.
    assert status_field(qemu, "NoNewPrivs") == "1"
    assert int(status_field(qemu, "CapBnd"), 16) == QEMU_CAP_MASK
    assert int(status_field(qemu, "CapEff"), 16) & ~QEMU_CAP_MASK == 0
    # No transparent huge pages for QEMU (vmm/builder.py: they cost memory, not time).
    assert status_field(qemu, "THP_enabled") == "0"
    assert runtime("start", "nsnew").returncode == 0
    # The shim dies (SIGKILL, as a crash): QEMU dies with its PID namespace,
    # and delete --force leaves nothing, the cgroup included.
    dirs = cgroup_dirs(runtime, "nsnew")
    os.kill(shim, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{qemu}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{qemu}/ns")
    assert runtime("delete", "--force", "nsnew").returncode == 0
    assert [d for d in dirs.values() if os.path.exists(d)] == []
    runtime.assert_no_leaks()


def test_joined_namespaces_and_a_wrong_type(runtime, make_bundle, tmp_path):
    holder = subprocess.Popen(["unshare", "--ipc", "--uts", "--pid", "--fork", "--mount-proc",
                               "sleep", "120"])
    try:
        deadline = time.monotonic() + 10
        inner = None
        while inner is None and time.monotonic() < deadline:
            inner = child_of(holder.pid)
            time.sleep(0.05)
        assert inner is not None
        paths = {k: f"/proc/{inner}/ns/{k}" for k in ("ipc", "uts", "pid")}

        def mutate(config):
            for kind, path in paths.items():
                add_ns(kind, path)(config)

        shim = create(runtime, make_bundle(["true"], mutate=mutate), "nsjoin", tmp_path)
        for kind in ("ipc", "uts", "pid"):
            assert ns_of(shim, kind) == ns_of(inner, kind), kind
        # Joined, not made: the shim is not PID 1 there (sleep is).
        assert status_field(shim, "NSpid").split()[-1] != "1"
        assert runtime("delete", "--force", "nsjoin").returncode == 0

        wrong = make_bundle(["true"], mutate=add_ns("ipc", paths["uts"]))
        result = runtime("run", "--bundle", str(wrong), "nswrong")
        assert result.returncode != 0
        assert result.stderr.decode().splitlines() == [
            f"paracell: failed to setns into ipc namespace: Invalid argument "
            f"({paths['uts']} is a uts namespace)"]
        runtime.assert_no_leaks()
    finally:
        holder.kill()
        holder.wait()


def child_of(parent: int) -> int | None:
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and status_field(int(entry.name), "PPid") == str(parent):
                return int(entry.name)
        except (OSError, KeyError):
            continue
    return None


def cgroups_path_and_resources(path, **resources):
    def mutate(config):
        config["linux"]["cgroupsPath"] = path
        config["linux"]["resources"] = resources
    return mutate


def test_cgroup_resources_sizing_update_and_stats(runtime, make_bundle, tmp_path):
    cid = "cgfull"
    top = f"/paracell-it-{os.getpid()}"
    mutate = cgroups_path_and_resources(
        f"{top}/{cid}",
        memory={"limit": 300 << 20, "reservation": 100 << 20, "swappiness": 20},
        cpu={"shares": 512, "quota": 200000, "period": 100000},
        pids={"limit": 77},
        blockIO={"weight": 300},
        hugepageLimits=[{"pageSize": "2MB", "limit": 0}],
        devices=[{"allow": False, "access": "rwm"},
                 {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"}],
    )
    bundle = make_bundle(["sh", "-c", "grep MemTotal /proc/meminfo; nproc; sleep 60"],
                         mutate=mutate)
    out, err = tmp_path / "out", tmp_path / "err"
    # Files: the shim keeps the container's stdio open for its whole life.
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        pid_file = tmp_path / "pid"
        result = subprocess.run(
            [*runtime_cmd(runtime), "create", "--bundle", str(bundle), "--pid-file",
             str(pid_file), cid], stdin=subprocess.DEVNULL, stdout=stdout,
            stderr=stderr, env=runtime.env, timeout=120)
    assert result.returncode == 0, err.read_text()
    shim, qemu = int(pid_file.read_text()), qemu_of(runtime, cid)
    dirs = cgroup_dirs(runtime, cid)
    for controller in ("memory", "cpu", "cpuacct", "pids", "devices", "cpuset", "blkio"):
        assert dirs[controller].endswith(f"{top}/{cid}"), controller
        procs = {int(p) for p in read(f"{dirs[controller]}/cgroup.procs").split()}
        assert {shim, qemu} <= procs, controller
    mem, cpu = dirs["memory"], dirs["cpu"]
    # Guest RAM is the limit; the host limit adds the VMM's overhead (192 MiB under TCG).
    assert int(read(f"{mem}/memory.limit_in_bytes")) == (300 + 192) << 20
    assert int(read(f"{mem}/memory.soft_limit_in_bytes")) == 100 << 20
    assert read(f"{mem}/memory.swappiness") == "20"
    assert read(f"{cpu}/cpu.shares") == "512"
    assert read(f"{cpu}/cpu.cfs_quota_us") == "200000"
    assert read(f"{dirs['pids']}/pids.max") == "77"
    weight = dirs["blkio"] + ("/blkio.weight" if os.path.exists(f"{dirs['blkio']}/blkio.weight")
                              else "/blkio.bfq.weight")
    assert read(weight).split()[-1] == "300"
    devices = read(f"{dirs['devices']}/devices.list").splitlines()
    assert "c 1:3 rwm" in devices and "c 10:232 rwm" in devices and "a *:* rwm" not in devices
    if "hugetlb" in dirs:  # v1 hugetlb, or (hybrid hosts) the v2 hierarchy's
        name = "hugetlb.2MB.limit_in_bytes" if "/unified/" not in dirs["hugetlb"] \
            and os.path.exists(f"{dirs['hugetlb']}/hugetlb.2MB.limit_in_bytes") \
            else "hugetlb.2MB.max"
        assert read(f"{dirs['hugetlb']}/{name}") == "0"
    assert runtime("start", cid).returncode == 0
    deadline = time.monotonic() + 30
    while len(out.read_text().splitlines()) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    meminfo, nproc = out.read_text().splitlines()[:2]
    # 300 MiB of guest RAM less what the guest kernel keeps for itself.
    assert 250 << 10 < int(meminfo.split()[1]) <= 300 << 10
    assert nproc == "2"

    stats = json.loads(runtime("events", "--stats", cid, check=True).stdout)
    data = stats["data"]
    assert stats["type"] == "stats" and stats["id"] == cid
    assert data["memory"]["usage"]["limit"] == (300 + 192) << 20
    assert data["memory"]["usage"]["usage"] > 0
    assert data["cpu"]["usage"]["total"] > 0 and data["cpu"]["usage"]["percpu"]
    assert data["pids"]["limit"] == 77 and data["pids"]["current"] >= 2
    assert data["paracell"]["memory_manager"] == "pager"

    updated = runtime("update", "--cpu-quota", "100000", "--pids-limit", "99",
                      "--cpu-share", "256", cid)
    assert updated.returncode == 0, updated.stderr
    assert b"microvm cannot hotplug CPUs" in updated.stderr  # 2 vCPUs stay
    assert read(f"{cpu}/cpu.cfs_quota_us") == "100000"
    assert read(f"{dirs['pids']}/pids.max") == "99"
    assert read(f"{cpu}/cpu.shares") == "256"
    # The Pager cannot resize the guest live: refused in one line, nothing changed.
    refused = runtime("update", "--memory", "200m", cid)
    assert refused.returncode != 0
    assert len(refused.stderr.splitlines()) == 1 and b"cannot resize" in refused.stderr
    assert int(read(f"{mem}/memory.limit_in_bytes")) == (300 + 192) << 20
    peak = int(read(f"{mem}/memory.max_usage_in_bytes"))
    print(f"host cgroup peak: {peak >> 20} MiB for a 300 MiB guest")

    assert runtime("delete", "--force", cid).returncode == 0
    leftovers = [d for d in dirs.values() if os.path.exists(d)]
    leftovers += [p for p in Path("/sys/fs/cgroup").glob(f"*{top}")]
    leftovers += [p for p in Path("/sys/fs/cgroup").glob(f"*/{top.lstrip('/')}")]
    assert leftovers == []
    runtime.assert_no_leaks()


def runtime_cmd(runtime) -> list[str]:
    from tests.conftest import PARACELL

    return [PARACELL, "--root", str(runtime.root)]


@pytest.mark.both_vmms
def test_balloon_update_resizes_the_guest_live(runtime, make_bundle, tmp_path):
    def mutate(config):
        config["annotations"] = {"io.paracell.memory-manager": "balloon"}
        config["linux"]["resources"] = {"memory": {"limit": 512 << 20}}

    cid = "balloon"
    create(runtime, make_bundle(["sleep", "60"], mutate=mutate), cid, tmp_path)
    assert runtime("start", cid).returncode == 0
    mem = cgroup_dirs(runtime, cid)["memory"]

    def guest_total_kib() -> int:
        result = runtime("exec", cid, "grep", "MemTotal", "/proc/meminfo", check=True)
        return int(result.stdout.split()[1])

    before = guest_total_kib()
    assert runtime("update", "--memory", "256m", cid).returncode == 0
    after = guest_total_kib()
    assert before - after >= 250 << 10
    assert int(read(f"{mem}/memory.limit_in_bytes")) == (256 + 192) << 20
    assert runtime("update", "--memory", "512m", cid).returncode == 0
    assert guest_total_kib() == before
    too_big = runtime("update", "--memory", "1g", cid)
    assert too_big.returncode != 0 and b"no memory hotplug" in too_big.stderr
    assert runtime("delete", "--force", cid).returncode == 0
    runtime.assert_no_leaks()


def test_default_and_relative_cgroup_paths_hang_from_our_own(runtime, make_bundle, tmp_path):
    own = {line.split(":")[1]: line.split(":", 2)[2]
           for line in Path("/proc/self/cgroup").read_text().splitlines()}
    create(runtime, make_bundle(["true"]), "cgdefault", tmp_path)
    mem = cgroup_dirs(runtime, "cgdefault")["memory"]
    assert mem == os.path.normpath(f"/sys/fs/cgroup/memory/{own['memory']}/cgdefault")
    bundle = make_bundle(["true"], mutate=cgroups_path_and_resources("../../rel/x"))
    create(runtime, bundle, "cgrel", tmp_path)
    assert cgroup_dirs(runtime, "cgrel")["memory"] == \
        os.path.normpath(f"/sys/fs/cgroup/memory/{own['memory']}/rel/x")
    for cid in ("cgdefault", "cgrel"):
        assert runtime("delete", "--force", cid).returncode == 0
    assert not os.path.exists(os.path.dirname(mem) + "/rel")
    runtime.assert_no_leaks()


@pytest.mark.parametrize("args, resources, needle", [
    ((), {"memory": {"limit": "lots"}}, "linux.resources.memory.limit: 'lots' is not an integer"),
    ((), {"cpu": {"cpus": "0-1;reboot"}}, "linux.resources.cpu.cpus"),
    (("--systemd-cgroup",), {}, "--systemd-cgroup: systemd is not running on this host"),
    pytest.param((), {"network": {"classID": 1}},
                 "linux.resources: net_cls.classid needs the net_cls cgroup controller, which "
                 "this host does not have",
                 marks=pytest.mark.skipif(os.path.exists("/sys/fs/cgroup/net_cls"),
                                          reason="this host has a net_cls cgroup")),
    pytest.param((), {"unified": {"memory.high": "1G"}}, "cannot use unified on cgroup v1",
                 marks=pytest.mark.skipif(os.path.exists("/sys/fs/cgroup/cgroup.controllers"),
                                          reason="a cgroup v2 host takes unified")),
])
def test_refusals_are_one_line_and_leave_nothing(runtime, make_bundle, args, resources,
                                                 needle):
    bundle = make_bundle(["true"], mutate=cgroups_path_and_resources("", **resources))
    result = runtime(*args, "run", "--bundle", str(bundle), "refused")
    assert result.returncode != 0
    lines = result.stderr.decode().splitlines()
    assert len(lines) == 1 and needle in lines[0], lines
    runtime.assert_no_leaks()


def test_run_in_the_foreground_keeps_working(runtime, make_bundle, tmp_path):
    result = runtime("run", "--bundle", str(make_bundle(["sh", "-c", "echo fg; exit 7"])), "fg")
    assert result.returncode == 7 and result.stdout == b"fg\n", result.stderr
    # In the foreground `run` forks the shim itself (it waits on it): the shim
    # is still PID 1 of a new PID namespace, and `run` is back in its own.
    with open(tmp_path / "out", "wb") as out:
        run = subprocess.Popen([*runtime_cmd(runtime), "run", "--bundle",
                                str(make_bundle(["sleep", "30"])), "fg2"],
                               stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=runtime.env)
    try:
        deadline = time.monotonic() + 60
        shim = 0
        while not shim and time.monotonic() < deadline:
            state = runtime("state", "fg2")
            if state.returncode == 0 and json.loads(state.stdout)["status"] == "running":
                shim = json.loads(state.stdout)["pid"]
            time.sleep(0.1)
        assert shim and int(status_field(shim, "PPid")) == run.pid
        assert status_field(shim, "NSpid").split() == [str(shim), "1"]
        assert ns_of(run.pid, "pid_for_children") == ns_of("self", "pid")
        assert runtime("kill", "fg2", "KILL").returncode == 0
        assert run.wait(timeout=60) == 137
    finally:
        run.kill()
        run.wait()
    runtime.assert_no_leaks()


V2_SCRIPT = """
set -e
umount -l /sys/fs/cgroup
mount -t cgroup2 none /sys/fs/cgroup
P="$PARACELL --root $ROOT"
$P create --bundle $BUNDLE --pid-file $ROOT.pid v2c </dev/null >/dev/null 2>$ROOT.err
cg=/sys/fs/cgroup/$TOP/v2c
echo "subtree $(cat /sys/fs/cgroup/$TOP/cgroup.subtree_control)"
echo "hugetlb $(cat $cg/hugetlb.2MB.max)"
echo "procs $(cat $cg/cgroup.procs | tr '\\n' ' ')"
echo "shim $(cat $ROOT.pid)"
$P start v2c
cat > $ROOT.probe <<'PROBE'
echo $$ > "$1/cgroup.procs"
head -c1 /dev/full >/dev/null 2>&1 && echo "dev full-ok" || echo "dev full-denied"
echo x > /dev/null && echo "dev null-ok"
PROBE
sh $ROOT.probe $cg
echo "status $($P state v2c | grep -o '"status": "[a-z]*"')"
$P delete --force v2c
test -e $cg && echo "left $cg" || true
test -e /sys/fs/cgroup/$TOP && echo "left top" || true
$P run --bundle $BAD v2bad </dev/null >/dev/null 2>$ROOT.bad || true
echo "refused $(cat $ROOT.bad)"
"""


def test_pure_cgroup_v2_host_in_a_private_mount(runtime, make_bundle, tmp_path):
    """A v2-only host, as this hybrid host's v2 hierarchy mounted alone at
    /sys/fs/cgroup in a private mount namespace. Only hugetlb is free of v1
    here, so that is the controller v2 can be seen to apply, with the device
    rules (a BPF program, no controller needed); a limit whose controller v2
    lacks is refused in one line."""
    from tests.conftest import PARACELL

    top = f"pc-v2-{os.getpid()}"

    def good(config):
        cgroups_path_and_resources(
            f"/{top}/v2c", hugepageLimits=[{"pageSize": "2MB", "limit": 0}],
            devices=[{"allow": False, "access": "rwm"},
                     {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"}],
        )(config)

    bad = make_bundle(["true"], mutate=cgroups_path_and_resources(
        f"/{top}/v2bad", memory={"limit": 300 << 20}))
    env = dict(runtime.env, PARACELL=PARACELL, ROOT=str(runtime.root),
               BUNDLE=str(make_bundle(["sleep", "30"], mutate=good)), BAD=str(bad), TOP=top)
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                             V2_SCRIPT], env=env, capture_output=True, timeout=180)
    assert result.returncode == 0, result.stderr
    out = result.stdout.decode().splitlines()
    # Under v2 the device rules are a BPF program on the cgroup: a process
    # put in it may open /dev/null, not /dev/full; the VM itself runs on.
    assert [ln for ln in out if ln.startswith("dev ")] == ["dev full-denied", "dev null-ok"]
    lines = dict(line.split(" ", 1) for line in out if not line.startswith("dev "))
    assert lines["status"] == '"status": "running"', out
    assert "hugetlb" in lines["subtree"].split()
    assert lines["hugetlb"] == "0"
    procs = lines["procs"].split()
    assert lines["shim"] in procs and len(procs) == 2  # the shim and QEMU
    assert "left" not in lines
    assert lines["refused"] == ("paracell: linux.resources: memory.max needs the memory cgroup "
                                "controller, which this host does not have")
    assert not os.path.exists(f"/sys/fs/cgroup/unified/{top}")
    runtime.assert_no_leaks()


def test_events_reports_an_oom_kill_in_the_host_cgroup(runtime, make_bundle, tmp_path):
    def mutate(config):
        config["annotations"] = {"io.paracell.memory-manager": "none"}
        config["linux"]["resources"] = {"memory": {"limit": 256 << 20}}
        config["mounts"].append({"destination": "/fill", "type": "tmpfs", "source": "tmpfs",
                                 "options": ["size=200m"]})

    cid = "oom"
    create(runtime, make_bundle(["sleep", "60"], mutate=mutate), cid, tmp_path)
    assert runtime("start", cid).returncode == 0
    mem = cgroup_dirs(runtime, cid)["memory"]
    from tests.conftest import PARACELL

    events = subprocess.Popen([PARACELL, "--root", str(runtime.root), "events", "--interval",
                               "1", cid], stdout=subprocess.PIPE, env=runtime.env)
    try:
        # Squeeze the host limit (by hand: update would keep the overhead) to
        # just above what the VM holds, then have the guest touch 150 MiB more.
        usage = int(read(f"{mem}/memory.usage_in_bytes"))
        Path(f"{mem}/memory.limit_in_bytes").write_text(str(usage + (16 << 20)))
        runtime("exec", cid, "sh", "-c", "head -c 150m /dev/zero > /fill/x", timeout=60)
        out, _ = events.communicate(timeout=60)
    finally:
        events.kill()
    kinds = [json.loads(line)["type"] for line in out.decode().splitlines()]
    assert "oom" in kinds, kinds
    assert int(dict(line.split() for line in read(f"{mem}/memory.oom_control")
                    .splitlines())["oom_kill"]) >= 1
    assert json.loads(runtime("state", cid).stdout)["status"] == "stopped"
    assert runtime("delete", cid).returncode == 0
    runtime.assert_no_leaks()


def cgroup_hierarchies() -> list[Path]:
    """Every mounted hierarchy's root (v1 controllers and the unified one)."""
    return [p for p in Path("/sys/fs/cgroup").iterdir() if p.is_dir() and not p.is_symlink()]


@pytest.mark.parametrize("leaf, needle", [
    ("cgroup.procs", "is not a cgroup (cgroupsPath names a control file)"),
    ("tasks", "names a control file"),
    # Within the spec's 4096 bytes, but past PATH_MAX below /sys/fs/cgroup/NAME.
    ("/".join(["p" * 250] * 16 + ["q" * 60]), "File name too long"),
], ids=["cgroup.procs", "tasks", "past-PATH_MAX"])
def test_a_create_that_fails_in_its_cgroup_path_leaves_no_level(runtime, make_bundle, leaf,
                                                                needle):
    """Levels that create made are removed, however the leaf failed: a
    control file's name (ENOTDIR), a path past PATH_MAX (ENAMETOOLONG)."""
    top = f"pc-leak-{os.getpid()}"
    bundle = make_bundle(["true"], mutate=cgroups_path_and_resources(f"/{top}/mid/{leaf}"))
    result = runtime("run", "--bundle", str(bundle), "cgleak")
    lines = result.stderr.decode().splitlines()
    assert result.returncode != 0 and len(lines) == 1 and needle in lines[0], lines
    assert runtime("delete", "--force", "cgleak").returncode == 0
    left = [str(h / top) for h in cgroup_hierarchies() if (h / top).exists()]
    assert left == []
    runtime.assert_no_leaks()


def test_a_cgroups_path_with_a_newline_is_one_quoted_line(runtime, make_bundle):
    bundle = make_bundle(["true"], mutate=cgroups_path_and_resources("/pc-nl\nsecond-line"))
    result = runtime("run", "--bundle", str(bundle), "cgnl")
    lines = result.stderr.decode().splitlines()
    assert result.returncode != 0 and len(lines) == 1, lines
    assert "'/pc-nl\\nsecond-line' contains a control character" in lines[0], lines
    runtime.assert_no_leaks()
