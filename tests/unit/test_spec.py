"""config.json validation and the launch-spec records the agent reads."""

from __future__ import annotations

import json

import pytest

from paracell.errors import ParacellError
from paracell.runtime import defaultspec, spec


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
    assert recs[:4] == [("container", "c1"), ("arg", "sh"), ("arg", "-c"), ("arg", "x")]
    assert ("root.readonly", "1") in recs and ("nnp", "1") in recs
    assert ("rlimit", "7 1024 1024") in recs
    caps = dict(r for r in recs if r[0].startswith("cap."))
    assert int(caps["cap.bounding"], 16) == (1 << 29) | (1 << 5) | (1 << 10)
    mounts = [r[1].split("\x1f") for r in recs if r[0] == "mount"]
    assert mounts[0][:3] == ["/proc", "proc", "proc"]
    sysfs = next(m for m in mounts if m[0] == "/sys")
    assert int(sysfs[3]) & 0x1  # ro became MS_RDONLY


@pytest.mark.parametrize("dest", ["/../etc", "/a/../../b", "/.."])
def test_escaping_mount_destinations(tmp_path, dest):
    config = defaultspec.default_config()
    config["mounts"].append({"destination": dest, "type": "tmpfs", "source": "x"})
    with pytest.raises(ParacellError, match="escapes the container's rootfs"):
        spec.load_bundle(write(tmp_path / "b", config))


def test_inner_dotdot_that_stays_inside_is_fine(tmp_path):
    config = defaultspec.default_config()
    config["mounts"].append({"destination": "/a/../tmp2", "type": "tmpfs", "source": "x"})
    spec.load_bundle(write(tmp_path / "b", config))


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
        (lambda c: c["process"].update(capabilities={"bounding": ["CAP_NOPE"]}),
         "unknown capability"),
        (lambda c: c.update(hostname="h" * 65), "longer than 64"),
        (lambda c: c["mounts"].append({"destination": "/x", "type": "nfs"}), "not supported"),
        (lambda c: c["mounts"].append({"destination": "x", "type": "tmpfs"}), "absolute path"),
        (lambda c: c.update(process=None), "process must be of type dict"),
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
    assert mounts[-1][:3] == ["/etc/hosts", "bind", "/hostshare/0"]
    assert bundle.host_binds == [spec.HostBind(outside.resolve(), "0")]


def test_missing_and_malformed_config(tmp_path):
    (tmp_path / "b").mkdir()
    with pytest.raises(ParacellError, match="no such file or directory"):
        spec.load_bundle(tmp_path / "b")
    (tmp_path / "b" / "config.json").write_text("{nope")
    with pytest.raises(ParacellError, match="not valid JSON"):
        spec.load_bundle(tmp_path / "b")
