"""config.json validation and the launch-spec records the agent reads."""

from __future__ import annotations

import json

import pytest

from paracell.errors import ParacellError
from paracell.runtime.bundle import defaultspec, spec


def write(bundle, config):
    bundle.mkdir(exist_ok=True)
    (bundle / "rootfs").mkdir(exist_ok=True)
    (bundle / "config.json").write_text(json.dumps(config))
    return bundle


def records(payload: bytes) -> list[tuple[str, str]]:
    return [tuple(r.split("=", 1)) for r in payload.decode().split("\0") if r]


def test_default_config_round_trips(tmp_path):
    bundle = spec.load_bundle(write(tmp_path / "b", defaultspec.default_config(["sh", "-c", "x"])))
    recs = records(spec.init_launch_spec("c1", bundle))
    assert recs[:5] == [("container", "c1"), ("role", "init"), ("arg", "sh"), ("arg", "-c"),
                       ("arg", "x")]
    assert ("root.readonly", "1") in recs and ("nnp", "1") in recs
    assert ("rlimit", "7 1024 1024") in recs
    caps = dict(r for r in recs if r[0].startswith("cap."))
    assert int(caps["cap.bounding"], 16) == (1 << 29) | (1 << 5) | (1 << 10)
    mounts = [r[1].split("\x1f") for r in recs if r[0] == "mount"]
    assert mounts[0][:3] == ["/proc", "proc", "proc"]
    sysfs = next(m for m in mounts if m[0] == "/sys")
    assert int(sysfs[3]) & 0x1  # ro became MS_RDONLY


def _cap_masks(tmp_path, capabilities) -> tuple[dict[str, int], list[str]]:
    config = defaultspec.default_config()
    config["process"]["capabilities"] = capabilities
    bundle = spec.load_bundle(write(tmp_path / "b", config))
    recs = records(spec.init_launch_spec("c1", bundle))
    return {k: int(v, 16) for k, v in recs if k.startswith("cap.")}, bundle.warnings


def test_absent_capability_sets_are_empty(tmp_path):
    """containerd writes `"capabilities": {}` when a pod drops ALL: every set
    must then be sent, and empty, or the process keeps every capability."""
    masks, _ = _cap_masks(tmp_path, {})
    assert masks == {f"cap.{k}": 0 for k in spec.CAP_SETS}
    masks, _ = _cap_masks(tmp_path, {"bounding": ["CAP_KILL"], "effective": None})
    assert masks["cap.bounding"] == 1 << 5
    assert masks["cap.effective"] == masks["cap.permitted"] == masks["cap.ambient"] == 0


@pytest.mark.parametrize("absent", [True, False], ids=["absent", "null"])
def test_no_capabilities_object_is_no_capability(tmp_path, absent):
    """runc 1.1.5, checked on this host: a process without `capabilities`,
    or with null, runs with every set empty."""
    config = defaultspec.default_config()
    if absent:
        del config["process"]["capabilities"]
    else:
        config["process"]["capabilities"] = None
    recs = records(spec.init_launch_spec("c1", spec.load_bundle(write(tmp_path / "b", config))))
    assert {k: int(v, 16) for k, v in recs if k.startswith("cap.")} == {
        f"cap.{k}": 0 for k in spec.CAP_SETS}


def test_unknown_capability_is_ignored_with_a_warning(tmp_path):
    masks, warnings = _cap_masks(tmp_path, {"bounding": ["CAP_NOPE", "CAP_KILL", "KILL"]})
    assert masks["cap.bounding"] == 1 << 5
    assert warnings == ["ignoring unknown or unavailable capabilities: ['CAP_NOPE' 'KILL']"]
    assert spec.check_process({"args": ["sh"], "capabilities": {"ambient": ["CAP_X"]}}) == [
        "ignoring unknown or unavailable capabilities: ['CAP_X']"]


@pytest.mark.parametrize("dest", ["/../etc", "/a/../../b", "/.."])
def test_escaping_mount_destinations(tmp_path, dest):
    config = defaultspec.default_config()
    config["mounts"].append({"destination": dest, "type": "tmpfs", "source": "x"})
    with pytest.raises(ParacellError, match="escapes the container's rootfs"):
        spec.load_bundle(write(tmp_path / "b", config))


def test_inner_dotdot_that_stays_inside_is_fine(tmp_path):
    config = defaultspec.default_config()
    config["mounts"].append({"destination": "/a/../tmp2", "type": "tmpfs", "source": "x"})
    bundle = spec.load_bundle(write(tmp_path / "b", config))
    mounts = [r[1].split("\x1f") for r in records(spec.init_launch_spec("c1", bundle))
              if r[0] == "mount"]
    assert mounts[-1][:3] == ["/tmp2", "tmpfs", "x"]


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda c: c["process"].update(args=[]), "process.args must not be empty"),
        (lambda c: c["process"].update(args="sh"), "process.args must be of type list"),
        (lambda c: c["process"].update(env=["NOEQUALS"]), "is not NAME=value"),
        (lambda c: c["process"].update(cwd="relative"), "must be an absolute path"),
        (lambda c: c["process"].update(user={"uid": -1}), "out of range"),
        (lambda c: c["process"].update(user={"uid": True}), "must be an integer"),
        (lambda c: c["process"].update(user={"username": "bob"}), "unknown user"),
        (lambda c: c["process"].update(rlimits=[{"type": "RLIMIT_X", "soft": 1, "hard": 1}]),
         "not a known rlimit"),
        (lambda c: c["process"].update(rlimits=[{"type": "RLIMIT_NOFILE", "soft": 9, "hard": 1}]),
         "soft <= hard"),
        (lambda c: c["process"].update(capabilities={"bounding": "CAP_KILL"}),
         "process.capabilities.bounding must be of type list"),
        (lambda c: c.update(hostname="h" * 65), "longer than 64"),
        (lambda c: c["mounts"].append({"destination": "/x", "type": "nfs"}), "not supported"),
        (lambda c: c["mounts"].append({"destination": "x", "type": "tmpfs"}), "absolute path"),
        (lambda c: c.update(process="sh"), "process must be of type dict"),
        (lambda c: c["process"].update(args=["a\0b"]), "NUL byte"),
    ],
)
def test_invalid_configs(tmp_path, mutate, message):
    config = defaultspec.default_config()
    mutate(config)
    with pytest.raises(ParacellError, match=message):
        bundle = spec.load_bundle(write(tmp_path / "b", config))
        spec.init_launch_spec("c1", bundle)


def test_oversized_spec_is_refused(tmp_path):
    config = defaultspec.default_config(["x" * 70000])
    bundle = spec.load_bundle(write(tmp_path / "b", config))
    with pytest.raises(ParacellError, match="too large for the agent channel"):
        spec.init_launch_spec("c1", bundle)


def test_bind_sources_inside_and_outside_the_rootfs(tmp_path):
    outside = tmp_path / "hostfile"
    outside.write_text("x")
    config = defaultspec.default_config()
    config["mounts"] += [
        {"destination": "/inside", "type": "bind", "source": "rootfs/etc", "options": ["rbind"]},
        {"destination": "/etc/hosts", "type": "bind", "source": str(outside),
         "options": ["bind", "ro"]},
    ]
    bundle_dir = write(tmp_path / "b", config)
    (bundle_dir / "rootfs" / "etc").mkdir()
    bundle = spec.load_bundle(bundle_dir)
    mounts = [r[1].split("\x1f") for r in records(spec.init_launch_spec("c1", bundle))
              if r[0] == "mount"]
    assert mounts[-2][:3] == ["/inside", "bind", "/rootfs/etc"]
    assert mounts[-1][:3] == ["/etc/hosts", "bind", "/hostshare/0/hostfile"]
    assert bundle.host_binds == [spec.HostBind(outside.resolve(), "0")]


def test_missing_and_malformed_config(tmp_path):
    (tmp_path / "b").mkdir()
    with pytest.raises(ParacellError, match="no such file or directory"):
        spec.load_bundle(tmp_path / "b")
    (tmp_path / "b" / "config.json").write_text("{nope")
    with pytest.raises(ParacellError, match="not valid JSON"):
        spec.load_bundle(tmp_path / "b")


def root_config(path):
    config = defaultspec.default_config()
    config["root"]["path"] = str(path)
    return config


INVALID_ROOTFS = "^invalid rootfs: not an absolute path, or a symlink$"


def test_root_path_symlink_to_host_root_is_refused(tmp_path):
    """runc refuses a root.path that is a symlink: otherwise the share would be
    the host's / and the container would read the host's /etc."""
    bundle = write(tmp_path / "b", root_config("hostroot"))
    (bundle / "hostroot").symlink_to("/")
    with pytest.raises(ParacellError, match=INVALID_ROOTFS):
        spec.load_bundle(bundle)
    with pytest.raises(ParacellError, match=INVALID_ROOTFS):
        spec.load_bundle(write(tmp_path / "b", root_config(bundle / "hostroot")))


def test_root_path_through_a_symlinked_directory_is_refused(tmp_path):
    real = tmp_path / "real"
    (real / "rootfs").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(ParacellError, match=INVALID_ROOTFS):
        spec.load_bundle(write(tmp_path / "b", root_config(tmp_path / "link" / "rootfs")))
    # As runc's filepath.Abs, `..` is taken lexically first: this names real/rootfs.
    loaded = spec.load_bundle(write(tmp_path / "b", root_config(tmp_path / "link/../real/rootfs")))
    assert loaded.rootfs == real / "rootfs"


def test_real_root_paths_are_accepted(tmp_path):
    bundle = write(tmp_path / "b", root_config("rootfs"))
    assert spec.load_bundle(bundle).rootfs == bundle / "rootfs"
    loaded = spec.load_bundle(write(tmp_path / "b", root_config(bundle / "x/../rootfs")))
    assert loaded.rootfs == bundle / "rootfs"
    # A relative root.path is taken in the bundle's real directory, as runc
    # (which chdirs into the bundle) does, so a symlinked bundle path is fine.
    (tmp_path / "blink").symlink_to(bundle)
    assert spec.load_bundle(tmp_path / "blink").rootfs == bundle / "rootfs"


def test_root_path_that_is_missing_or_not_a_directory(tmp_path):
    with pytest.raises(ParacellError, match="does not exist"):
        spec.load_bundle(write(tmp_path / "b", root_config("nope")))
    (tmp_path / "b" / "file").write_text("")
    with pytest.raises(ParacellError, match="is not a directory"):
        spec.load_bundle(write(tmp_path / "b", root_config("file")))


def test_bind_sources_are_host_paths_resolved_on_the_host(tmp_path):
    """As with runc, a bind source's symlinks are followed on the host: one that
    leads into the rootfs becomes a rootfs path, one that leads out a hostshare."""
    outside = tmp_path / "outside"
    outside.mkdir()
    config = defaultspec.default_config()
    config["mounts"] += [
        {"destination": "/in", "type": "bind", "source": "rootfs/link-in", "options": ["bind"]},
        {"destination": "/out", "type": "bind", "source": "rootfs/link-out", "options": ["bind"]},
    ]
    bundle_dir = write(tmp_path / "b", config)
    (bundle_dir / "rootfs" / "data").mkdir()
    (bundle_dir / "rootfs" / "link-in").symlink_to("data")
    (bundle_dir / "rootfs" / "link-out").symlink_to(outside)
    bundle = spec.load_bundle(bundle_dir)
    mounts = [r[1].split("\x1f") for r in records(spec.init_launch_spec("c1", bundle))
              if r[0] == "mount"]
    assert mounts[-2][:3] == ["/in", "bind", "/rootfs/data"]
    assert mounts[-1][:3] == ["/out", "bind", "/hostshare/0/outside"]
    assert bundle.host_binds == [spec.HostBind(outside, "0")]
    assert bundle.mount_points[-2:] == [spec.MountPoint("/in", True, "/data"),
                                        spec.MountPoint("/out", True)]


def test_mount_points_follow_the_spec_in_order(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("")
    config = defaultspec.default_config()
    config["mounts"].append({"destination": "/etc//hosts/", "type": "none", "source": str(hostfile),
                             "options": ["rbind"]})
    bundle = spec.load_bundle(write(tmp_path / "b", config))
    spec.init_launch_spec("c1", bundle)
    assert [(p.dest, p.directory) for p in bundle.mount_points] == [
        ("/proc", True), ("/dev", True), ("/dev/pts", True), ("/dev/shm", True),
        ("/sys", True), ("/tmp", True), ("/etc/hosts", False)]


def test_duplicate_namespaces_are_refused_as_runc_does(tmp_path):
    config = defaultspec.default_config()
    config["linux"]["namespaces"] += [{"type": "network", "path": "/run/netns/a"},
                                      {"type": "network"}]
    with pytest.raises(ParacellError, match='^malformed spec file: duplicated ns {"network" ""}$'):
        spec.load_bundle(write(tmp_path / "b", config))
