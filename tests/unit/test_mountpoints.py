"""Mount points created on the host, inside real rootfs directories, before the
rootfs is shared: runc's rules, and no way out of the rootfs through a symlink."""

from __future__ import annotations

import json
import os
import stat
import uuid

import pytest

from paracell.errors import ParacellError
from paracell.runtime.bundle import defaultspec, spec
from paracell.runtime.bundle.mountpoints import MountPoint, create_in_root, create_mount_points


def bundle_with(tmp_path, mounts=(), *, default=True, readonly=True):
    """A bundle whose rootfs is empty: the image has none of the mount points."""
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True, exist_ok=True)
    config = defaultspec.default_config(["true"])
    config["root"]["readonly"] = readonly
    if not default:
        config["mounts"] = []
    config["mounts"] += list(mounts)
    (bundle / "config.json").write_text(json.dumps(config))
    return bundle


def prepare(bundle):
    loaded = spec.load_bundle(bundle)
    spec.init_launch_spec("c1", loaded)
    spec.prepare_rootfs(loaded)
    return loaded


def tree(root):
    """Every path under root, relative, with its kind: d, f or l."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            mode = os.lstat(path).st_mode
            kind = "l" if stat.S_ISLNK(mode) else "d" if stat.S_ISDIR(mode) else "f"
            out[os.path.relpath(path, root)] = kind
    return out


def tmpfs(dest):
    return {"destination": dest, "type": "tmpfs", "source": "tmpfs"}


def bind(source, dest):
    return {"destination": dest, "type": "bind", "source": str(source), "options": ["rbind", "ro"]}


def test_default_spec_on_an_empty_read_only_rootfs(tmp_path):
    """The busybox-from-a-tarball case: /tmp (and /proc, /dev, /sys) are missing;
    /dev/pts and /dev/shm live in the guest's /dev tmpfs and are not made here."""
    rootfs = prepare(bundle_with(tmp_path)).rootfs
    assert tree(rootfs) == {"proc": "d", "dev": "d", "sys": "d", "tmp": "d"}
    assert stat.S_IMODE(os.stat(rootfs / "tmp").st_mode) == 0o755 & ~current_umask()


def current_umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_cri_sandbox_file_binds_get_empty_files(tmp_path):
    """containerd's CRI: a read-only pause rootfs with no /etc, and host files
    bound onto /etc/resolv.conf, /etc/hostname and /etc/hosts."""
    host = tmp_path / "host"
    host.mkdir()
    names = ("resolv.conf", "hostname", "hosts")
    for name in names:
        (host / name).write_text(f"{name} from the host\n")
    mounts = [bind(host / name, f"/etc/{name}") for name in names]
    rootfs = prepare(bundle_with(tmp_path, mounts, default=False)).rootfs
    assert tree(rootfs) == {"etc": "d", **{f"etc/{n}": "f" for n in names}}
    assert all((rootfs / "etc" / n).read_text() == "" for n in names)
    assert all((host / n).read_text() == f"{n} from the host\n" for n in names)


def test_directory_bind_gets_a_directory_with_parents(tmp_path):
    source = tmp_path / "data"
    source.mkdir()
    rootfs = prepare(bundle_with(tmp_path, [bind(source, "/srv/a/b")], default=False)).rootfs
    assert tree(rootfs) == {"srv": "d", "srv/a": "d", "srv/a/b": "d"}


def test_existing_mount_points_of_the_wrong_kind_are_left_alone(tmp_path):
    hostfile = tmp_path / "f"
    hostfile.write_text("x")
    bundle = bundle_with(tmp_path, [bind(hostfile, "/isdir"), tmpfs("/isfile"),
                                    tmpfs("/isfile/below")], default=False)
    rootfs = bundle / "rootfs"
    (rootfs / "isdir").mkdir()
    (rootfs / "isfile").write_text("keep")
    prepare(bundle)
    assert tree(rootfs) == {"isdir": "d", "isfile": "f"}
    assert (rootfs / "isfile").read_text() == "keep"


def test_prepare_is_idempotent(tmp_path):
    bundle = bundle_with(tmp_path, [bind(tmp_path / "bundle" / "config.json", "/etc/x")])
    prepare(bundle)
    first = tree(bundle / "rootfs")
    prepare(bundle)
    assert tree(bundle / "rootfs") == first


@pytest.mark.parametrize("link", ["/", "../../../../..", "/../.."])
def test_symlinked_parent_cannot_lead_out_of_the_rootfs(tmp_path, link):
    """rootfs/etc -> / (or a ../ chain): /etc/NAME is made in the rootfs, as if
    the rootfs were /, and never in the host's /."""
    name = f"paracell-escape-{uuid.uuid4().hex}"
    bundle = bundle_with(tmp_path, [tmpfs(f"/etc/{name}")], default=False)
    rootfs = bundle / "rootfs"
    (rootfs / "etc").symlink_to(link)
    naive = os.path.join(os.path.realpath(rootfs / "etc"), name)  # where the host would put it
    try:
        prepare(bundle)
        assert not os.path.lexists(naive)
        assert tree(rootfs) == {"etc": "l", name: "d"}
    finally:
        if os.path.isdir(naive):
            os.rmdir(naive)


def test_absolute_symlink_to_a_host_directory_stays_in_the_rootfs(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    bundle = bundle_with(tmp_path, [bind(tmp_path / "bundle" / "config.json", "/etc/hosts")],
                         default=False)
    rootfs = bundle / "rootfs"
    (rootfs / "etc").symlink_to(outside)
    prepare(bundle)
    assert list(outside.iterdir()) == []
    assert (rootfs / str(outside).lstrip("/") / "hosts").is_file()


def test_dangling_symlink_destination_creates_its_target_in_the_rootfs(tmp_path):
    """Images often have /etc/resolv.conf -> ../run/...; runc creates the target."""
    hostfile = tmp_path / "resolv"
    hostfile.write_text("nameserver 10.0.0.1\n")
    bundle = bundle_with(tmp_path, [bind(hostfile, "/etc/resolv.conf")], default=False)
    rootfs = bundle / "rootfs"
    (rootfs / "etc").mkdir()
    (rootfs / "etc" / "resolv.conf").symlink_to("../../../run/systemd/resolve/stub-resolv.conf")
    prepare(bundle)
    assert (rootfs / "run/systemd/resolve/stub-resolv.conf").is_file()
    assert not os.path.lexists(tmp_path / "run")


@pytest.mark.parametrize("links", [{"a": "a"}, {"a": "b", "b": "/a"}, {"a": "a/x"}])
def test_symlink_loops_fail_in_one_line(tmp_path, links):
    bundle = bundle_with(tmp_path, [tmpfs("/a/mnt")], default=False)
    for name, target in links.items():
        (bundle / "rootfs" / name).symlink_to(target)
    with pytest.raises(ParacellError) as err:
        prepare(bundle)
    assert str(err.value) == "mount /a/mnt: create mount point: Too many levels of symbolic links"


def test_dotdot_in_a_walk_stops_at_the_rootfs(tmp_path):
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    fd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY)
    try:
        create_in_root(fd, "/../../../x/../../y", directory=True)
        create_in_root(fd, "../../z", directory=False)
    finally:
        os.close(fd)
    assert tree(rootfs) == {"x": "d", "y": "d", "z": "f"}
    assert not os.path.lexists(tmp_path / "y") and not os.path.lexists(tmp_path / "z")


def test_destinations_in_guest_filesystems_are_left_to_the_guest(tmp_path):
    hostdir = tmp_path / "hostdir"
    hostdir.mkdir()
    mounts = [
        {"destination": "/sys/fs/cgroup", "type": "cgroup2", "source": "cgroup"},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue"},
        bind(hostdir, "/proc/driver/x"),
        bind(hostdir, "/host"),
        tmpfs("/host/sub"),
        tmpfs("/a/b"),
        tmpfs("/a"),
        tmpfs("/a/b/c"),
    ]
    rootfs = prepare(bundle_with(tmp_path, mounts)).rootfs
    assert tree(rootfs) == {"proc": "d", "dev": "d", "sys": "d", "tmp": "d", "host": "d",
                            "a": "d", "a/b": "d"}
    assert list(hostdir.iterdir()) == []


def test_under_a_bind_of_a_rootfs_directory_the_source_gets_the_mount_point(tmp_path):
    bundle = bundle_with(tmp_path, [
        {"destination": "/mnt", "type": "bind", "source": "rootfs/data", "options": ["rbind"]},
        tmpfs("/mnt/sub"),
    ], default=False)
    (bundle / "rootfs" / "data").mkdir()
    prepare(bundle)
    assert tree(bundle / "rootfs") == {"data": "d", "data/sub": "d", "mnt": "d"}


def test_locating_through_binds_in_order():
    # /x binds rootfs /src; /src itself was under a tmpfs mounted before: guest.
    points = [MountPoint("/src", True), MountPoint("/x", True, "/src/in"),
              MountPoint("/x/y", True)]
    from paracell.runtime.bundle.mountpoints import _locate

    assert _locate("/x/y", points[:2]) is None
    assert _locate("/x/y", points[1:2]) == "/src/in/y"
    assert _locate("/x", [MountPoint("/", True, "/")]) == "/x"


def test_rootfs_swapped_for_a_symlink_after_validation_is_refused(tmp_path):
    bundle = bundle_with(tmp_path)
    loaded = spec.load_bundle(bundle)
    spec.init_launch_spec("c1", loaded)
    real = tmp_path / "elsewhere"
    (bundle / "rootfs").rename(real)
    (bundle / "rootfs").symlink_to(real)
    with pytest.raises(ParacellError, match="^invalid rootfs: not an absolute path, or a symlink$"):
        spec.prepare_rootfs(loaded)
    assert tree(real) == {}


def test_unwritable_host_rootfs_fails_in_one_line(tmp_path):
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    (rootfs / "etc").write_text("a file where a directory should be")
    # A parent that is not a directory is the guest's to report; an error from
    # the host filesystem itself is reported here, naming the mount.
    create_mount_points(rootfs, [MountPoint("/etc/x", True)])
    name = "n" * 300
    with pytest.raises(ParacellError, match=f"^mount /{name}: create mount point: File name"):
        create_mount_points(rootfs, [MountPoint(f"/{name}", True)])
