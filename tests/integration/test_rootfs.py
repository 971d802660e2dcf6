"""Rootfs checks and mount points, in real micro-VMs: mount points the image
lacks are made on the host before a read-only rootfs is shared, and a
symlinked root.path is refused as runc refuses it."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import cri_pod

pytestmark = pytest.mark.integration


def test_default_tmpfs_on_a_read_only_rootfs_without_tmp(runtime, make_bundle, writable_rootfs):
    """A busybox rootfs from a tarball has no /tmp; runc makes the mount point."""
    shutil.rmtree(writable_rootfs / "tmp")
    bundle = make_bundle(["sh", "-c", "grep ' /tmp ' /proc/mounts; touch /tmp/x && echo ok"],
                         rootfs=writable_rootfs, readonly=True)
    result = runtime("run", "--bundle", str(bundle), "rtmp")
    assert result.returncode == 0, result.stderr
    fields = result.stdout.decode().split()
    assert fields[1:3] == ["/tmp", "tmpfs"] and fields[-1] == "ok", fields
    assert (writable_rootfs / "tmp").is_dir()
    assert list((writable_rootfs / "tmp").iterdir()) == []  # the write went to the tmpfs
    runtime.assert_no_leaks()


@pytest.mark.both_vmms
def test_cri_file_binds_onto_a_read_only_rootfs_that_lacks_them(
        runtime, make_bundle, writable_rootfs, tmp_path):
    """containerd's CRI sandbox: read-only pause rootfs, no /etc/resolv.conf,
    /etc/hostname or /etc/hosts, each bind-mounted from a host file."""
    names = ("resolv.conf", "hostname", "hosts")
    host = tmp_path / "sandbox"
    host.mkdir()
    for name in names:
        (host / name).write_text(f"host's {name}\n")
        # A copy of the session's rootfs, where another test may have made them.
        (writable_rootfs / "etc" / name).unlink(missing_ok=True)

    def mounts(config):
        config["mounts"] += [
            {"destination": f"/etc/{name}", "type": "bind", "source": str(host / name),
             "options": ["rbind", "rprivate", "ro"]}
            for name in names
        ]

    bundle = make_bundle(["cat", *(f"/etc/{n}" for n in names)], rootfs=writable_rootfs,
                         readonly=True, mutate=mounts)
    result = runtime("run", "--bundle", str(bundle), "rcri")
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode() == "".join(f"host's {n}\n" for n in names)
    assert all((writable_rootfs / "etc" / n).read_text() == "" for n in names)
    runtime.assert_no_leaks()


def test_root_path_symlink_to_host_root_is_refused(runtime, make_bundle, tmp_path):
    link = tmp_path / "rootfs-link"
    link.symlink_to("/")
    bundle = make_bundle(["cat", "/etc/hostname"], rootfs=link)
    result = runtime("run", "--bundle", str(bundle), "rlink")
    assert result.returncode != 0
    assert result.stdout == b""
    lines = result.stderr.decode().strip().splitlines()
    assert lines == ["paracell: invalid rootfs: not an absolute path, or a symlink"], lines
    runtime.assert_no_leaks()


def test_mount_point_of_the_wrong_kind_fails_in_one_line(
        runtime, make_bundle, writable_rootfs, tmp_path):
    """An existing directory where a file is bound is left alone; the guest's
    mount then fails, as runc's does, with one line naming the mount."""
    (writable_rootfs / "etc" / "hosts").mkdir()
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n")
    bundle = make_bundle(["true"], rootfs=writable_rootfs, readonly=True, mutate=lambda c: c[
        "mounts"].append({"destination": "/etc/hosts", "type": "bind", "source": str(hosts),
                          "options": ["bind", "ro"]}))
    result = runtime("run", "--bundle", str(bundle), "rkind")
    assert result.returncode != 0
    lines = result.stderr.decode().strip().splitlines()
    assert lines == ["paracell: mount /etc/hosts: Not a directory"], lines
    assert (writable_rootfs / "etc" / "hosts").is_dir()
    runtime.assert_no_leaks()


def test_config_written_by_paracell_spec_runs_on_a_bare_rootfs(runtime, tmp_path, busybox_rootfs):
    """`paracell spec` then a rootfs with only /bin: every mount point is made."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    assert runtime("spec", "--bundle", str(bundle)).returncode == 0
    shutil.copytree(busybox_rootfs / "bin", bundle / "rootfs" / "bin", symlinks=True)
    config = json.loads((bundle / "config.json").read_text())
    config["process"]["args"] = ["sh", "-c", "cut -d' ' -f2 /proc/mounts | sort | tr '\\n' ' '"]
    (bundle / "config.json").write_text(json.dumps(config))
    result = runtime("run", "--bundle", str(bundle), "rspec")
    assert result.returncode == 0, result.stderr
    seen = result.stdout.decode().split()
    assert {"/proc", "/dev", "/dev/pts", "/dev/shm", "/sys", "/tmp"} <= set(seen), seen
    assert sorted(p.name for p in (bundle / "rootfs").iterdir()) == [
        "bin", "dev", "proc", "sys", "tmp"]
    runtime.assert_no_leaks()


@pytest.mark.parametrize("propagation", ["shared", "rshared", "slave", "rslave", "private",
                                         "rprivate", "unbindable", "runbindable"])
def test_a_host_bind_with_a_propagation_option_appears(runtime, make_bundle, tmp_path,
                                                       propagation):
    """runc mounts the bind and then sets that propagation on it; the guest's
    copy of the share can only propagate inside the VM (docs/runtime.md)."""
    host = tmp_path / "data"
    host.mkdir()
    (host / "file").write_text("from the host\n")
    bundle = make_bundle(
        ["sh", "-c", "cat /data/file; grep ' /data ' /proc/self/mountinfo"],
        mutate=lambda c: c["mounts"].append({
            "destination": "/data", "type": "bind", "source": str(host),
            "options": ["rbind", propagation]}))
    ran = runtime("run", "--bundle", str(bundle), f"prop-{propagation}")
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.decode().splitlines()
    assert lines[0] == "from the host", lines
    fields = lines[1].split(" - ")[0].split()[6:]  # the optional fields: shared:N, master:N
    kind = propagation.removeprefix("r")
    # The guest's share is a private mount, and a slave of a private mount
    # is private (mount(2)): as under runc with a private host source.
    shown = {"shared": "shared:", "unbindable": "unbindable"}.get(kind)
    if shown is None:
        assert fields == [], lines[1]
    else:
        assert [f for f in fields if f.startswith(shown)] != [], lines[1]
    runtime.assert_no_leaks()


@pytest.mark.parametrize("where", ["own VM", "pod member"])
def test_a_host_binds_root_in_mountinfo_ends_in_its_source_name(
        runtime, make_bundle, tmp_path, where):
    """runc shows a bind's source path as the mount's root; here the source
    comes through a 9p share, and the root's last component is the source's
    own name, which findmnt and runtime-tools' mount checks compare."""
    conf, one, two = tmp_path / "etc" / "app.conf", tmp_path / "a" / "data", tmp_path / "b" / "data"
    for directory, which in ((one, "a"), (two, "b")):
        directory.mkdir(parents=True)
        (directory / "which").write_text(f"{which}\n")
    conf.parent.mkdir()
    conf.write_text("conf\n")
    binds = [{"destination": dest, "type": "bind", "source": str(source),
              "options": ["rbind", *options]}
             for dest, source, options in (("/mnt/conf", conf, []), ("/mnt/one", one, []),
                                           ("/mnt/two", two, ["ro"]))]
    script = ("cat /mnt/conf /mnt/one/which /mnt/two/which; touch /mnt/two/new || echo ro;"
              " cat /proc/self/mountinfo")
    pod = where == "pod member"

    def mutate(config):
        if pod:
            cri_pod("container", "bpod")(config)
        config["mounts"] += binds
    if pod:
        sandbox = make_bundle(["sleep", "60"], mutate=cri_pod("sandbox", "bpod"))
        runtime("run", "--detach", "--bundle", str(sandbox), "bpod", check=True)
    ran = runtime("run", "--bundle", str(make_bundle(["sh", "-c", script], mutate=mutate)), "bind")
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.decode().splitlines()
    assert lines[:4] == ["conf", "a", "b", "ro"], lines
    roots = {f[4]: f[3] for f in (ln.split() for ln in lines[4:])}
    assert [roots[d].rsplit("/", 1)[1] for d in ("/mnt/conf", "/mnt/one", "/mnt/two")] == [
        "app.conf", "data", "data"], roots
    assert roots["/mnt/one"] != roots["/mnt/two"]
    assert not (two / "new").exists()
    if pod:
        runtime("delete", "--force", "bpod", check=True)
    assert conf.read_text() == "conf\n" and (one / "which").read_text() == "a\n"
    runtime.assert_no_leaks()
