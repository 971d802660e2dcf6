"""linux.resources, cgroupsPath and linux.namespaces as hostile input, the
v1/v2 file mapping, and the VM sizing: no VM, no cgroup written."""

from __future__ import annotations

import os

import pytest

from paracell.errors import ParacellError
from paracell.runtime.bundle import resources
from paracell.runtime.bundle.resources import MIB
from paracell.runtime.host import hostns
from paracell.runtime.host.cgroups import files, hierarchy, host_resources
from paracell.runtime.verbs import update


def refused(value) -> str:
    with pytest.raises(ParacellError) as caught:
        resources.parse(value)
    assert "\n" not in str(caught.value)
    return str(caught.value)


@pytest.mark.parametrize("value, needle", [
    ({"memory": {"limit": -2}}, "memory.limit: -2 is outside"),
    ({"memory": {"limit": 1 << 63}}, "memory.limit"),
    ({"memory": {"limit": "1G"}}, "is not an integer"),
    ({"memory": {"limit": 1.5}}, "is not an integer"),
    ({"memory": {"limit": True}}, "is not an integer"),
    ({"memory": {"swappiness": 101}}, "memory.swappiness"),
    ({"memory": {"limit": 200 << 20, "swap": 100 << 20}}, "should be >= memory limit"),
    ({"cpu": {"shares": -1}}, "cpu.shares"),
    ({"cpu": {"period": 10}}, "cpu.period"),
    ({"cpu": {"quota": -7}}, "cpu.quota"),
    ({"cpu": {"cpus": "0-3;rm -rf"}}, "cpu.cpus"),
    ({"cpu": {"cpus": "3-1"}}, "not a valid range"),
    ({"cpu": {"cpus": "99999"}}, "cpu.cpus"),
    ({"pids": {"limit": "10"}}, "pids.limit"),
    ({"blockIO": {"weight": 5}}, "blockIO.weight"),
    ({"blockIO": {"throttleReadBpsDevice": [{"major": 8}]}}, "needs major, minor and rate"),
    ({"hugepageLimits": [{"pageSize": "2MB/../../x", "limit": 1}]}, "pageSize"),
    ({"devices": [{"allow": True, "type": "x"}]}, "devices[0].type"),
    ({"devices": [{"allow": True, "access": "rwx"}]}, "devices[0].access"),
    ({"devices": [{"type": "c"}]}, "devices[0].allow"),
    ({"devices": [{"allow": True}] * 2000}, "more than 1024"),
    ({"unified": {"../memory.max": "1"}}, "CONTROLLER.PARAMETER"),
    ({"unified": {"cgroup.procs": "1"}}, "CONTROLLER.PARAMETER"),
    ({"network": {"priorities": [{"name": "eth0\nx", "priority": 1}]}}, "interface name"),
    ({"rdma": {"mlx": {"hcaHandles": 1}}}, "rdma"),
    ("lots", "must be an object"),
])
def test_hostile_resources_are_refused_in_one_line(value, needle):
    assert needle in refused(value)


def test_runc_conventions_minus_one_and_zero():
    res = resources.parse({"memory": {"limit": -1, "swap": 0}, "cpu": {"quota": -1},
                           "pids": {"limit": -1}})
    assert res.memory_limit == -1 and res.memory_swap is None
    assert ("pids", "pids.max", "max") in files.v1(res)
    assert ("memory", "memory.max", "max") in files.v2(res)
    assert ("cpu", "cpu.max", "max 100000") in files.v2(res)
    # Kernel memory is obsolete: accepted, ignored, reported.
    assert resources.parse({"memory": {"kernel": 1 << 20}}).ignored == ["memory.kernel"]


FULL = {
    "memory": {"limit": 512 << 20, "reservation": 256 << 20, "swap": 1 << 30,
               "swappiness": 10},
    "cpu": {"shares": 512, "quota": 50000, "period": 100000, "cpus": "0", "mems": "0"},
    "pids": {"limit": 64},
    "blockIO": {"weight": 500, "throttleReadBpsDevice": [{"major": 8, "minor": 0,
                                                          "rate": 1048576}]},
    "hugepageLimits": [{"pageSize": "2MB", "limit": 0}],
    "devices": [{"allow": False, "access": "rwm"},
                {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rw"}],
    "network": {"classID": 0x100001, "priorities": [{"name": "eth0", "priority": 5}]},
}


def test_v1_files_follow_runc():
    writes = files.v1(resources.parse(FULL))
    assert writes[:2] == [("memory", "memory.limit_in_bytes", str(512 << 20)),
                          ("memory", "memory.memsw.limit_in_bytes", str(1 << 30))]
    for expected in [("memory", "memory.soft_limit_in_bytes", str(256 << 20)),
                     ("memory", "memory.swappiness", "10"),
                     ("cpu", "cpu.shares", "512"), ("cpu", "cpu.cfs_quota_us", "50000"),
                     ("cpuset", "cpuset.cpus", "0"), ("pids", "pids.max", "64"),
                     ("blkio", "blkio.weight|blkio.bfq.weight", "500"),
                     ("blkio", "blkio.throttle.read_bps_device", "8:0 1048576"),
                     ("hugetlb", "hugetlb.2MB.limit_in_bytes", "0"),
                     ("devices", "devices.deny", "a"),
                     ("devices", "devices.allow", "c 1:3 rw"),
                     ("net_cls", "net_cls.classid", str(0x100001)),
                     ("net_prio", "net_prio.ifpriomap", "eth0 5")]:
        assert expected in writes
    # The period goes before the quota, and the VMM's own devices after the spec's rules.
    names = [w[1] for w in writes]
    assert names.index("cpu.cfs_period_us") < names.index("cpu.cfs_quota_us")
    assert writes[-3:][0][1] != "devices.deny"
    assert ("devices", "devices.allow", "c 10:232 rwm") in writes  # /dev/kvm


def test_v1_memory_order_when_raising_above_memsw():
    res = resources.parse({"memory": {"limit": 2 << 30, "swap": 3 << 30}})
    writes = files.v1(res, current_memsw=1 << 30)
    assert writes[0][1] == "memory.memsw.limit_in_bytes"


def test_v2_files_follow_runc_conversions():
    full = dict(FULL, network={}, devices=[])
    full["memory"] = {k: v for k, v in FULL["memory"].items() if k != "swappiness"}
    writes = files.v2(resources.parse(full))
    assert ("memory", "memory.max", str(512 << 20)) in writes
    assert ("memory", "memory.swap.max", str((1 << 30) - (512 << 20))) in writes
    assert ("memory", "memory.low", str(256 << 20)) in writes
    assert ("cpu", "cpu.weight", str(files.shares_to_weight(512))) in writes
    assert files.shares_to_weight(2) == 1 and files.shares_to_weight(262144) == 10000
    assert ("cpu", "cpu.max", "50000 100000") in writes
    assert ("io", "io.bfq.weight|io.weight", str(files.blkio_to_io_weight(500))) in writes
    assert files.blkio_to_io_weight(10) == 1 and files.blkio_to_io_weight(1000) == 10000
    assert ("io", "io.max", "8:0 rbps=1048576") in writes
    assert ("hugetlb", "hugetlb.2MB.max", "0") in writes


@pytest.mark.parametrize("value, needle", [
    ({"memory": {"swappiness": 10}}, "no swappiness"),
    ({"cpu": {"realtimeRuntime": 1000}}, "realtime"),
    ({"network": {"classID": 1}}, "net_cls"),
    ({"memory": {"swap": 1 << 30}}, "without memory limit"),
])
def test_v2_refuses_what_it_cannot_express(value, needle):
    with pytest.raises(ParacellError, match=needle):
        files.v2(resources.parse(value))


def test_unified_only_on_v2():
    res = resources.parse({"unified": {"memory.high": "100M"}})
    assert files.v2(res) == [("memory", "memory.high", "100M")]
    with pytest.raises(ParacellError, match="cannot use unified on cgroup v1"):
        files.v1(res)


@pytest.mark.parametrize("path, cleaned", [
    ("../../x", "x"), ("/../../x", "/x"), ("a/../../b", "b"), ("/default/c1", "/default/c1"),
    ("//a//b/", "/a/b"), ("./a", "a"), ("..", "."), ("/", "/"),
])
def test_clean_path_never_climbs(path, cleaned):
    assert hierarchy.clean_path(path) == cleaned


MEM = hierarchy.Hierarchy("/sys/fs/cgroup/memory", 1, frozenset({"memory"}), "/own/slice")


@pytest.mark.parametrize("path, expected", [
    ("/default/c1", "/sys/fs/cgroup/memory/default/c1"),
    ("c1", "/sys/fs/cgroup/memory/own/slice/c1"),
    ("../../../../etc", "/sys/fs/cgroup/memory/own/slice/etc"),
    ("/../../../etc", "/sys/fs/cgroup/memory/etc"),
    ("", "/sys/fs/cgroup/memory/own/slice/ID"),
])
def test_cgroup_directory_stays_below_the_mount(path, expected):
    assert hierarchy.directory(MEM, path, "ID") == expected


@pytest.mark.parametrize("path", ["/", "..", "/..", "/own", "/own/slice", "."])
def test_the_hierarchy_root_is_refused(path):
    with pytest.raises(ParacellError, match="root|own cgroup"):
        hierarchy.directory(MEM, path, "ID")


def test_cgroups_path_type_and_size():
    for bad in (5, ["/x"], "a\0b", "x" * 5000):
        with pytest.raises(ParacellError, match="cgroupsPath"):
            hierarchy.check_cgroups_path(bad)


MOUNTINFO = """\
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
50 31 0:32 / /mnt/again rw,relatime - cgroup cgroup rw,memory
"""
SELF = "9:name=systemd:/\n4:memory:/a/b\n2:cpuacct:/\n1:cpu:/\n0::/\n"


def test_hierarchies_of_a_hybrid_host():
    found = hierarchy.parse(MOUNTINFO, SELF, {"/sys/fs/cgroup/unified": "hugetlb"})
    assert [(h.mount, h.version, sorted(h.controllers), h.own) for h in found] == [
        ("/sys/fs/cgroup/cpu", 1, ["cpu"], "/"),
        ("/sys/fs/cgroup/cpuacct", 1, ["cpuacct"], "/"),
        ("/sys/fs/cgroup/memory", 1, ["memory"], "/a/b"),
        ("/sys/fs/cgroup/unified", 2, ["hugetlb"], "/"),
    ]


def test_pure_v2_host_and_a_subtree_mount():
    found = hierarchy.parse("1 0 0:1 /a /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", "0::/a/b\n",
                            {"/sys/fs/cgroup": "cpu memory pids"})
    assert found == [hierarchy.Hierarchy("/sys/fs/cgroup", 2,
                                         frozenset({"cpu", "memory", "pids"}), "/b")]


@pytest.mark.parametrize("value, path", [
    ("system.slice:docker:abc", "/system.slice/docker-abc.scope"),
    ("user-1000.slice:crio:x", "/user.slice/user-1000.slice/crio-x.scope"),
    (":paracell:c1", "/system.slice/paracell-c1.scope"),
    ("machine.slice::c1", "/machine.slice/c1.scope"),
])
def test_systemd_paths(value, path):
    assert hierarchy.systemd_path(value) == path


@pytest.mark.parametrize("value", ["a:b", "/x/y", "bad:p:n", "a--b.slice:p:n",
                                   "x.slice:p:../n"])
def test_bad_systemd_paths(value):
    with pytest.raises(ParacellError):
        hierarchy.systemd_path(value)


def test_guest_sizing_bounds():
    size = resources.guest_size
    assert (size(resources.parse({}), 256, 2).memory_mib, size(resources.parse({}), 256, 2).vcpus) \
        == (256, 1)
    assert size(resources.parse({"memory": {"limit": 300 << 20}}), 256, 2).memory_mib == 300
    assert size(resources.parse({"memory": {"limit": 1 << 20}}), 256, 2).memory_mib == 64
    assert size(resources.parse({"memory": {"limit": 1 << 50}}), 256, 2).memory_mib == 65536
    assert size(resources.parse({"memory": {"limit": -1}}), 256, 2).memory_mib == 256
    cpu = {"cpu": {"quota": 150000, "period": 100000}}
    assert size(resources.parse(cpu), 256, 16).vcpus == 2
    assert size(resources.parse({"cpu": {"quota": 10**12}}), 256, 16).vcpus == 8
    assert size(resources.parse({"cpu": {"quota": 10**12}}), 256, 2).vcpus == 2
    assert size(resources.parse({"cpu": {"cpus": "0-2,5"}}), 256, 16).vcpus == 4
    both = {"cpu": {"cpus": "0-5", "quota": 200000}}
    assert size(resources.parse(both), 256, 16).vcpus == 2


def test_host_limit_leaves_room_for_the_vmm():
    res = resources.parse({"memory": {"limit": 300 << 20, "swap": 400 << 20}})
    host = host_resources(res, 300, "tcg")
    assert host.memory_limit == (300 + 192) << 20
    assert host.memory_swap == (400 + 192) << 20
    # Below the floor, the guest still gets 64 MiB and the host limit covers it.
    tiny = host_resources(resources.parse({"memory": {"limit": 1 << 20}}), 64, "tcg")
    assert tiny.memory_limit == (64 + 192) << 20
    assert host_resources(resources.parse({"memory": {"limit": -1}}), 256, "tcg") \
        .memory_limit == -1


def test_update_flags_and_units():
    merged = update.merge_flags({"cpu": {"shares": 10}},
                                {"memory": "512m", "cpu-share": "20", "pids-limit": "-1",
                                 "cpuset-cpus": "0", "memory-swap": None})
    assert merged == {"cpu": {"shares": 20, "cpus": "0"}, "memory": {"limit": 512 * MIB},
                      "pids": {"limit": -1}}
    assert update.merge_flags({}, {"memory": "-1"})["memory"] == {"limit": -1, "swap": -1}
    assert update.ram_in_bytes("1.5g", "memory") == 3 << 29
    for bad in ("lots", "1e9", "-2", "1x", "9" * 40):
        with pytest.raises(ParacellError, match="invalid value for memory"):
            update.ram_in_bytes(bad, "memory")
    with pytest.raises(ParacellError, match="invalid value for cpu-quota"):
        update.merge_flags({}, {"cpu-quota": "ten"})
    with pytest.raises(ParacellError, match="Intel RDT"):
        update.merge_flags({}, {"l3-cache-schema": "L3:0=f"})


def test_namespace_paths_are_checked_by_type(tmp_path):
    plan = hostns.plan({"pid": "", "ipc": "/proc/self/ns/ipc", "network": "",
                        "user": "", "mount": ""})
    assert plan.new == {"pid", "mount"} and plan.join == {"ipc": "/proc/self/ns/ipc"}
    with pytest.raises(ParacellError) as caught:
        hostns.plan({"ipc": "/proc/self/ns/uts"})
    assert str(caught.value) == ("failed to setns into ipc namespace: Invalid argument "
                                 "(/proc/self/ns/uts is a uts namespace)")
    plain = tmp_path / "file"
    plain.write_text("")
    with pytest.raises(ParacellError, match="failed to setns into mnt namespace"):
        hostns.plan({"mount": str(plain)})
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ParacellError, match=r"fifo is not a namespace"):
        hostns.plan({"ipc": str(fifo)})  # refused at once, not blocked on
    with pytest.raises(ParacellError, match=r"/dev/null is not a namespace"):
        hostns.plan({"uts": "/dev/null"})
    with pytest.raises(ParacellError, match="failed to open"):
        hostns.plan({"uts": str(tmp_path / "missing")})
    with pytest.raises(ParacellError, match="unknown namespace type"):
        hostns.plan({"bogus": ""})
    assert os.path.exists("/proc/self/ns/cgroup")


def test_qemu_root_holds_what_the_devices_open(tmp_path):
    """The jail takes its paths as data, from the devices that know them."""
    from paracell.vmm import devices
    from paracell.vmm.builder import Machine, VmBuilder
    from paracell.vmm.qemu import jail

    kernel, initrd = tmp_path / "bzImage", tmp_path / "initramfs"
    ram, rootfs = tmp_path / "ram.mem", tmp_path / "rootfs"
    for made in (kernel, initrd, ram):
        made.write_text("")
    rootfs.mkdir()
    console = tmp_path / "state" / "console.log"
    console.parent.mkdir()
    vm = VmBuilder(Machine(qemu="/usr/bin/qemu-system-x86_64", engine="tcg", kernel=kernel,
                           initramfs=initrd, memory_mib=64, vcpus=1,
                           kernel_args=("init=/usr/bin/env",)))
    vm.attach(devices.GuestRam(ram, 64))
    vm.attach(devices.SerialConsole(console))
    vm.attach(devices.AgentPort())
    vm.attach(devices.rootfs_share(rootfs, readonly=True))
    plan = jail.plan_for(vm.host_paths(), str(tmp_path / "state"))
    binds = {path: (is_dir, writable) for path, is_dir, writable in plan.binds}
    assert binds[str(kernel)] == (False, False)
    assert binds[str(ram)] == (False, True)
    assert binds[str(console)] == (False, True) and console.exists()  # made to be bound
    assert binds[str(rootfs)] == (True, False)  # a read-only share
    assert binds["/usr"] == (True, False)
    assert all(not path.startswith("/etc/") or path == "/etc/ld.so.cache" for path in binds)
    assert "/usr/bin/env" not in binds  # a guest path, not a host path QEMU opens
    assert plan.root == str(tmp_path / "state" / "jail")
    # Every absolute path on QEMU's command line outside the system trees is
    # one the devices declared: none is left out of the jail.
    argv_paths = {part.partition("=")[2] for arg in vm.command_line()[1:]
                  for part in arg.split(",") if part.partition("=")[2].startswith("/")}
    argv_paths |= {str(kernel), str(initrd)}
    assert argv_paths <= set(vm.host_paths()), argv_paths - set(vm.host_paths())


def test_device_rules_reduce_as_v1_applies_them():
    from paracell.runtime.bundle.resources import Device
    from paracell.runtime.host.cgroups import devicebpf

    deny_all, allow_all = Device(False, "a", -1, -1, "rwm"), Device(True, "a", -1, -1, "rwm")
    null, tty = Device(True, "c", 1, 3, "rwm"), Device(True, "c", 5, 0, "rw")
    assert devicebpf.reduce([deny_all, null, tty]) == (False, [null, tty])
    assert devicebpf.reduce([deny_all, null, Device(False, "c", 1, 3, "rwm")]) == (False, [])
    assert devicebpf.reduce([null, deny_all, tty]) == (False, [tty])  # "a" clears the list
    assert devicebpf.reduce([allow_all]) == (True, [])
    assert devicebpf.reduce([]) == (True, [])
    # 6 loads, per rule its checks and a return, and the default's return.
    code = devicebpf.compile_rules(False, [null, tty])
    assert len(code) % 8 == 0
    assert len(code) // 8 == 6 + (3 + 2) + (3 + 3 + 2) + 2
    assert code[-16:] == devicebpf._insn(devicebpf.MOV64_K, 0, imm=0) + \
        devicebpf._insn(devicebpf.EXIT)
