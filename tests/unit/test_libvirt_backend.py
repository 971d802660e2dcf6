"""The libvirt backend's pieces that need no daemon: the domain's XML for a
real VmBuilder plan, the URI rule, the lent TAP names, and the spawn
handshake's place request through a real fork."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from paracell import wire
from paracell.errors import ParacellError
from paracell.net import lent
from paracell.runtime.vm import spawn
from paracell.runtime.vm.memorymanager import MemoryPlan
from paracell.vmm import devices
from paracell.vmm.builder import Device, Machine, VmBuilder
from paracell.vmm.libvirt import connection, domain

KEY = "0123456789abcdef0123456789abcdef"


def plan(tmp_path: Path, manager: str = "pager") -> VmBuilder:
    vm = VmBuilder(Machine(qemu="/usr/bin/qemu-system-x86_64", engine="tcg",
                           kernel=tmp_path / "bzImage", initramfs=tmp_path / "initramfs.cpio",
                           memory_mib=256, vcpus=2), owner={"id": "c1", "bundle": "/b"})
    ram = vm.attach(devices.GuestRam(tmp_path / f"{KEY}.mem", 256))
    if manager == "pager":
        vm.attach(devices.PagerChannel(ram, tmp_path, MemoryPlan("pager").kernel_knobs,
                                       listen_path=tmp_path / f"{KEY}.pager"))
    elif manager == "balloon":
        vm.attach(devices.Balloon())
    vm.attach(devices.SerialConsole(tmp_path / "console.log"))
    vm.attach(devices.DebugExit())
    vm.attach(devices.AgentPort(tmp_path / f"{KEY}.agent"))
    vm.attach(devices.rootfs_share(tmp_path / "rootfs", readonly=True))
    vm.attach(devices.PodShare(tmp_path / "pod"))
    return vm


def test_the_domain_holds_every_device_and_names_its_container(tmp_path: Path):
    xml = domain.render(plan(tmp_path), domain.name_for(KEY), {"id": "c1", "bundle": "/b"})
    root = ET.fromstring(xml)
    assert root.get("type") == "qemu" and root.findtext("name") == f"paracell-{KEY}"
    assert root.find("os/type").get("machine") == "q35"
    assert root.findtext("os/cmdline").startswith("console=ttyS0")
    assert root.find("cpu").get("mode") == "maximum"  # PKU under TCG, for XGates
    assert root.findtext("vcpu") == "2" and root.findtext("memory") == "256"
    assert root.find("seclabel/label").text == "+0:+0"
    channel = root.find("devices/channel/source")
    assert channel.get("mode") == "connect" and channel.get("path").endswith(".agent")
    assert root.find("devices/shmem/server").get("path").endswith(".pager")
    shares = {fs.find("target").get("dir"): fs for fs in root.findall("devices/filesystem")}
    assert shares[wire.text("PC_ROOTFS_TAG")].find("readonly") is not None
    assert shares[wire.text("PC_PODSHARE_TAG")].get("multidevs") == "remap"
    assert root.find("devices/memballoon").get("model") == "none"
    args = [a.get("value") for a in root.iter(f"{{{domain.QEMU_NS}}}arg")]
    assert f"mem-path={tmp_path}/{KEY}.mem" in args[1] and "share=on" in args[1]
    assert "memory-backend=paracell-ram" in args and any("isa-debug-exit" in a for a in args)
    assert domain.owner_of(xml) == {"id": "c1", "bundle": "/b",
                                    "version": domain.__version__}


def test_the_balloon_has_free_page_reporting_and_no_stats_polling(tmp_path: Path):
    root = ET.fromstring(domain.render(plan(tmp_path, "balloon"), "paracell-x", {}))
    balloon = root.find("devices/memballoon")
    assert balloon.get("freePageReporting") == "on" and balloon.find("stats").get("period") == "0"


def test_a_device_without_a_renderer_is_refused(tmp_path: Path):
    class Mystery(Device):
        kind = "mystery"

    vm = plan(tmp_path, "none")
    vm.attach(Mystery())
    with pytest.raises(ParacellError, match="cannot render the mystery device"):
        domain.render(vm, "paracell-x", {})


def test_a_foreign_domain_has_no_owner():
    assert domain.owner_of("<domain><name>other</name></domain>") == {}
    assert domain.owner_of("not xml") == {}


@pytest.mark.parametrize("uri", ["qemu:///system", "qemu:///session",
                                 "qemu:///system?socket=/tmp/x/libvirt-sock"])
def test_local_qemu_uris_are_taken(uri: str):
    assert connection.check_uri(uri) == uri


@pytest.mark.parametrize("uri", ["qemu+ssh://host/system", "qemu://host/system", "test:///default",
                                 "qemu:///system?socket=/a b", "qemu:///system\n",
                                 "qemu:///system?" + "a" * 1100, ""])
def test_other_uris_are_refused_in_one_line(uri: str):
    with pytest.raises(ParacellError) as refused:
        connection.check_uri(uri)
    assert "invalid libvirt URI" in str(refused.value) and "\n" not in str(refused.value)


def test_lent_tap_names_fit_ifnamsiz_and_only_ours_are_valid():
    name = lent.name_for(KEY, 3)
    assert name == "pctap012345603" and len(name) <= 15 and lent.valid_name(name)
    for other in ("eth0", "pctap0", "pctap0123456xx", name + "0", 7):
        assert not lent.valid_name(other)


def test_a_place_request_is_served_by_the_creator_before_the_report():
    placed: list[int] = []

    def body(handshake: spawn.Handshake) -> int:
        handshake.place(os.getpid())
        handshake.report(spawn.Ready(pid=os.getpid()))
        return 0 if handshake.committed() else 1

    spawned = spawn.spawn(body, False, lambda _: None, place=placed.append)
    assert spawned.ready.pid == spawned.pid and placed == [spawned.pid]
    spawned.commit()
    assert os.waitstatus_to_exitcode(os.waitpid(spawned.pid, 0)[1]) == 0


def test_a_refused_place_fails_the_child():
    def refuse(pid: int) -> None:
        raise ParacellError("no")

    def body(handshake: spawn.Handshake) -> int:
        try:
            handshake.place(os.getpid())
        except ParacellError as err:
            handshake.report(spawn.Ready(error=str(err)))
            return 1
        handshake.report(spawn.Ready(pid=os.getpid()))
        return 0

    spawned = spawn.spawn(body, False, lambda _: None, place=refuse)
    # The creator's reason, not the child's guess.
    assert spawned.ready.error == "placing QEMU in the container's cgroup: no"
