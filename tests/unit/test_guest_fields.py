"""Mount options, linux.devices, the user namespace, ioPriority, personality,
LSM labels, linux.seccomp and a spec without process, on the host: hostile
values refused with one line (runc's wording where it has one), good ones
turned into the agent's records and the PC_SECCOMP payload."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess

import pytest
from paracell._native import lib

from paracell.errors import ParacellError
from paracell.runtime.bundle import defaultspec, spec
from paracell.runtime.inguest import guestfields, mountopts, seccomp
from tests.unit.test_spec import records, write
from tests.unit.test_spec_fields import launch, linux, refused

MS_REC, MS_PRIVATE, MS_SHARED, MS_SLAVE = 0x4000, 1 << 18, 1 << 20, 1 << 19


def mounts(recs: list[tuple[str, str]]) -> list[list[str]]:
    return [v.split("\x1f") for k, v in recs if k == "mount"]


# ---- mount options ----

def test_every_option_runc_lists_is_known():
    """runc 1.1.5's `runc features` list (Debian's runc), here or live."""
    runc_list = ["acl", "async", "atime", "bind", "defaults", "dev", "diratime", "dirsync",
                 "exec", "iversion", "lazytime", "loud", "mand", "noacl", "noatime", "nodev",
                 "nodiratime", "noexec", "noiversion", "nolazytime", "nomand", "norelatime",
                 "nostrictatime", "nosuid", "nosymfollow", "private", "ratime", "rbind", "rdev",
                 "rdiratime", "relatime", "remount", "rexec", "rnoatime", "rnodev",
                 "rnodiratime", "rnoexec", "rnorelatime", "rnostrictatime", "rnosuid",
                 "rnosymfollow", "ro", "rprivate", "rrelatime", "rro", "rrw", "rshared",
                 "rslave", "rstrictatime", "rsuid", "rsymfollow", "runbindable", "rw", "shared",
                 "silent", "slave", "strictatime", "suid", "symfollow", "sync", "tmpcopyup",
                 "unbindable"]
    if shutil.which("runc"):
        live = subprocess.run(["runc", "features"], capture_output=True, text=True)
        if live.returncode == 0:
            runc_list = json.loads(live.stdout)["mountOptions"]
    assert mountopts.option_names() == sorted(runc_list)
    for opt in runc_list:
        assert mountopts.parse([opt], "m").data == [], opt


def test_mount_records_carry_propagation_attributes_and_copyup(tmp_path):
    def mutate(config):
        config["mounts"] = [
            {"destination": "/a", "type": "tmpfs", "source": "tmpfs",
             "options": ["ro", "rw", "nosymfollow", "rshared", "private", "size=1m"]},
            {"destination": "/b", "type": "tmpfs", "source": "tmpfs",
             "options": ["rro", "rnoatime", "rrelatime", "rsuid", "tmpcopyup", "defaults"]},
            {"destination": "/c", "type": "bind", "source": str(tmp_path),
             "options": ["rbind", "rslave", "tmpcopyup"]},
        ]
    recs = launch(tmp_path, mutate)
    a, b, c = mounts(recs)
    # rw overrides ro; the last propagation option wins, as runc applies them in turn.
    assert a[1:] == ["tmpfs", "tmpfs", str(0x100), "size=1m", str(MS_PRIVATE), "0", "0", "0"]
    assert b[3:] == ["0", "", "0", str(0x1 | 0x10 | 0x0), str(0x70 | 0x2), "1"]
    # tmpcopyup means nothing for a bind, as in runc.
    assert c[1] == "bind" and c[3:] == [str(0x1000 | MS_REC), "", str(MS_SLAVE | MS_REC),
                                        "0", "0", "0"]


@pytest.mark.parametrize("mount, message", [
    ({"destination": "/x", "type": "ext4", "source": "/dev/sda"},
     "mounts[6].type 'ext4' is not supported in the guest"),
    ({"destination": "/x", "type": "overlay", "source": "overlay"},
     "mounts[6].type 'overlay' is not supported in the guest"),
    ({"destination": "/x", "type": "tmpfs", "options": ["idmap"]},
     "mounts[6].options 'idmap': id-mapped mounts are not supported"),
])
def test_mounts_the_guest_cannot_make_are_refused(tmp_path, mount, message):
    assert message in refused(tmp_path, lambda c: c["mounts"].append(mount))


def test_rootfs_propagation(tmp_path):
    recs = launch(tmp_path, linux(rootfsPropagation="rslave"))
    assert ("root.propagation", str(MS_SLAVE | MS_REC)) in recs
    assert "rootfsPropagation 'bogus' is not one of" in \
        refused(tmp_path, linux(rootfsPropagation="bogus"))


# ---- devices ----

def test_devices_records_and_bounds(tmp_path):
    devs = [{"path": "/dev/net/../tun", "type": "u", "major": 10, "minor": 200},
            {"path": "/dev/fifo", "type": "p", "fileMode": 0o10640, "uid": 5, "gid": 6}]
    recs = launch(tmp_path, linux(devices=devs))
    assert [v.split("\x1f") for k, v in recs if k == "device"] == [
        ["/dev/tun", "c", "10", "200", "666", "0", "0"],
        ["/dev/fifo", "p", "0", "0", "640", "5", "6"]]


@pytest.mark.parametrize("dev, message", [
    ({"path": "/etc/x", "type": "c", "major": 1, "minor": 3}, "under /dev"),
    ({"path": "/dev/../etc/x", "type": "c", "major": 1, "minor": 3}, "under /dev"),
    ({"path": "dev/x", "type": "c", "major": 1, "minor": 3}, "under /dev"),
    ({"path": "/dev/x", "type": "x", "major": 1, "minor": 3}, "is not one of c, b, u, p"),
    ({"path": "/dev/x", "type": "c", "minor": 3}, "major must be of type int"),
    ({"path": "/dev/x", "type": "c", "major": 4096, "minor": 3}, "out of range"),
    ({"path": "/dev/x", "type": "b", "major": 1, "minor": 1 << 20}, "out of range"),
    ({"path": "/dev/x", "type": "c", "major": 1, "minor": 3, "fileMode": -1}, "out of range"),
    ({"path": "/dev/x", "type": "c", "major": 1, "minor": 3, "uid": 2**32}, "out of range"),
    ({"path": "/dev/x\x1fy", "type": "c", "major": 1, "minor": 3}, "under /dev"),
])
def test_hostile_devices_are_refused(tmp_path, dev, message):
    assert message in refused(tmp_path, linux(devices=[dev]))


def test_devices_need_a_dev_mount_and_are_bounded(tmp_path):
    def no_dev(config):
        config["mounts"] = [m for m in config["mounts"] if not m["destination"].startswith("/dev")]
        config["linux"]["devices"] = [{"path": "/dev/x", "type": "p"}]
    assert "linux.devices needs a /dev mount" in refused(tmp_path, no_dev)
    many = [{"path": f"/dev/p{i}", "type": "p"} for i in range(257)]
    assert "linux.devices has more than 256 entries" in refused(tmp_path, linux(devices=many))


# ---- user namespace ----

def userns(uid_map, gid_map=None):
    def mutate(config):
        config["linux"]["namespaces"].append({"type": "user"})
        config["linux"]["uidMappings"] = uid_map
        config["linux"]["gidMappings"] = uid_map if gid_map is None else gid_map
    return mutate


def test_userns_records(tmp_path):
    recs = launch(tmp_path, userns([{"containerID": 0, "hostID": 1000, "size": 1},
                                    {"containerID": 1, "hostID": 100000, "size": 65535}]))
    assert [r for r in recs if r[0] in ("userns", "uidmap")] == [
        ("userns", "1"), ("uidmap", "0 1000 1"), ("uidmap", "1 100000 65535")]


@pytest.mark.parametrize("entry, message", [
    ({"containerID": 0, "hostID": 0, "size": 0}, "size must be at least 1"),
    ({"containerID": 2**32 - 2, "hostID": 0, "size": 2}, "within 32 bits"),
    ({"containerID": -1, "hostID": 0, "size": 1}, "out of range"),
    ({"containerID": 0, "hostID": "0", "size": 1}, "hostID must be of type int"),
    ({"containerID": 0, "hostID": 0, "size": True}, "size must be an integer"),
])
def test_hostile_id_maps_are_refused(tmp_path, entry, message):
    assert message in refused(tmp_path, userns([entry]))


def test_id_maps_bounded_as_the_kernel(tmp_path):
    lines = [{"containerID": i, "hostID": i, "size": 1} for i in range(341)]
    assert "uidMappings has more than 340 entries" in refused(tmp_path, userns(lines))
    big = [{"containerID": 4000000000 + i, "hostID": 4000000000 + i, "size": 1}
           for i in range(200)]
    assert "longer than the kernel takes in one write" in refused(tmp_path, userns(big))


def test_a_user_namespace_without_maps_maps_every_id_onto_itself(tmp_path):
    """The OCI spec: a namespace entry without a path is a new namespace."""
    recs = launch(tmp_path, userns([]))
    assert [r for r in recs if r[0] in ("userns", "uidmap", "gidmap")] == [
        ("userns", "1"), ("uidmap", "0 0 4294967295"), ("gidmap", "0 0 4294967295")]


def test_userns_rules_with_runcs_wording(tmp_path):
    assert refused(tmp_path, userns([], [{"containerID": 0, "hostID": 1, "size": 1}])) == \
        "User namespaces enabled, but no uid mappings found."
    assert refused(tmp_path, userns([{"containerID": 0, "hostID": 1, "size": 1}], [])) == \
        "User namespaces enabled, but no gid mappings found."

    def with_path(config):
        userns([{"containerID": 0, "hostID": 1, "size": 1}])(config)
        config["linux"]["namespaces"][-1]["path"] = "/proc/1/ns/user"
    assert "cannot join user namespace /proc/1/ns/user" in refused(tmp_path, with_path)

    def maps_only(config):
        config["linux"]["uidMappings"] = [{"containerID": 0, "hostID": 1, "size": 1}]
    config = defaultspec.default_config()
    maps_only(config)
    bundle = spec.load_bundle(write(tmp_path / "m", config))
    assert not any(k == "userns" for k, _ in records(spec.init_launch_spec("c1", bundle)))
    assert "ignored without a user namespace" in bundle.warnings[0]


# ---- ioPriority, personality, LSM labels ----

def test_io_priority(tmp_path):
    recs = launch(tmp_path, lambda c: c["process"].update(
        ioPriority={"class": "IOPRIO_CLASS_BE", "priority": 7}))
    assert ("ioprio", "2 7") in recs
    assert spec.exec_launch_spec("c1", {"args": ["x"], "ioPriority": {
        "class": "IOPRIO_CLASS_IDLE"}}).count(b"ioprio=3 0\0") == 1
    for prio, message in (({"class": "IOPRIO_CLASS_NONE"}, "is not one of"),
                          ({"class": "IOPRIO_CLASS_RT", "priority": 8}, "out of range"),
                          ({"class": "IOPRIO_CLASS_RT", "priority": -1}, "out of range"),
                          ("high", "ioPriority must be of type dict")):
        assert message in refused(tmp_path, lambda c, p=prio: c["process"].update(ioPriority=p))


def test_personality(tmp_path):
    assert ("personality", "8") in launch(tmp_path, linux(personality={"domain": "LINUX32"}))
    assert "is not LINUX or LINUX32" in refused(tmp_path, linux(personality={"domain": "X"}))
    config = defaultspec.default_config()
    config["linux"]["personality"] = {"domain": "LINUX", "flags": ["ADDR_NO_RANDOMIZE"]}
    bundle = spec.load_bundle(write(tmp_path / "p", config))
    assert bundle.warnings == ["ignoring unsupported personality flags: ['ADDR_NO_RANDOMIZE']"]


def test_lsm_labels_refused_where_runc_fails_and_warned_where_it_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(guestfields, "_host_has_apparmor", lambda: False)
    monkeypatch.setattr(guestfields, "_host_has_selinux", lambda: False)
    assert "AppArmor is not enabled on this host" in refused(
        tmp_path, lambda c: c["process"].update(apparmorProfile="runc-default"))
    assert refused(tmp_path, lambda c: c["process"].update(selinuxLabel="a:b:c:s0")) == \
        guestfields.SELINUX_REFUSED
    assert refused(tmp_path, linux(mountLabel="a:b:c:s0")) == guestfields.SELINUX_REFUSED
    with pytest.raises(ParacellError, match="AppArmor"):
        spec.check_process({"args": ["x"], "apparmorProfile": "p"})
    monkeypatch.setattr(guestfields, "_host_has_apparmor", lambda: True)
    monkeypatch.setattr(guestfields, "_host_has_selinux", lambda: True)
    config = defaultspec.default_config()
    config["process"].update(apparmorProfile="p", selinuxLabel="a:b:c:s0")
    bundle = spec.load_bundle(write(tmp_path / "w", config))
    assert [w.split(" is not applied")[0] for w in bundle.warnings] == [
        "apparmor profile 'p'", "process.selinuxLabel 'a:b:c:s0'"]


# ---- a spec without process ----

def test_spec_without_process_has_no_launch_spec(tmp_path):
    config = defaultspec.default_config()
    del config["process"]
    bundle = spec.load_bundle(write(tmp_path / "n", config))
    assert spec.init_launch_spec("c1", bundle) == b""


# ---- seccomp ----

def payload_count(payload: bytes) -> tuple[int, int]:
    flags, count = struct.unpack_from("<II", payload)
    assert len(payload) == lib.PC_SECCOMP_HDR_LEN + 8 * count
    return flags, count


def test_seccomp_compiles_and_marks_the_spec(tmp_path):
    profile = {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38,
               "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86"],
               "flags": ["SECCOMP_FILTER_FLAG_LOG", "SECCOMP_FILTER_FLAG_SPEC_ALLOW",
                         "SECCOMP_FILTER_FLAG_TSYNC"],
               "syscalls": [{"names": ["read", "write", "no_such_call"],
                             "action": "SCMP_ACT_ALLOW"},
                            {"names": ["personality"], "action": "SCMP_ACT_ALLOW",
                             "args": [{"index": 0, "value": 8, "op": "SCMP_CMP_EQ"},
                                      {"index": 0, "value": 0, "op": "SCMP_CMP_EQ"}]},
                            # the default action again: skipped, as runc does
                            {"names": ["mkdir"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}]}
    config = defaultspec.default_config()
    config["linux"]["seccomp"] = profile
    bundle = spec.load_bundle(write(tmp_path / "s", config))
    assert ("seccomp", "1") in records(spec.init_launch_spec("c1", bundle))
    flags, count = payload_count(bundle.seccomp)
    assert flags == lib.PC_SECCOMP_FLAG_LOG | lib.PC_SECCOMP_FLAG_SPEC_ALLOW
    assert 10 < count < 100


def test_podmans_profile_fits():
    with open("/usr/share/containers/seccomp.json") as f:
        source = json.load(f)
    profile = {"defaultAction": source["defaultAction"],
               "defaultErrnoRet": source["defaultErrnoRet"],
               "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
               "syscalls": [{k: r[k] for k in ("names", "action", "args", "errnoRet") if k in r}
                            for r in source["syscalls"]]}
    _, count = payload_count(seccomp.compile_profile(profile))
    assert count <= lib.PC_SECCOMP_MAX_INSNS


@pytest.mark.parametrize("profile, message", [
    ({"defaultAction": "SCMP_ACT_NOPE"}, "is not a seccomp action"),
    ({}, "defaultAction must be of type str"),
    ({"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 65536}, "out of range"),
    ({"defaultAction": "SCMP_ACT_ALLOW", "flags": ["SECCOMP_FILTER_FLAG_NEW_LISTENER"]},
     "seccomp flags 'SECCOMP_FILTER_FLAG_NEW_LISTENER' not yet supported by paracell"),
    ({"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_Z80"]},
     "string SCMP_ARCH_Z80 is not a valid arch for seccomp"),
    ({"defaultAction": "SCMP_ACT_NOTIFY"}, "SCMP_ACT_NOTIFY is not supported"),
    ({"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": "/x"}, "SCMP_ACT_NOTIFY"),
    ({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": [], "action": "SCMP_ACT_KILL"}]},
     "names must have 1 to"),
    ({"defaultAction": "SCMP_ACT_ALLOW",
      "syscalls": [{"names": ["read"], "action": "SCMP_ACT_KILL",
                    "args": [{"index": 6, "op": "SCMP_CMP_EQ"}]}]},
     "index 6 is out of range"),
    ({"defaultAction": "SCMP_ACT_ALLOW",
      "syscalls": [{"names": ["read"], "action": "SCMP_ACT_KILL",
                    "args": [{"index": 0, "op": "SCMP_CMP_XX"}]}]},
     "is not a seccomp comparison"),
    ({"defaultAction": "SCMP_ACT_ALLOW",
      "syscalls": [{"names": ["read"], "action": "SCMP_ACT_KILL",
                    "args": [{"index": 0, "op": "SCMP_CMP_EQ", "value": 2**64}]}]},
     "out of range"),
    ({"defaultAction": "SCMP_ACT_ALLOW",
      "syscalls": [{"names": ["read"], "action": "SCMP_ACT_KILL"}] * 4097}, "more than 4096"),
])
def test_hostile_seccomp_profiles_are_refused(profile, message):
    with pytest.raises(ParacellError) as caught:
        seccomp.compile_profile(profile)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_program_over_the_kernels_limit_is_refused():
    # 3000 comparisons of 64-bit values (two words each): far over 4096 instructions.
    rules = [{"names": ["ioctl"], "action": "SCMP_ACT_ALLOW",
              "args": [{"index": 1, "value": v << 32 | v, "op": "SCMP_CMP_EQ"}]}
             for v in range(3000)]
    with pytest.raises(ParacellError, match="the kernel takes at most 4096"):
        seccomp.compile_profile({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": rules})
