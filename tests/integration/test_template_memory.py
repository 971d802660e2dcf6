"""Copy-on-write guest RAM from a template, on real VMs (docs/templates.md):
VMs restored from one template map its RAM file privately, own only what
they write, give it back through the Pager inside QEMU, and never change the
template; QEMU keeps no fd on the template's file. Behaviour only: no timing
is asserted (the figures are `paracell bench density`'s)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from paracell.vmm import templatestore
from paracell.vmm.memory import PLUGIN
from tests.integration.test_pager import (
    BURST,
    held_by,
    pager_rootfs,  # noqa: F401  (a fixture)
    popen_run,
    returned_within_a_second,
)

pytestmark = pytest.mark.integration

MIB = 1 << 20
PAGER = {"io.paracell.memory-manager": "pager"}


def _annotated(annotations: dict[str, str]):
    def mutate(config: dict) -> None:
        config.setdefault("annotations", {}).update(annotations)
    return mutate


@pytest.fixture
def store(runtime, tmp_path: Path) -> Path:
    path = tmp_path / "templates"
    runtime.env["PARACELL_TEMPLATES"] = str(path)
    return path


def _seed(runtime, bundle: Path) -> str:
    """A template of the bundle's shape, from a create that booted cold."""
    assert runtime("create", "--bundle", str(bundle), "seed").returncode == 0
    vm = json.loads((runtime.root / "seed" / "state.json").read_text())["vm"]
    assert vm["template"].startswith("saved "), vm["template"]
    runtime("delete", "--force", "seed", check=True)
    return vm["template"].split()[1]


def _vm(runtime, cid: str) -> dict:
    return json.loads((runtime.root / cid / "state.json").read_text())["vm"]


def _ram_digest(store: Path, key: str) -> str:
    fd = os.open(store / key / templatestore.RAM, os.O_RDONLY)
    try:
        return templatestore.ram_copy(fd, -1, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def _maps_of(pid: int, path: Path) -> list[str]:
    with open(f"/proc/{pid}/maps") as f:
        return [line.split()[1] for line in f if line.rstrip().endswith(str(path))]


def _fds_on(pid: int, path: Path) -> list[str]:
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(path):
                found.append(fd)
        except OSError:
            pass
    return found


def test_restored_vms_share_the_template_own_what_they_write_and_give_it_back(
        runtime, make_bundle, pager_rootfs, store):  # noqa: F811
    idle = make_bundle(["sleep", "600"], rootfs=pager_rootfs, mutate=_annotated(PAGER))
    key = _seed(runtime, idle)
    ram = (store / key / templatestore.RAM).resolve()
    digest = _ram_digest(store, key)
    assert runtime("run", "--detach", "--bundle", str(idle), "idle").returncode == 0
    # Same shape (the template's key is the VM's, not the process's).
    burst = make_bundle(["sh", "-c", f"{' '.join(BURST)}; echo again; sleep 600"],
                        rootfs=pager_rootfs, mutate=_annotated(PAGER))
    proc = popen_run(runtime, burst, "busy")
    try:
        dropped = returned_within_a_second(runtime, proc, "busy", "copy-on-write")
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith(b"done")
        for cid in ("idle", "busy"):
            vm = _vm(runtime, cid)
            assert vm["template"] == f"restored {key}", vm["template"]
            # Guest RAM is the template's file, mapped private; no RAM file of its own.
            assert _maps_of(vm["qemu_pid"], ram) and \
                all(perms == "rw-p" for perms in _maps_of(vm["qemu_pid"], ram))
            assert not Path(vm["config"]["ram_file"]).exists()
            # No fd on the template: a QEMU taken over cannot write what its siblings map.
            assert _fds_on(vm["qemu_pid"], ram) == []
            assert str(PLUGIN) in " ".join(_cmdline(vm["qemu_pid"]))
        stats = json.loads(runtime("events", "--stats", "busy", check=True).stdout)
        figures = stats["data"]["paracell"]
        idle_held = held_by(runtime, "idle")
    finally:
        runtime("kill", "busy", "KILL")
        proc.wait(60)
    print(f"returned {dropped / MIB:.1f} MiB; idle neighbour holds {idle_held / MIB:.1f} MiB; "
          f"{figures}")
    # The Pager in QEMU gave the burst back, and counted it where events reads it.
    assert dropped >= 0.9 * 128 * MIB
    assert figures["template_shared"] is True and figures["unbind_batches"] > 0, figures
    assert figures["guest"]["total_pages"] > 0, figures
    # The idle neighbour owns a few MiB, not its whole guest.
    assert idle_held < 32 * MIB
    # It still runs on the template's pages, which neither VM changed.
    assert runtime("exec", "idle", "true").returncode == 0
    assert _ram_digest(store, key) == digest
    for cid in ("idle", "busy"):
        runtime("delete", "--force", cid, check=True)
    runtime.assert_no_leaks()


def _cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [arg.decode() for arg in f.read().split(b"\0") if arg]


def test_copied_template_ram_when_the_settings_say_so(runtime, make_bundle, store):
    bundle = make_bundle(["sleep", "600"])
    key = _seed(runtime, bundle)
    runtime.env["PARACELL_TEMPLATE_RAM"] = "copied"
    assert runtime("run", "--detach", "--bundle", str(bundle), "copied").returncode == 0
    vm = _vm(runtime, "copied")
    assert vm["template"] == f"restored {key}"
    assert Path(vm["config"]["ram_file"]).exists()
    assert not _maps_of(vm["qemu_pid"], (store / key / templatestore.RAM).resolve())
    stats = json.loads(runtime("events", "--stats", "copied", check=True).stdout)
    assert stats["data"]["paracell"]["template_shared"] is False
    runtime("delete", "--force", "copied", check=True)
    runtime.env["PARACELL_TEMPLATE_RAM"] = "sideways"
    result = runtime("run", "--detach", "--bundle", str(bundle), "bad")
    # A bad setting never fails a create: the RAM is copied, and the log says why.
    assert result.returncode == 0, result.stderr
    assert Path(_vm(runtime, "bad")["config"]["ram_file"]).exists()
    runtime("delete", "--force", "bad", check=True)
    runtime.assert_no_leaks()


@pytest.mark.parametrize("args", [
    "ram=3", "size=4096", "ram=3,size=4097", "ram=2,size=4096", "ram=3,size=4096,doorbell=5",
    "ram=3,size=4096,bogus=1", "ram=x,size=4096", "ram=3,size=-4096",
    "ram=3,size=268435456,doorbell=5,irq=6,abort=7,stats=8,split=4096",
])
def test_qemu_refuses_the_plugin_with_bad_arguments(args: str, tmp_path: Path):
    result = subprocess.run(
        ["qemu-system-x86_64", "-display", "none", "-nodefaults", "-M", "microvm",
         "-plugin", f"file={PLUGIN},{args}"], capture_output=True, text=True, timeout=30)
    assert result.returncode != 0
    assert "paracell ram plugin:" in result.stderr, result.stderr
