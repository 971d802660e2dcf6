"""The template store without VMs: what the key covers, what a reader
refuses, and that builders of one key never meet halfway."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from paracell.errors import ParacellError
from paracell.vmm import devices, templatestore
from paracell.vmm.builder import Machine, VmBuilder
from paracell.vmm.templatestore import Capture, TemplateError, TemplateStore

RAM_MIB = 4


def builder(tmp: Path, **machine: object) -> VmBuilder:
    for name in ("qemu", "bzImage", "initramfs.cpio"):
        if not (tmp / name).exists():
            (tmp / name).write_bytes(name.encode())
    fields = {"qemu": str(tmp / "qemu"), "engine": "tcg", "kernel": tmp / "bzImage",
              "initramfs": tmp / "initramfs.cpio", "memory_mib": RAM_MIB, "vcpus": 1,
              "tsc_khz": 2_000_000, **machine}
    vm = VmBuilder(Machine(**fields))  # type: ignore[arg-type]
    vm.attach(devices.GuestRam(tmp / "vm.mem", int(fields["memory_mib"])))  # type: ignore[call-overload]
    vm.attach(devices.AgentPort())
    vm.attach(devices.rootfs_share(tmp, readonly=True))
    return vm


def test_the_key_follows_every_input_and_no_per_sandbox_value(tmp_path: Path):
    base = builder(tmp_path)
    key = templatestore.key_of(base.shape())
    # Per sandbox: another RAM file, another rootfs directory, another state dir.
    other = builder(tmp_path)
    other.devices[0] = devices.GuestRam(tmp_path / "elsewhere.mem", RAM_MIB)
    other.devices[2] = devices.rootfs_share(tmp_path / "another-rootfs", readonly=True)
    assert templatestore.key_of(other.shape()) == key
    changed = [
        builder(tmp_path, memory_mib=RAM_MIB * 2),
        builder(tmp_path, vcpus=2),
        builder(tmp_path, engine="kvm"),
        builder(tmp_path, kernel_args=("paracell.debug=1",)),
    ]
    writable = builder(tmp_path)
    writable.devices[2] = devices.rootfs_share(tmp_path, readonly=False)
    changed.append(writable)
    with_balloon = builder(tmp_path)
    with_balloon.attach(devices.Balloon())
    changed.append(with_balloon)
    keys = {templatestore.key_of(vm.shape()) for vm in changed}
    assert key not in keys and len(keys) == len(changed)
    # A rebuilt initramfs (the agent changed) is a new file: a new key.
    rebuilt = tmp_path / "initramfs.cpio"
    rebuilt.unlink()
    rebuilt.write_bytes(b"a changed agent")
    assert templatestore.key_of(builder(tmp_path).shape()) != key


def saved(store: TemplateStore, tmp_path: Path, shape: dict, content: bytes = b"touched",
          state: bytes = b"state") -> str:
    ram = tmp_path / "ram.src"
    with open(ram, "wb") as f:
        f.truncate(RAM_MIB << 20)
        f.seek(1 << 20)
        f.write(content)
    key = templatestore.key_of(shape)
    made = store.save(key, shape, Capture(lambda path: path.write_bytes(state), ram,
                                          RAM_MIB << 20, ["02:00:00:00:00:01"]))
    assert made is not None and made.key == key
    return key


def test_a_saved_template_is_found_whole_and_its_ram_sparse(tmp_path: Path):
    store = TemplateStore(tmp_path / "store")
    shape = {"memory_mib": RAM_MIB, "devices": []}
    key = saved(store, tmp_path, shape)
    found = store.find(key, shape)
    assert found is not None and found.macs == ["02:00:00:00:00:01"]
    assert os.stat(found.path / "ram").st_blocks * 512 < 1 << 20  # only the touched extent
    target = tmp_path / "ram.dst"
    with open(target, "wb+") as f:
        found.copy_ram(f.fileno())
    found.close()
    assert target.read_bytes()[1 << 20:(1 << 20) + 7] == b"touched"
    assert os.stat(target).st_size == RAM_MIB << 20
    assert os.stat(target).st_blocks * 512 <= 1 << 20  # holes stay holes
    with pytest.raises(TemplateError, match="another VM shape"):
        store.find(key, {**shape, "vcpus": 2})


def test_another_shape_under_the_same_name_is_refused(tmp_path: Path):
    store = TemplateStore(tmp_path / "store")
    shape = {"memory_mib": RAM_MIB, "devices": []}
    key = saved(store, tmp_path, shape)
    meta = json.loads((store.root / key / "meta.json").read_text())
    meta["shape"]["vcpus"] = 2
    (store.root / key / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(TemplateError, match="made for another VM shape"):
        store.find(key, shape)


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "meta.json").write_text("[" * 100000), "not valid JSON|larger than"),
    (lambda d: (d / "meta.json").write_text('{"format": 9}'), "not format"),
    (lambda d: os.truncate(d / "ram", 4096), "ram: 4096 bytes"),
    (lambda d: (d / "device.state").write_bytes(b""), "device.state: empty"),
    (lambda d: ((d / "ram").unlink(), (d / "ram").symlink_to("/etc/passwd")), "ram: "),
    (lambda d: (d / "device.state").unlink(), "device.state: No such file"),
    (lambda d: (d / "device.state").write_bytes(b"other"), "device.state does not match"),
    (lambda d: os.chmod(d / "ram", 0o666), "ram is writable by others"),
    (lambda d: os.chmod(d, 0o777), "is writable by others"),
    (lambda d: os.chown(d / "device.state", 1000, 0), "owner uid 1000"),
])
def test_a_reader_refuses_a_damaged_template(tmp_path: Path, damage, message):
    store = TemplateStore(tmp_path / "store")
    shape = {"memory_mib": RAM_MIB, "devices": []}
    key = saved(store, tmp_path, shape)
    damage(store.root / key)
    with pytest.raises(TemplateError, match=message):
        store.find(key, shape)
    assert store.remove(key) and not (store.root / key).exists()


def _truncated_and_extended(ram: Path) -> None:
    size = ram.stat().st_size
    os.truncate(ram, 0)
    os.truncate(ram, size)


def _random_bytes_over(ram: Path) -> None:
    with open(ram, "r+b") as f:
        f.seek(2 << 20)
        f.write(os.urandom(1 << 20))


@pytest.mark.parametrize("damage", [_truncated_and_extended, _random_bytes_over])
def test_ram_that_is_not_what_was_saved_fails_its_copy(tmp_path: Path, damage):
    store = TemplateStore(tmp_path / "store")
    shape = {"memory_mib": RAM_MIB, "devices": []}
    key = saved(store, tmp_path, shape)
    damage(store.root / key / "ram")
    found = store.find(key, shape)  # the sizes and the state are right
    assert found is not None
    with open(tmp_path / "new.mem", "wb+") as f, pytest.raises(TemplateError,
                                                              match="ram does not match"):
        found.copy_ram(f.fileno())
    found.close()


def test_ram_from_one_save_and_state_from_another_is_refused(tmp_path: Path):
    shape = {"memory_mib": RAM_MIB, "devices": []}
    first, second = TemplateStore(tmp_path / "one"), TemplateStore(tmp_path / "two")
    key = saved(first, tmp_path, shape, content=b"first save", state=b"state one")
    saved(second, tmp_path, shape, content=b"second save", state=b"state two")
    mixed = (first.root / key / "ram").read_bytes()
    (second.root / key / "ram").write_bytes(mixed)
    found = second.find(key, shape)
    assert found is not None
    with open(tmp_path / "new.mem", "wb+") as f, pytest.raises(TemplateError,
                                                              match="ram does not match"):
        found.copy_ram(f.fileno())
    found.close()
    # And the other way round: that save's state beside this one's RAM.
    (second.root / key / "device.state").write_bytes(b"state one")
    with pytest.raises(TemplateError, match="device.state does not match"):
        second.find(key, shape)


def test_a_store_others_can_write_is_refused_in_one_line(tmp_path: Path):
    """As sshd's StrictModes: the store, and the directories above it."""
    shape = {"memory_mib": RAM_MIB, "devices": []}
    open_store = tmp_path / "open"
    open_store.mkdir(mode=0o777)
    os.chmod(open_store, 0o777)
    with pytest.raises(ParacellError, match=r"template store .* is writable by others "
                                            r"\(owner uid 0, mode 0777\)"):
        TemplateStore(open_store).find("0" * 32, shape)
    with pytest.raises(ParacellError, match="writable by others"):
        TemplateStore(open_store).pin()
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, 1000, 1000)
    with pytest.raises(ParacellError, match="owner uid 1000"):
        saved(TemplateStore(foreign), tmp_path, shape)
    above = tmp_path / "shared"
    above.mkdir()
    os.chmod(above, 0o777)  # not sticky: anyone may rename the store away
    with pytest.raises(ParacellError, match=f"{above} is writable by others"):
        TemplateStore(above / "store").find("0" * 32, shape)
    assert not (above / "store").exists()
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)  # as /tmp: what is ours there stays ours
    assert saved(TemplateStore(sticky / "store"), tmp_path, shape)


def test_two_removals_of_everything_at_once_both_succeed(tmp_path: Path):
    from paracell.runtime.verbs import template as verb

    store = TemplateStore(tmp_path / "store")
    os.environ["PARACELL_TEMPLATES"] = str(store.root)
    try:
        for _ in range(10):  # bounded: a race shows within a few rounds
            for n in range(templatestore.MAX_TEMPLATES):
                saved(store, tmp_path, {"memory_mib": RAM_MIB, "n": n})
            pids = []
            for _ in range(2):
                pid = os.fork()
                if pid == 0:
                    try:
                        verb.remove((), everything=True)
                        os._exit(0)
                    except BaseException:
                        os._exit(1)
                pids.append(pid)
            codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
            assert codes == [0, 0]
            assert store.entries() == []
    finally:
        del os.environ["PARACELL_TEMPLATES"]


def test_a_store_that_is_a_link_is_never_followed(tmp_path: Path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / "store").symlink_to(victim)
    store = TemplateStore(tmp_path / "store")
    with pytest.raises(ParacellError, match="is not a directory"):
        store.find("0" * 32, {})
    with pytest.raises(ParacellError, match="is not a directory"):
        saved(store, tmp_path, {"memory_mib": RAM_MIB})
    assert list(victim.iterdir()) == []


def test_a_second_builder_of_a_key_leaves_it_to_the_first(tmp_path: Path):
    store = TemplateStore(tmp_path / "store")
    shape = {"memory_mib": RAM_MIB, "devices": []}
    key = templatestore.key_of(shape)
    with store._building(key) as first:
        assert first
        second = store.save(key, shape, Capture(lambda p: pytest.fail("saved twice"),
                                                tmp_path, RAM_MIB << 20, []))
        assert second is None
    assert saved(store, tmp_path, shape) == key
    assert store.save(key, shape, Capture(lambda p: pytest.fail("saved over"), tmp_path,
                                          RAM_MIB << 20, [])) is None


def test_the_store_keeps_the_most_recently_used(tmp_path: Path):
    store = TemplateStore(tmp_path / "store")
    keys = []
    for n in range(templatestore.MAX_TEMPLATES + 2):
        keys.append(saved(store, tmp_path, {"memory_mib": RAM_MIB, "n": n}))
        # Used in the order saved, a second apart.
        os.utime(store.root / keys[-1] / "meta.json", (1000 + n, 1000 + n))
    assert {e["key"] for e in store.entries()} == set(keys[2:])


def test_a_pinned_store_is_reached_through_its_fd_whatever_its_path_becomes(tmp_path: Path):
    # As in the shim's jail, where the store's path turns read-only after the pin.
    store = TemplateStore(tmp_path / "store")
    store.pin()
    (tmp_path / "store").rename(tmp_path / "moved")
    shape = {"memory_mib": RAM_MIB, "devices": []}
    key = saved(store, tmp_path, shape)
    assert (tmp_path / "moved" / key / "meta.json").is_file()
    assert store.find(key, shape) is not None
    assert [e["key"] for e in store.entries()] == [key]
    assert store.remove(key) and not (tmp_path / "moved" / key).exists()
