"""linux.sysctl, process.oomScoreAdj, linux.readonlyPaths and linux.maskedPaths
in config.json: hostile values refused on the host with one line (runc's
wording for the namespace rules), good ones turned into the agent's records."""

from __future__ import annotations

import pytest
from paracell._native import lib

from paracell.errors import ParacellError
from paracell.runtime.bundle import defaultspec, spec
from tests.unit.test_spec import records, write


def launch(tmp_path, mutate) -> list[tuple[str, str]]:
    config = defaultspec.default_config()
    mutate(config)
    bundle = spec.load_bundle(write(tmp_path / "b", config))
    return records(spec.init_launch_spec("c1", bundle))


def refused(tmp_path, mutate) -> str:
    with pytest.raises(ParacellError) as caught:
        launch(tmp_path, mutate)
    message = str(caught.value)
    assert "\n" not in message
    return message


def linux(**fields):
    return lambda c: c["linux"].update(fields)


def test_records_in_the_order_the_agent_applies_them(tmp_path):
    def mutate(config):
        config["process"]["oomScoreAdj"] = -1000
        config["linux"]["namespaces"].append({"type": "network"})
        config["linux"].update(
            sysctl={"kernel.shmmax": "1", "net.ipv4.ip_forward": "1", "kernel.sem": "1 2 3 4",
                    "fs.mqueue.msg_max": "x=y", "kernel.domainname": ""},
            readonlyPaths=["/proc/sys", "/a b"], maskedPaths=["/proc/kcore", "/../x"])

    recs = launch(tmp_path, mutate)
    assert ("oom_score_adj", "-1000") in recs
    assert [r for r in recs if r[0] in ("sysctl", "path.readonly", "path.masked")] == [
        ("sysctl", "kernel/shmmax=1"), ("sysctl", "net/ipv4/ip_forward=1"),
        ("sysctl", "kernel/sem=1 2 3 4"), ("sysctl", "fs/mqueue/msg_max=x=y"),
        ("sysctl", "kernel/domainname="),
        ("path.readonly", "/proc/sys"), ("path.readonly", "/a b"),
        ("path.masked", "/proc/kcore"), ("path.masked", "/../x"),  # resolved in the root
    ]


def test_absent_or_null_fields_give_no_records(tmp_path):
    recs = launch(tmp_path, lambda c: (c["process"].update(oomScoreAdj=None),
                                       c["linux"].update(sysctl=None, maskedPaths=None)))
    assert not [r for r in recs if r[0] in ("oom_score_adj", "sysctl", "path.masked")]


def test_exec_process_carries_its_oom_score_adj():
    process = {"args": ["true"], "oomScoreAdj": 1000}
    spec.check_process(process)
    assert ("oom_score_adj", "1000") in records(spec.exec_launch_spec("c1", process))


@pytest.mark.parametrize("value, message", [
    (1001, "process.oomScoreAdj 1001 is out of range (-1000 to 1000)"),
    (-1001, "process.oomScoreAdj -1001 is out of range (-1000 to 1000)"),
    (2**70, "is out of range"),
    (True, "process.oomScoreAdj must be an integer"),
    ("5", "process.oomScoreAdj must be of type int"),
    (1.5, "process.oomScoreAdj must be of type int"),
])
def test_bad_oom_score_adj(tmp_path, value, message):
    assert message in refused(tmp_path, lambda c: c["process"].update(oomScoreAdj=value))


@pytest.mark.parametrize("name, namespaces, message", [
    ("kernel.pid_max", None, 'sysctl "kernel.pid_max" is not in a separate kernel namespace'),
    ("vm.overcommit_memory", None,
     'sysctl "vm.overcommit_memory" is not in a separate kernel namespace'),
    ("kernel.domainname", ["ipc"],
     'sysctl "kernel.domainname" is not in a separate kernel namespace'),
    ("kernel.hostname", None,
     'sysctl "kernel.hostname" is not allowed as it conflicts with the OCI "hostname" field'),
    ("kernel.shmmax", ["uts"], 'sysctl "kernel.shmmax" is not allowed in the hosts ipc namespace'),
    ("fs.mqueue.msg_max", ["uts"],
     'sysctl "fs.mqueue.msg_max" is not allowed in the hosts ipc namespace'),
    ("net.core.somaxconn", None,
     'sysctl "net.core.somaxconn" not allowed in host network namespace'),
])
def test_sysctls_outside_the_containers_namespaces(tmp_path, name, namespaces, message):
    def mutate(config):
        if namespaces is not None:
            config["linux"]["namespaces"] = [{"type": t} for t in namespaces]
        config["linux"]["sysctl"] = {name: "1"}

    assert refused(tmp_path, mutate) == message


def test_net_sysctl_with_the_runtimes_own_network_namespace_is_refused(tmp_path):
    def mutate(config):
        config["linux"]["namespaces"].append({"type": "network", "path": "/proc/self/ns/net"})
        config["linux"]["sysctl"] = {"net.ipv4.ip_forward": "1"}

    assert refused(tmp_path, mutate) == \
        'sysctl "net.ipv4.ip_forward" not allowed in host network namespace'


def test_net_sysctl_with_a_missing_network_namespace_path(tmp_path):
    def mutate(config):
        config["linux"]["namespaces"].append({"type": "network", "path": str(tmp_path / "no")})
        config["linux"]["sysctl"] = {"net.ipv4.ip_forward": "1"}

    assert refused(tmp_path, mutate) == \
        f"invalid netns path: stat {tmp_path / 'no'}: No such file or directory"


@pytest.mark.parametrize("mutate, message", [
    (linux(sysctl=["kernel.shmmax=1"]), "linux.sysctl must be of type dict"),
    (linux(sysctl={"kernel.shmmax": 1}), "linux.sysctl['kernel.shmmax'] must be of type str"),
    (linux(sysctl={"kernel.shmmax": "9" * (lib.PC_SPEC_MAX_SYSCTL_VALUE + 1)}),
     "longer than 4095 bytes"),
    (linux(sysctl={f"kernel.shm{i}": "1" for i in range(lib.PC_SPEC_MAX_SYSCTLS + 1)}),
     "linux.sysctl has more than 256 entries"),
    (linux(sysctl={"kernel.shmmax": "a\0b"}), "sysctl contains a NUL byte"),
    (linux(namespaces={"type": "ipc"}), "linux.namespaces must be of type list"),
    (linux(namespaces=[{"type": 1}], sysctl={"kernel.shmmax": "1"}),
     "linux.namespaces[0].type must be of type str"),
    (linux(maskedPaths="/proc/kcore"), "linux.maskedPaths must be of type list"),
    (linux(maskedPaths=["proc/kcore"]), "linux.maskedPaths[0] 'proc/kcore' must be an absolute"),
    (linux(readonlyPaths=["/ok", ""]), "linux.readonlyPaths[1] '' must be an absolute path"),
    (linux(readonlyPaths=[7]), "linux.readonlyPaths[0] must be of type str"),
    (linux(readonlyPaths=["/" + "a" * lib.PC_SPEC_MAX_PATH_LEN]),
     "linux.readonlyPaths[0] is longer than 4095 bytes"),
    (linux(maskedPaths=["/x"] * (lib.PC_SPEC_MAX_PATHS + 1)),
     "linux.maskedPaths has more than 256 entries"),
    (linux(maskedPaths=["/a\0b"]), "path.masked contains a NUL byte"),
    (lambda c: c.update(linux=["x"]), "linux must be of type dict"),
])
def test_malformed_fields(tmp_path, mutate, message):
    assert message in refused(tmp_path, mutate)


def test_slashed_keys_name_a_path_whose_dots_belong_to_names(tmp_path):
    """runc's form for an interface name with a dot in it."""
    def mutate(config):
        config["linux"]["namespaces"].append({"type": "network"})
        config["linux"]["sysctl"] = {"net/ipv4/conf/eth0.100/forwarding": "1",
                                     "kernel/shmmax": "2"}

    assert [r for r in launch(tmp_path, mutate) if r[0] == "sysctl"] == [
        ("sysctl", "net/ipv4/conf/eth0.100/forwarding=1"), ("sysctl", "kernel/shmmax=2")]
    # The rules see the dotted name, as runc's do.
    assert refused(tmp_path, linux(sysctl={"kernel/pid_max": "1"})) == \
        'sysctl "kernel.pid_max" is not in a separate kernel namespace'


@pytest.mark.parametrize("name", [
    "", ".", "kernel.", ".kernel", "kernel..shmmax", "kernel/", "/kernel/shmmax", "net/../x",
    "net/./x", "../../etc/passwd",
    "kernel.shm max", "kernel.shmmax\n", "kernel.shmmax=1", "net.ipv4.conf.eth0:1.forwarding",
    "k" * (lib.PC_SPEC_MAX_SYSCTL_NAME + 1), "kernel.shmmäx",
])
def test_names_that_are_not_a_plain_proc_sys_path(tmp_path, name):
    message = refused(tmp_path, linux(sysctl={name: "1"}))
    assert message.startswith("invalid config.json: linux.sysctl key ")
    assert message.endswith(" is not a sysctl name")


def test_the_bounds_themselves_are_accepted(tmp_path):
    name = "net." + "n" * (lib.PC_SPEC_MAX_SYSCTL_NAME - 4)

    def mutate(config):
        config["linux"]["namespaces"].append({"type": "network"})
        config["linux"].update(
            sysctl={name: "v" * lib.PC_SPEC_MAX_SYSCTL_VALUE},
            maskedPaths=["/m"] * lib.PC_SPEC_MAX_PATHS,
            readonlyPaths=["/" + "r" * (lib.PC_SPEC_MAX_PATH_LEN - 1)])

    recs = launch(tmp_path, mutate)
    assert len([r for r in recs if r[0] == "path.masked"]) == lib.PC_SPEC_MAX_PATHS
    path = name.replace(".", "/")
    assert ("sysctl", f"{path}={'v' * lib.PC_SPEC_MAX_SYSCTL_VALUE}") in recs
