"""linux.sysctl, process.oomScoreAdj, linux.readonlyPaths and
linux.maskedPaths in real micro-VMs, each checked from inside the container,
as a conformance suite would, and refused or failed in one line as runc does."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.integration

# What `runc spec` puts in every config.json.
RUNC_MASKED = ["/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
               "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware",
               "/proc/scsi"]
RUNC_READONLY = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]


def linux(**fields):
    def mutate(config):
        config["linux"].update(fields)
    return mutate


def run_ok(runtime, bundle, cid) -> list[str]:
    result = runtime("run", "--bundle", str(bundle), cid)
    assert result.returncode == 0, result.stderr
    runtime.assert_no_leaks()
    return result.stdout.decode().splitlines()


def one_line_failure(runtime, bundle, cid) -> str:
    result = runtime("run", "--bundle", str(bundle), cid)
    assert result.returncode != 0
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines
    runtime.assert_no_leaks()
    return lines[0]


def test_namespaced_sysctls_are_set_in_the_container(runtime, make_bundle):
    sysctls = {"kernel.shmmax": "123456789", "kernel.sem": "250 32000 100 200",
               "fs.mqueue.msg_max": "20", "kernel.domainname": "example.test",
               "net.ipv4.ip_forward": "1", "kernel/shmmni": "8192"}
    files = " ".join("/proc/sys/" + name.replace(".", "/") for name in sysctls)

    def mutate(config):
        config["linux"]["namespaces"].append({"type": "network"})
        config["linux"]["sysctl"] = sysctls

    # A non-root process reads what init's setup wrote in its namespaces.
    bundle = make_bundle(["cat", *files.split()], mutate=mutate, user={"uid": 1000, "gid": 1000})
    lines = run_ok(runtime, bundle, "sysok")
    assert [" ".join(ln.split()) for ln in lines] == list(sysctls.values())


def test_sysctl_outside_the_containers_namespaces_is_refused(runtime, make_bundle):
    bundle = make_bundle(["true"], mutate=linux(sysctl={"kernel.pid_max": "4096"}))
    assert one_line_failure(runtime, bundle, "sysno") == \
        'paracell: sysctl "kernel.pid_max" is not in a separate kernel namespace'
    # The default spec has no network namespace: net.* would be the host's.
    bundle = make_bundle(["true"], mutate=linux(sysctl={"net.ipv4.ip_forward": "1"}))
    assert one_line_failure(runtime, bundle, "sysnet") == \
        'paracell: sysctl "net.ipv4.ip_forward" not allowed in host network namespace'


def test_sysctl_the_kernel_refuses_fails_the_create(runtime, make_bundle):
    bundle = make_bundle(["true"], mutate=linux(sysctl={"kernel.shmmax": "lots"}))
    line = one_line_failure(runtime, bundle, "sysbad")
    assert line.endswith("write /proc/sys/kernel/shmmax: Invalid argument"), line


def test_oom_score_adj_of_init_and_of_an_exec(runtime, make_bundle, tmp_path):
    # Lowering it needs CAP_SYS_RESOURCE: set before the uid change, as runc does.
    bundle = make_bundle(["sleep", "60"],
                         oomScoreAdj=-500, user={"uid": 1000, "gid": 1000})
    result = runtime("create", "--bundle", str(bundle), "oom")
    assert result.returncode == 0, result.stderr
    (tmp_path / "p.json").write_text(json.dumps(
        {"args": ["cat", "/proc/self/oom_score_adj"], "cwd": "/", "oomScoreAdj": 300}))
    runtime("start", "oom", check=True)
    result = runtime("exec", "--process", str(tmp_path / "p.json"), "oom")
    assert (result.returncode, result.stdout) == (0, b"300\n"), result.stderr
    result = runtime("exec", "oom", "cat", "/proc/1/oom_score_adj")
    assert (result.returncode, result.stdout) == (0, b"-500\n"), result.stderr
    # A bad field of an exec's process is the process file's, not config.json's.
    (tmp_path / "p.json").write_text(json.dumps({"args": ["true"], "cwd": "/",
                                                 "oomScoreAdj": 5000}))
    result = runtime("exec", "--process", str(tmp_path / "p.json"), "oom")
    assert result.returncode == 1 and result.stderr.decode() == (
        f"paracell: invalid --process {tmp_path / 'p.json'}: oomScoreAdj 5000 is out of range "
        "(-1000 to 1000)\n"), result.stderr
    runtime("delete", "--force", "oom", check=True)
    runtime.assert_no_leaks()


def test_readonly_paths_refuse_writes_and_keep_their_flags(runtime, make_bundle, writable_rootfs):
    script = ("touch /home/x; touch /tmp/x; echo 1 > /proc/sys/kernel/shmmax;"
              " touch /root/x && echo root-writable; grep ' /tmp ' /proc/mounts")
    bundle = make_bundle(["sh", "-c", f"({script}) 2>&1"], rootfs=writable_rootfs, readonly=False,
                         mutate=linux(readonlyPaths=["/home", "/tmp", "/proc/sys", "/no/such"]))
    lines = run_ok(runtime, bundle, "ro")
    assert lines[:4] == ["touch: /home/x: Read-only file system",
                         "touch: /tmp/x: Read-only file system",
                         "sh: can't create /proc/sys/kernel/shmmax: Read-only file system",
                         "root-writable"], lines
    # Two /tmp mounts: the spec's tmpfs, then its read-only bind on top.
    tmp = [ln.split()[3].split(",") for ln in lines[4:]]
    assert [o[:3] for o in tmp] == [["rw", "nosuid", "nodev"], ["ro", "nosuid", "nodev"]], lines
    assert not (writable_rootfs / "home" / "x").exists()


def test_masked_paths_read_empty(runtime, make_bundle):
    script = ("wc -c < /proc/version; ls -A /etc | wc -l; cat /etc/passwd;"
              " touch /etc/x; stat -c %t:%T /proc/version")
    bundle = make_bundle(["sh", "-c", f"({script}) 2>&1"],
                         mutate=linux(maskedPaths=["/proc/version", "/etc", "/no/such/file"]))
    assert run_ok(runtime, bundle, "mask") == [
        "0", "0", "cat: can't open '/etc/passwd': No such file or directory",
        "touch: /etc/x: Read-only file system", "1:3"]  # /dev/null's device numbers


def test_runcs_default_paths_apply(runtime, make_bundle):
    """The lists `runc spec` writes; this guest kernel lacks about half of
    those paths, which are skipped as runc skips them."""
    script = ("wc -c < /proc/timer_list; ls -A /proc/acpi | wc -l; ls -A /sys/firmware | wc -l;"
              " echo 1 > /proc/sys/kernel/shmmax;"
              " for p in bus fs irq sys; do grep \" /proc/$p \" /proc/mounts; done")
    bundle = make_bundle(["sh", "-c", f"({script}) 2>&1"],
                         mutate=linux(maskedPaths=RUNC_MASKED, readonlyPaths=RUNC_READONLY))
    lines = run_ok(runtime, bundle, "rdef")
    assert lines[:4] == ["0", "0", "0",
                         "sh: can't create /proc/sys/kernel/shmmax: Read-only file system"], lines
    assert [(ln.split()[1], ln.split()[3].split(",")[0]) for ln in lines[4:]] == [
        (f"/proc/{p}", "ro") for p in ("bus", "fs", "irq", "sys")], lines
