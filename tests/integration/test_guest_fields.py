"""linux.seccomp, mount options and propagation, linux.devices, the user
namespace, process.ioPriority, linux.personality and a spec without a
process, in real micro-VMs: each effect is checked from inside the container,
as a conformance suite would, several per boot to keep the suite fast."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import cri_pod
from tests.integration.test_spec_fields import linux, one_line_failure, run_ok

pytestmark = pytest.mark.integration

ENOMSG = "No message of desired type"  # errno 42, an errnoRet no syscall returns by itself


def mountinfo_fields(lines: list[str], mount_point: str) -> list[str]:
    """The optional fields (shared:N, master:N, unbindable) and the mount options
    of the last mount at mount_point in a /proc/self/mountinfo listing."""
    found = [ln.split() for ln in lines if len(ln.split()) > 4 and ln.split()[4] == mount_point]
    assert found, (mount_point, lines)
    fields = found[-1]
    return fields[5].split(",") + fields[6:fields.index("-")]


# ---- seccomp ----

SECCOMP = {
    "defaultAction": "SCMP_ACT_ALLOW",
    "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
    "flags": ["SECCOMP_FILTER_FLAG_LOG"],
    "syscalls": [
        {"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO", "errnoRet": 42},
        # runc ignores names libseccomp does not know, and so does ParaCell.
        {"names": ["no_such_syscall_at_all"], "action": "SCMP_ACT_KILL"},
        # chmod to 0777 only: an argument comparison (chmod's mode, fchmodat's mode).
        {"names": ["chmod"], "action": "SCMP_ACT_ERRNO",
         "args": [{"index": 1, "value": 0o777, "op": "SCMP_CMP_EQ"}]},
        {"names": ["fchmodat"], "action": "SCMP_ACT_ERRNO",
         "args": [{"index": 2, "value": 0o777, "op": "SCMP_CMP_EQ"}]},
    ],
}
SECCOMP_SCRIPT = ("grep -E '^Seccomp(_filters)?:' /proc/self/status | tr -s '\\t ' ' ';"
                  " mkdir /tmp/d; touch /tmp/f; chmod 777 /tmp/f;"
                  " chmod 700 /tmp/f && echo chmod-ok")
# What SECCOMP_SCRIPT prints under SECCOMP.
SECCOMP_SEEN = [
    "Seccomp: 2", "Seccomp_filters: 1",
    f"mkdir: can't create directory '/tmp/d': {ENOMSG}",
    "chmod: /tmp/f: Operation not permitted", "chmod-ok"]


def test_seccomp_filters_init_and_exec(runtime, make_bundle):
    bundle = make_bundle(["sleep", "60"], mutate=linux(seccomp=SECCOMP))
    result = runtime("create", "--bundle", str(bundle), "sc")
    assert result.returncode == 0, result.stderr
    runtime("start", "sc", check=True)
    result = runtime("exec", "sc", "sh", "-c", f"({SECCOMP_SCRIPT}) 2>&1")
    assert result.stdout.decode().splitlines() == SECCOMP_SEEN, result.stderr
    # The init itself runs under the same filter.
    result = runtime("exec", "sc", "grep", "^Seccomp:", "/proc/1/status")
    assert result.stdout.split() == [b"Seccomp:", b"2"], result.stderr
    runtime("delete", "--force", "sc", check=True)
    runtime.assert_no_leaks()


def test_seccomp_without_no_new_privileges_and_errno_default(runtime, make_bundle):
    """Without noNewPrivileges runc loads the filter before the uid change
    (it needs CAP_SYS_ADMIN then); a non-root process still gets it."""
    profile = {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 42,
               "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO",
                             "errnoRet": 1}]}
    # podman's allow-list, less what needs a capability or another architecture.
    with open("/usr/share/containers/seccomp.json") as f:
        allowed = json.load(f)["syscalls"]
    for rule in allowed:
        includes = rule.get("includes") or {}
        if (rule["action"] == "SCMP_ACT_ALLOW" and not rule.get("args")
                and not includes.get("caps") and "amd64" in includes.get("arches", ["amd64"])):
            profile["syscalls"].append({"names": [n for n in rule["names"]
                                                  if n not in ("mkdir", "mkdirat")],
                                        "action": "SCMP_ACT_ALLOW"})
    # swapon needs CAP_SYS_ADMIN in podman's list: here it gets the default errno.
    bundle = make_bundle(["sh", "-c", "(grep ^Seccomp: /proc/self/status; mkdir /tmp/x;"
                                      " swapon /tmp; id -u) 2>&1"],
                         noNewPrivileges=False, user={"uid": 1000, "gid": 1000},
                         mutate=linux(seccomp=profile))
    lines = run_ok(runtime, bundle, "scnnp")
    assert [" ".join(ln.split()) for ln in lines] == [
        "Seccomp: 2", "mkdir: can't create directory '/tmp/x': Operation not permitted",
        f"swapon: /tmp: {ENOMSG}", "1000"], lines


def test_seccomp_notify_is_refused(runtime, make_bundle):
    profile = {"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": "/run/listener.sock",
               "syscalls": [{"names": ["mkdir"], "action": "SCMP_ACT_NOTIFY"}]}
    bundle = make_bundle(["true"], mutate=linux(seccomp=profile))
    line = one_line_failure(runtime, bundle, "scnotify")
    assert line.startswith("paracell: seccomp: SCMP_ACT_NOTIFY is not supported"), line


# ---- mounts ----

def test_mount_options_and_propagation(runtime, make_bundle, tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "file").write_text("data\n")

    def mutate(config):
        config["mounts"] += [
            {"destination": "/mnt/shared", "type": "tmpfs", "source": "tmpfs",
             "options": ["shared", "nosymfollow"]},
            {"destination": "/mnt/unbindable", "type": "tmpfs", "source": "tmpfs",
             "options": ["runbindable", "noatime"]},
            # A read-only recursive bind: runc's mount_setattr(rro).
            {"destination": "/mnt/rro", "type": "bind", "source": str(src),
             "options": ["rbind", "rro", "rnosuid"]},
            # bind + ro: a bind, then runc's MS_REMOUNT|MS_BIND|MS_RDONLY.
            {"destination": "/mnt/ro", "type": "none", "source": str(src),
             "options": ["bind", "ro", "nodev"]},
            # tmpcopyup: the tmpfs starts with what the read-only image has there.
            {"destination": "/etc", "type": "tmpfs", "source": "tmpfs",
             "options": ["tmpcopyup", "mode=755"]},
        ]
        config["linux"]["rootfsPropagation"] = "shared"

    script = ("cat /proc/self/mountinfo; echo ---; cd /mnt/shared && echo x > t && ln -s t l;"
              " cat l; touch /mnt/rro/x; touch /mnt/ro/x; cat /mnt/rro/file;"
              " grep -c root /etc/passwd; touch /etc/new && echo etc-writable")
    bundle = make_bundle(["sh", "-c", f"({script}) 2>&1"], mutate=mutate)
    lines = run_ok(runtime, bundle, "mnt")
    cut = lines.index("---")
    info, out = lines[:cut], lines[cut + 1:]
    assert any(f.startswith("shared:") for f in mountinfo_fields(info, "/")), info
    shared = mountinfo_fields(info, "/mnt/shared")
    assert "nosymfollow" in shared and any(f.startswith("shared:") for f in shared), shared
    unbindable = mountinfo_fields(info, "/mnt/unbindable")
    assert "unbindable" in unbindable and "noatime" in unbindable, unbindable
    rro = mountinfo_fields(info, "/mnt/rro")
    assert rro[0] == "ro" and "nosuid" in rro, rro
    assert mountinfo_fields(info, "/mnt/ro")[:1] == ["ro"], info
    assert "nodev" in mountinfo_fields(info, "/mnt/ro"), info
    assert out == ["cat: can't open 'l': Too many levels of symbolic links",
                   "touch: /mnt/rro/x: Read-only file system",
                   "touch: /mnt/ro/x: Read-only file system", "data", "1", "etc-writable"], out
    assert not (src / "x").exists()


def test_mount_type_the_guest_lacks_is_refused(runtime, make_bundle):
    def mutate(config):
        config["mounts"].append({"destination": "/data", "type": "ext4", "source": "/dev/sdb1"})
    bundle = make_bundle(["true"], mutate=mutate)
    line = one_line_failure(runtime, bundle, "ext4")
    assert line.startswith("paracell: invalid config.json: mounts[6].type 'ext4' is not "
                           "supported in the guest"), line


# ---- devices ----

def test_devices_are_made_in_dev(runtime, make_bundle):
    devices = [
        {"path": "/dev/mynull", "type": "c", "major": 1, "minor": 3, "fileMode": 0o622,
         "uid": 1000, "gid": 2000},
        {"path": "/dev/sub/zero", "type": "u", "major": 1, "minor": 5},
        {"path": "/dev/fifo", "type": "p"},
        # A spec device takes the place of runc's default one.
        {"path": "/dev/full", "type": "c", "major": 1, "minor": 7, "fileMode": 0o600},
    ]
    script = ("stat -c '%n %F %t:%T %a %u:%g' /dev/mynull /dev/sub/zero /dev/fifo /dev/full"
              " /dev/null /dev/zero /dev/random /dev/urandom /dev/tty;"
              " echo hi > /dev/mynull && head -c 5 /dev/sub/zero | wc -c; readlink /dev/ptmx")
    bundle = make_bundle(["sh", "-c", f"({script}) 2>&1"], mutate=linux(devices=devices))
    assert run_ok(runtime, bundle, "dev") == [
        "/dev/mynull character special file 1:3 622 1000:2000",
        "/dev/sub/zero character special file 1:5 666 0:0",
        "/dev/fifo fifo 0:0 666 0:0",
        "/dev/full character special file 1:7 600 0:0",
        "/dev/null character special file 1:3 666 0:0",
        "/dev/zero character special file 1:5 666 0:0",
        "/dev/random character special file 1:8 666 0:0",
        "/dev/urandom character special file 1:9 666 0:0",
        "/dev/tty character special file 5:0 666 0:0",
        "5", "pts/ptmx"]


# ---- user namespace ----

def test_user_namespace_maps_ids(runtime, make_bundle, writable_rootfs, tmp_path):
    """podman chowns an image to the mapped ids on the host; so does this
    test.  Through 9p the guest sees host ids, which the map turns back."""
    for top, dirs, files in os.walk(writable_rootfs):
        for name in [*dirs, *files]:
            os.lchown(os.path.join(top, name), 100000, 100000)
    os.lchown(writable_rootfs, 100000, 100000)

    def mutate(config):
        config["linux"]["namespaces"].append({"type": "user"})
        config["linux"]["uidMappings"] = [{"containerID": 0, "hostID": 100000, "size": 65536}]
        config["linux"]["gidMappings"] = [{"containerID": 0, "hostID": 100000, "size": 1000},
                                          {"containerID": 1000, "hostID": 200000, "size": 10}]
        config["linux"]["maskedPaths"] = ["/proc/version"]

    caps = ["CAP_SYS_ADMIN", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_SETUID",
            "CAP_SETGID"]
    bundle = make_bundle(["sleep", "60"], rootfs=writable_rootfs, readonly=False, mutate=mutate,
                         capabilities={k: caps for k in ("bounding", "effective", "permitted")})
    result = runtime("create", "--bundle", str(bundle), "uns")
    assert result.returncode == 0, result.stderr
    runtime("start", "uns", check=True)
    # As under runc, the container's root owns its mount and UTS namespaces:
    # with CAP_SYS_ADMIN it may mount and set the hostname, but a masked path
    # stays masked (its mount is locked), and the VM's sysctls stay out of reach.
    script = ("cat /proc/self/uid_map /proc/self/gid_map; id -u; stat -c %u:%g /bin/busybox;"
              " touch /made-inside && echo made; hostname changed && hostname;"
              " mount -t tmpfs t /tmp && echo mounted; umount /proc/version;"
              " echo 1 > /proc/sys/kernel/pid_max; cat /proc/1/uid_map")
    result = runtime("exec", "uns", "sh", "-c", f"({script}) 2>&1")
    lines = [" ".join(ln.split()) for ln in result.stdout.decode().splitlines()]
    assert lines[:8] == ["0 100000 65536", "0 100000 1000", "1000 200000 10", "0", "0:0", "made",
                         "changed", "mounted"], (lines, result.stderr)
    assert lines[8:10] == ["umount: can't unmount /proc/version: Invalid argument",
                           "sh: can't create /proc/sys/kernel/pid_max: Permission denied"], lines
    assert lines[10] == "0 100000 65536"
    st = os.stat(writable_rootfs / "made-inside")
    assert (st.st_uid, st.st_gid) == (100000, 100000)
    runtime("delete", "--force", "uns", check=True)
    runtime.assert_no_leaks()


def test_a_user_namespace_entry_without_maps_is_a_new_namespace(runtime, make_bundle):
    """{"type": "user"} alone: ids unchanged, but root's privilege is the new
    namespace's, so a device node (CAP_MKNOD in the VM's initial namespace)
    cannot be made, while without the entry it can."""
    script = "cat /proc/self/uid_map; id -u; mknod /dev/pc-null c 1 3 && echo made-node"
    caps = {k: ["CAP_MKNOD", "CAP_SETUID", "CAP_SETGID"] for k in
            ("bounding", "effective", "permitted")}

    def userns(config):
        config["linux"]["namespaces"].append({"type": "user"})

    outputs = {}
    for name, mutate in (("own", userns), ("initial", None)):
        ran = runtime("run", "--bundle", str(make_bundle(["sh", "-c", f"({script}) 2>&1"],
                                                         mutate=mutate, capabilities=caps)),
                      f"uns-{name}")
        outputs[name] = [" ".join(ln.split()) for ln in ran.stdout.decode().splitlines()]
    assert outputs["own"][:2] == ["0 0 4294967295", "0"], outputs
    assert "made-node" not in outputs["own"] and "Operation not permitted" in outputs["own"][2]
    assert outputs["initial"] == ["0 0 4294967295", "0", "made-node"], outputs
    runtime.assert_no_leaks()


# ---- ioPriority and personality ----

def test_io_priority_and_personality(runtime, make_bundle, tmp_path):
    bundle = make_bundle(["sleep", "60"], ioPriority={"class": "IOPRIO_CLASS_RT", "priority": 3},
                         mutate=linux(personality={"domain": "LINUX32"}))
    result = runtime("create", "--bundle", str(bundle), "prio")
    assert result.returncode == 0, result.stderr
    runtime("start", "prio", check=True)
    (tmp_path / "p.json").write_text(json.dumps(
        {"args": ["sh", "-c", "ionice; ionice -p 1; uname -m"], "cwd": "/",
         "ioPriority": {"class": "IOPRIO_CLASS_IDLE", "priority": 0}}))
    result = runtime("exec", "--process", str(tmp_path / "p.json"), "prio")
    # The exec's own class; the init's class; an exec has the default personality.
    assert result.stdout.decode().splitlines() == ["idle", "realtime: prio 3", "x86_64"], \
        result.stderr
    result = runtime("exec", "prio", "sh", "-c", "cat /proc/1/personality")
    assert result.stdout.strip() == b"00000008", result.stderr
    runtime("delete", "--force", "prio", check=True)
    runtime.assert_no_leaks()


def test_personality_linux32_uname(runtime, make_bundle):
    bundle = make_bundle(["uname", "-m"], mutate=linux(personality={"domain": "LINUX32"}))
    assert run_ok(runtime, bundle, "p32") == ["i686"]


# ---- a spec without a process ----

def test_spec_without_process_creates_and_start_fails(runtime, make_bundle):
    bundle = make_bundle(["true"])
    config = json.loads((bundle / "config.json").read_text())
    del config["process"]
    (bundle / "config.json").write_text(json.dumps(config))
    result = runtime("create", "--bundle", str(bundle), "noproc")
    assert result.returncode == 0, result.stderr
    state = json.loads(runtime("state", "noproc", check=True).stdout)
    assert state["status"] == "created" and state["pid"] > 0
    result = runtime("start", "noproc")
    assert result.returncode != 0
    assert result.stderr.decode().strip() == \
        "paracell: cannot start container noproc: process property must not be empty"
    # As runc: a start that failed leaves the container stopped, here with
    # its VM gone.
    after = json.loads(runtime("state", "noproc", check=True).stdout)
    assert (after["status"], after["pid"]) == ("stopped", 0)
    assert runtime.qemu_processes() == []
    result = runtime("exec", "noproc", "true")
    assert result.stderr.decode().strip() == "paracell: cannot exec in a stopped container"
    assert runtime("start", "noproc").stderr.decode().strip() == \
        "paracell: cannot start a container that has stopped"
    runtime("delete", "noproc", check=True)
    runtime.assert_no_leaks()


def test_device_never_lands_on_the_host(runtime, make_bundle, busybox_rootfs):
    """A directory of the image bound under /dev is the host's, through 9p: a
    node made there would be a device node on the host."""
    def mutate(config):
        config["mounts"].append({"destination": "/dev/sub", "type": "bind",
                                 "source": str(busybox_rootfs / "etc"), "options": ["rbind"]})
        config["linux"]["devices"] = [{"path": "/dev/sub/evil", "type": "c", "major": 1,
                                       "minor": 3}]
    line = one_line_failure(runtime, make_bundle(["true"], mutate=mutate), "devhost")
    assert line.endswith("create device /dev/sub/evil: /dev/sub is not the container's /dev "
                         "filesystem"), line
    assert not (busybox_rootfs / "etc" / "evil").exists()


def test_seccomp_filters_a_pod_member(runtime, make_bundle):
    """A pod member's init reaches the pod's VM through a proxy, which sends
    its seccomp program just before its SPEC (docs/pods.md)."""
    sandbox = make_bundle(["sleep", "60"], mutate=cri_pod("sandbox", "scpod"))
    runtime("create", "--bundle", str(sandbox), "scpod", check=True)
    try:
        runtime("start", "scpod", check=True)

        def member(config):
            linux(seccomp=SECCOMP)(config)
            cri_pod("container", "scpod")(config)
        bundle = make_bundle(["sh", "-c", f"({SECCOMP_SCRIPT}) 2>&1"], mutate=member)
        result = runtime("run", "--bundle", str(bundle), "scmember")
        assert result.stdout.decode().splitlines() == SECCOMP_SEEN, result.stderr
        # The sandbox itself runs unfiltered: the program was the member's alone.
        seen = runtime("exec", "scpod", "grep", "^Seccomp:", "/proc/self/status")
        assert seen.stdout.split() == [b"Seccomp:", b"0"], seen.stderr
    finally:
        runtime("delete", "--force", "scpod")
    runtime.assert_no_leaks()
