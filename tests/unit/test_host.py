"""Host probe, engine choice, QEMU command line, IDs, signals, cpio."""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path

import pytest

from paracell import fastpath
from paracell.errors import ParacellError
from paracell.guest import cpio
from paracell.runtime.agent.signals import FORWARDED, forward_mask, parse_signal
from paracell.runtime.state.ids import check_id
from paracell.runtime.vm.teardown import reclaim
from paracell.vmm import devices, probe
from paracell.vmm.builder import Machine, VmBuilder
from paracell.vmm.qemu.monitor import QmpSocket
from tests.conftest import PARACELL


def facts(kind: str) -> probe.HostFacts:
    return probe.HostFacts(kind, "detail", False, "/usr/bin/qemu-system-x86_64", "7.2")


def test_classify_kvm():
    assert probe.classify_kvm({"vmx"}, {"kvm_intel"}, True)[0] == "hardware"
    assert probe.classify_kvm({"svm"}, {"kvm_amd"}, True)[0] == "hardware"
    assert probe.classify_kvm(set(), {"kvm", "kvm_pvm"}, True)[0] == "pvm-host"
    assert probe.classify_kvm({"vmx"}, {"kvm_intel"}, False)[0] == "none"
    assert probe.classify_kvm(set(), set(), True)[0] == "none"


def test_auto_falls_back_to_tcg_with_a_notice():
    choice = probe.choose_engine("auto", facts("pvm-host"))
    assert choice.engine == "tcg" and choice.notice and "TCG" in choice.notice
    assert "\n" not in choice.notice


def test_kvm_refused_where_unusable():
    with pytest.raises(ParacellError, match="not usable"):
        probe.choose_engine("kvm", facts("pvm-host"))
    with pytest.raises(ParacellError, match="unknown engine"):
        probe.choose_engine("xen", facts("none"))


def test_probe_reads_this_host():
    found = probe.probe_host()
    assert found.kvm_kind in ("hardware", "pvm-host", "none")


def builder(engine: str = "tcg", readonly: bool = True, binds: bool = False) -> VmBuilder:
    vm = VmBuilder(Machine(qemu="qemu-system-x86_64", engine=engine, kernel=Path("/k"),
                           initramfs=Path("/i"), memory_mib=256, vcpus=1))
    vm.attach(devices.GuestRam(Path("/dev/shm/m"), 256))
    vm.attach(devices.SerialConsole(Path("/c")))
    vm.attach(devices.DebugExit())
    vm.attach(devices.AgentPort())
    vm.attach(devices.rootfs_share(Path("/r"), readonly))
    if binds:
        vm.attach(devices.HostShare(Path("/s"), [(Path("/etc/hosts"), "0/hosts")]))
    vm.attach(QmpSocket(Path("/q.sock")))
    return vm


def test_tcg_command_line():
    argv = builder().command_line()
    joined = " ".join(argv)
    assert argv[argv.index("-cpu") + 1] == "max"
    assert "tcg,tb-size=" in joined
    assert "microvm,x-option-roms=off,memory-backend=mem,pit=off,acpi=off" in joined
    assert "mem-path=/dev/shm/m,share=on" in joined
    assert "-nodefaults" in argv
    assert "virtserialport,chardev=agent,name=paracell.agent" in joined
    assert "path=/r,security_model=passthrough,readonly=on" in joined
    assert "isa-debug-exit,iobase=0xf4" in joined
    assert "hostshare" not in joined
    # An idle guest sleeps on the LAPIC timer, told its rate, with no PIT.
    append = argv[argv.index("-append") + 1].split()
    assert "lapic_timer_khz=1000000" in append and "noapictimer" not in append
    assert "sysctl.vm.compaction_proactiveness=0" in append and "tsc=reliable" in append


def test_a_restored_vm_is_given_no_kernel_to_load():
    """A QEMU that loads a saved VM keeps no copy of the kernel and initramfs
    (fw_cfg holds them for its life, 3.3 MiB of the kernel alone), and the
    machine and devices match the booted one's, which the restore needs."""
    vm = builder()
    booted, restored = vm.command_line(), vm.command_line(incoming=True)
    assert {"-kernel", "-initrd", "-append"} <= set(booted)
    assert not {"-kernel", "-initrd", "-append"} & set(restored)
    assert restored[-2:] == ["-incoming", "defer"]
    dropped = booted.index("-kernel")
    assert restored[:-2] == booted[:dropped] + booted[dropped + 6:]


def test_pager_and_balloon_devices(tmp_path):
    """The Pager needs microvm's PCIe bus, found through ACPI, where the LAPIC
    timer must tick; its ivshmem device gets its server's socket as an fd."""
    vm = builder()
    vm.machine = Machine(**{**vm.machine.__dict__, "tsc_khz": 2596000})
    ram = vm.devices[0]
    vm.attach(devices.PagerChannel(ram, tmp_path, {"paracell_pager.order": 9}))
    argv = vm.command_line()
    joined, append = " ".join(argv), argv[argv.index("-append") + 1]
    assert "memory-backend=mem,acpi=on,pcie=on" in joined and "acpi=off" not in joined
    assert "ivshmem-doorbell,chardev=pager,vectors=1,master=on" in joined
    assert "-chardev socket,id=pager,fd=" in joined
    assert "noapictimer" not in append and "lapic_timer_khz=1000000" in append
    assert "pit=off" in joined
    assert "tsc_early_khz=2596000" in append and "paracell_pager.order=9" in append
    balloon = builder()
    balloon.attach(devices.Balloon())
    assert "virtio-balloon-device,free-page-reporting=on" in " ".join(balloon.command_line())


def test_kvm_command_line_and_hostshare():
    argv = builder(engine="kvm", readonly=False, binds=True).command_line()
    joined = " ".join(argv)
    assert "-accel kvm -cpu host" in joined
    # KVM's guest has TSC-deadline mode and keeps the PIT it may need.
    assert "lapic_timer_khz" not in argv[argv.index("-append") + 1]
    assert "pit=off" not in joined
    assert "readonly=on" not in joined
    assert "mount_tag=hostshare" in joined


def test_launch_passes_each_devices_fds_and_record_reclaims(tmp_path):
    """Devices bring their fds and host resources; the record alone cleans up."""
    vm = VmBuilder(Machine(qemu="/bin/true", engine="tcg", kernel=Path("/k"),
                           initramfs=Path("/i"), memory_mib=64, vcpus=1))
    ram = vm.attach(devices.GuestRam(tmp_path / "ram.mem", 64))
    qmp = vm.attach(QmpSocket(tmp_path / "qmp.sock"))
    agent = vm.attach(devices.AgentPort())
    record = vm.record()
    assert [d["kind"] for d in record] == ["guest-ram", "qemu-monitor", "agent-port"]
    booted = vm.launch(tmp_path / "qemu.log")
    assert booted.stop(10) == 0
    assert ram.path.exists() and qmp.path.exists() and agent.host_end is not None
    reclaim(record)  # as `delete` does after a shim that died
    assert not ram.path.exists() and not qmp.path.exists()
    booted.release()  # idempotent after a reclaim
    assert agent.host_end is None


@pytest.mark.parametrize("good", ["a", "abc-DEF_1.2+3", "x" * 255])
def test_valid_ids(good):
    assert check_id(good) == good


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "../x", "sp ace", "x" * 256, "é"])
def test_invalid_ids(bad):
    with pytest.raises(ParacellError):
        check_id(bad)


def test_signals():
    assert parse_signal("15") == parse_signal("TERM") == parse_signal("SIGTERM") == 15
    assert parse_signal("kill") == 9
    for bad in ("0", "65", "SIGNOPE", "-1", "1.5"):
        with pytest.raises(ParacellError):
            parse_signal(bad)
    assert 15 in FORWARDED and 9 not in FORWARDED and 28 not in FORWARDED
    assert forward_mask() & (1 << 15) and not forward_mask() & (1 << 9)


def test_cpio_newc_layout():
    data = cpio.newc_archive([cpio.directory("dev"), cpio.char_device("dev/console", 5, 1),
                              cpio.executable("init", b"\x7fELF")])
    assert data.startswith(b"070701") and b"TRAILER!!!" in data
    assert len(data) % 4 == 0
    header = data[:110]
    assert int(header[14:22], 16) == stat.S_IFDIR | 0o755


def test_fast_path_defers_unusual_calls():
    assert fastpath.split_globals(["--root", "/r", "state", "x"]) == ({"--root": "/r"},
                                                                          ["state", "x"])
    assert fastpath.split_globals(["--nope", "state", "x"]) is None
    assert fastpath.split_globals(["--log=/l", "--debug", "kill", "x"]) == (
        {"--log": "/l", "--debug": ""}, ["kill", "x"])
    assert fastpath.run(["--engine", "tcg", "state", "x"]) is None  # left to click
    # podman passes --systemd-cgroup to every verb; only create cares.
    assert fastpath.split_globals(["--systemd-cgroup", "state", "x"]) == (
        {"--systemd-cgroup": ""}, ["state", "x"])


def test_config_file_and_environment_precedence(tmp_path, monkeypatch):
    from paracell import settings

    conf = tmp_path / "config.json"
    conf.write_text('{"engine": "tcg", "guest_memory_mib": 512}')
    monkeypatch.setenv("PARACELL_CONFIG", str(conf))
    monkeypatch.delenv("PARACELL_ENGINE", raising=False)
    monkeypatch.delenv("PARACELL_GUEST_MEMORY_MIB", raising=False)
    assert settings.engine_override() == "tcg" and settings.guest_memory_mib() == 512
    monkeypatch.setenv("PARACELL_ENGINE", "kvm")
    assert settings.engine_override() == "kvm"
    monkeypatch.setenv("PARACELL_ENGINE", "warp")
    with pytest.raises(ParacellError, match=r"^\$PARACELL_ENGINE: unknown engine 'warp'"):
        settings.engine_override()
    monkeypatch.delenv("PARACELL_ENGINE")
    conf.write_text('{"engine": "warp", "memory_manager": "swap"}')
    with pytest.raises(ParacellError, match=f'^"engine" in {conf}: unknown engine'):
        settings.engine_override()
    monkeypatch.delenv("PARACELL_MEMORY_MANAGER", raising=False)
    with pytest.raises(ParacellError, match=f'^"memory_manager" in {conf}: unknown memory manager'):
        settings.memory_manager_override()
    conf.write_text('{"engin": "tcg"}')
    with pytest.raises(ParacellError, match="unknown or mistyped"):
        settings.engine_override()
    monkeypatch.setenv("PARACELL_GUEST_MEMORY_MIB", "8")
    with pytest.raises(ParacellError, match="outside"):
        settings.guest_memory_mib()


def test_every_global_option_of_the_cli_is_known_to_the_fast_path(tmp_path):
    """A global the fast path does not know makes entry.py lose --log and
    --log-format for the failing call (it was so for --memory-manager)."""
    from paracell import globalopts
    from paracell.cli import main as group

    known = globalopts.VALUED | globalopts.FLAGS
    cli_globals = {opt for p in group.params for opt in p.opts if opt.startswith("--")}
    assert cli_globals - {"--version", "--help"} <= known, cli_globals - known
    log = tmp_path / "log.json"
    failed = subprocess.run(
        [PARACELL, "--memory-manager", "none", "--log", str(log), "--log-format", "json",
         "--root", str(tmp_path / "root"), "state", "ghost"], capture_output=True)
    assert failed.returncode != 0
    assert json.loads(log.read_text())["msg"] == "container ghost does not exist"


def test_guest_builds_take_turns(tmp_path, monkeypatch):
    """A second `guest build` waits for the first instead of wiping its work."""
    import fcntl
    import os
    import threading

    from paracell.guest import artifacts

    monkeypatch.setenv("PARACELL_CACHE", str(tmp_path))
    order = []
    with artifacts._build_lock():
        order.append("first")
        second = threading.Thread(target=lambda: (artifacts._build_lock().__enter__(),
                                                  order.append("second")))
        # The lock is held: an attempt from another open file description fails at once.
        fd = os.open(tmp_path / "build.lock", os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        second.start()
        second.join(0.2)
        assert order == ["first"]
    second.join(5)
    assert order == ["first", "second"]
