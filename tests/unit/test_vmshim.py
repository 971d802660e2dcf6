"""paracell-vmshim (csrc/vmshimexec.c), the C body a VM's shim execs into:
the test plays the guest at the other end of the agent channel, and a
`sleep` child stands in for QEMU, as the shim's own child."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from paracell._native import lib

from paracell.runtime.vm.shim import VMSHIM_EXEC
from tests.unit.test_relay_quiesce import frame, read_frame

# The stand-in for the shim: forks its "QEMU", then execs paracell-vmshim with
# the agent socket and the control socket inherited, as Shim.become_native does.
LAUNCH = """
import os, subprocess, sys
agent, listener, log, abort, lease = (int(a) for a in sys.argv[2:7])
if sys.argv[9] != "-":  # in a network namespace of its own: give it foreign interfaces
    subprocess.run(["ip", "link", "add", "pcfx0", "type", "veth", "peer", "name", "pcfx1"],
                   check=True)
qemu = os.fork()
if qemu == 0:
    os.execvp("sleep", ["sleep", sys.argv[7]])
print(qemu, flush=True)
os.execv(sys.argv[1], [sys.argv[1], str(agent), str(listener), "-1", str(abort), str(qemu),
                       "-1", "-1", "-1", "0", str(log), "json", "1", sys.argv[8], sys.argv[9],
                       "pctap", sys.argv[10], str(lease)])
"""


class VmShim:
    def __init__(self, tmp_path: Path, qemu_lives_s: int, net_record: str = "-",
                 python: str = sys.executable) -> None:
        self.log = tmp_path / "log.json"
        self.control = tmp_path / "shim.sock"
        ours, self.guest = socket.socketpair()
        self.guest.settimeout(10)
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(self.control))
        listener.listen(4)
        log_fd = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        abort_r, self.abort = os.pipe()
        # A pooled VM's lease (runtime/poolwire.py): the test holds the other end.
        lease, self.lease = socket.socketpair()
        fds = (ours.fileno(), listener.fileno(), log_fd, abort_r, lease.fileno())
        # A VM that may gain interfaces runs here in a network namespace of
        # the test's own: what its helper sees and touches is the test's.
        private = ["unshare", "--net"] if net_record != "-" else []
        self.proc = subprocess.Popen(
            [*private, sys.executable, "-c", LAUNCH, str(VMSHIM_EXEC), *map(str, fds),
             str(qemu_lives_s), str(self.control), net_record, python], pass_fds=fds,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for fd in (ours.detach(), listener.detach(), log_fd, abort_r, lease.detach()):
            os.close(fd)
        assert self.proc.stdout is not None
        self.qemu = int(self.proc.stdout.readline())

    def errors(self) -> list[str]:
        lines = [json.loads(line) for line in self.log.read_text().splitlines()]
        return [e["msg"] for e in lines if e["level"] == "error"]

    def qemu_gone(self) -> bool:
        return not os.path.exists(f"/proc/{self.qemu}")


def test_a_pager_that_stopped_ends_the_vm_without_a_say_for_the_guest(tmp_path):
    shim = VmShim(tmp_path, qemu_lives_s=60)
    os.write(shim.abort, b"x")
    # No POWEROFF: the guest broke the Pager's protocol; QEMU is killed at once.
    assert shim.proc.wait(timeout=10) == 255
    assert shim.qemu_gone()
    assert shim.guest.recv(64) == b""
    assert shim.errors() == ["the Pager in QEMU stopped (qemu.log says why)"]


@pytest.fixture(autouse=True)
def _built() -> None:
    if not VMSHIM_EXEC.exists():
        pytest.fail(f"{VMSHIM_EXEC} is not built: run `make venv`")


def test_the_containers_exit_status_then_poweroff_and_qemu_waited_for(tmp_path):
    shim = VmShim(tmp_path, qemu_lives_s=1)
    shim.guest.sendall(frame(lib.PC_EXIT, 0, struct.pack("<i", 7)))
    assert read_frame(shim.guest)[0] == lib.PC_POWEROFF
    began = time.monotonic()
    # Its "QEMU" ends on its own within the grace period: it is waited for, not killed.
    assert shim.proc.wait(timeout=10) == 7
    assert time.monotonic() - began >= 0.5
    assert shim.qemu_gone()
    assert not shim.control.exists()
    assert shim.errors() == []
    debug = [json.loads(line)["msg"] for line in shim.log.read_text().splitlines()]
    assert any("relay ended: kind 0, status 7" in m for m in debug), debug


def test_start_carries_nothing_of_the_clients(tmp_path):
    """The agent reads START's payload as the interfaces to bring up: only the
    shim may make it, and this shim has none to give."""
    shim = VmShim(tmp_path, qemu_lives_s=1)
    starter = socket.socket(socket.AF_UNIX)
    starter.settimeout(10)
    starter.connect(str(shim.control))
    starter.sendall(frame(lib.PC_START, 0, b"net=eth0 hostile"))
    assert read_frame(shim.guest) == (lib.PC_START, 0, b"")
    # Started, the relay passes on stdin, here /dev/null: its EOF.
    assert read_frame(shim.guest) == (lib.PC_STDIN, 0, b"")
    shim.guest.sendall(frame(lib.PC_EXIT, 0, struct.pack("<i", 0)))
    assert read_frame(shim.guest)[0] == lib.PC_POWEROFF
    assert shim.proc.wait(timeout=10) == 0
    starter.close()


def test_a_start_with_foreign_interfaces_asks_the_network_helper(tmp_path):
    """A veth pair in the shim's own network namespace is not its TAPs, so
    START's payload comes from paracell.net.latestart. Here the
    record names no spare: the start is refused with the helper's one line,
    and the guest is never started."""
    record = tmp_path / "net.json"
    record.write_text('{"veths": [], "spares": []}')
    shim = VmShim(tmp_path, qemu_lives_s=1, net_record=str(record))
    starter = socket.socket(socket.AF_UNIX)
    starter.settimeout(60)
    starter.connect(str(shim.control))
    starter.sendall(frame(lib.PC_START, 0, b"net=eth0 hostile"))
    ftype, _, why = read_frame(starter)
    assert ftype == lib.PC_ERROR and b"appeared after create" in why and b"\n" not in why, why
    shim.guest.sendall(frame(lib.PC_EXIT, 0, struct.pack("<i", 0)))
    assert read_frame(shim.guest)[0] == lib.PC_POWEROFF  # no START came before it
    assert shim.proc.wait(timeout=10) == 0


def test_a_network_helper_that_fails_silently_is_still_one_line(tmp_path):
    record = tmp_path / "net.json"
    record.write_text('{"veths": [], "spares": []}')
    shim = VmShim(tmp_path, qemu_lives_s=1, net_record=str(record), python="/bin/false")
    starter = socket.socket(socket.AF_UNIX)
    starter.settimeout(60)
    starter.connect(str(shim.control))
    starter.sendall(frame(lib.PC_START))
    assert read_frame(starter) == (lib.PC_ERROR, 0, b"start: the network helper failed (exit 1)")
    shim.guest.sendall(frame(lib.PC_EXIT, 0, struct.pack("<i", 0)))
    assert read_frame(shim.guest)[0] == lib.PC_POWEROFF
    assert shim.proc.wait(timeout=10) == 0


def test_a_guest_that_hangs_up_means_qemu_killed_137_and_the_reason_logged(tmp_path):
    shim = VmShim(tmp_path, qemu_lives_s=60)
    shim.guest.close()
    assert shim.proc.wait(timeout=10) == 137
    assert shim.qemu_gone()
    assert not shim.control.exists()
    [error] = shim.errors()
    assert error.endswith("(qemu exit -9)"), error


def test_a_guest_that_breaks_the_protocol_ends_it_with_255(tmp_path):
    shim = VmShim(tmp_path, qemu_lives_s=1)
    shim.guest.sendall(struct.pack("<IHH", 1 << 30, lib.PC_STDOUT, 0))
    assert read_frame(shim.guest)[0] == lib.PC_POWEROFF
    assert shim.proc.wait(timeout=10) == 255
    assert shim.qemu_gone()
    assert len(shim.errors()) == 1


@pytest.mark.parametrize("argv", [[], ["1"] * 12, ["x"] + ["1"] * 12,
                                  ["3", "4", "-1", "-1", "0"] + ["1"] * 12,
                                  ["3", "4", "-1", "-1", "99", "-1", "-1", "-1", "0", "-1",
                                   "json", "2", "/nonexistent", "-", "pctap", "python3", "-1"],
                                  ["3", "4", "-1", "-1", "99", "-1", "-1", "-1", "0", "-1",
                                   "json", "1", "/nonexistent", "-", "pctap", "python3", "x"]])
def test_bad_arguments_are_one_line_and_255(argv):
    done = subprocess.run([str(VMSHIM_EXEC), *argv], capture_output=True, timeout=10)
    assert done.returncode == 255
    assert len(done.stderr.decode().splitlines()) == 1
    assert done.stderr.startswith(b"paracell-vmshim: usage:")


def test_a_pooled_vm_powers_off_when_its_lease_holder_is_gone(tmp_path):
    """The holder (the pool, then the container that took the VM) is gone:
    the guest is told to power off, QEMU is waited for, and the shim exits 0."""
    shim = VmShim(tmp_path, qemu_lives_s=1)
    time.sleep(0.3)
    assert shim.proc.poll() is None, "a held lease ended the VM"
    shim.lease.close()
    assert read_frame(shim.guest)[0] == lib.PC_POWEROFF
    assert shim.proc.wait(timeout=10) == 0
    assert shim.qemu_gone()
    assert shim.errors() == []
