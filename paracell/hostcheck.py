"""`paracell check`: the host facts, the guest artifacts, the engine choice,
whether XGates can run, and each daemon backend's own report (libvirt's)."""

from __future__ import annotations

import json

from paracell.errors import ParacellError
from paracell.vmm import probe

TYPE_CHECKING = False
if TYPE_CHECKING:
    from paracell.vmm.hypervisor import Backend

KIND_TEXT = {
    "hardware": "hardware KVM",
    "pvm-host": "PVM host (kvm_pvm): cannot run our guest without a PVM guest kernel",
    "none": "no KVM",
}


def collect(engine: str, daemons: list[Backend] | None = None, root: str = ""
            ) -> dict[str, object]:
    from paracell.guest import artifacts
    from paracell.runtime.pool import report as pool_report

    facts = probe.probe_host()
    report: dict[str, object] = {"host": probe.facts_as_dict(facts)}
    report["guest"] = artifacts.freshness()
    from paracell.xgate.support import support

    chosen: str | None = None
    try:
        choice = probe.choose_engine(engine, facts)
        chosen = choice.engine
        report["engine"] = {"requested": engine, "engine": choice.engine, "reason": choice.reason}
    except ParacellError as err:
        report["engine"] = {"requested": engine, "engine": None, "reason": str(err)}
    xgates = support(chosen, facts)
    report["xgates"] = {"supported": xgates.supported, "reason": xgates.reason}
    report["shim_v2"] = shim_v2()
    report["relays"] = relays()
    report["checkpoints"] = checkpoint_method()
    if root:
        report["pool"] = pool_report.ask(root) or {"root": root, "serving": False}
    for backend in daemons or []:
        try:
            report[backend.name] = backend.report(facts.qemu_path, chosen)
        except ParacellError as err:  # no binding, or a location that is refused
            report[backend.name] = {"uri": backend.location, "reachable": False,
                                    "detail": str(err)}
    return report


def pool_summary(pool: dict[str, object]) -> str:
    if pool.get("serving") is False:
        return f"none serves {pool.get('root')} (paracell pool serve)"
    vms = pool.get("vms")
    waiting = sum(1 for vm in vms if isinstance(vm, dict) and vm.get("state") == "waiting") \
        if isinstance(vms, list) else 0
    kinds = pool.get("kinds")
    size = pool.get("size")
    if isinstance(kinds, list) and isinstance(size, int):
        size *= len(kinds)
    return (f"{waiting} of {size} VMs waiting for {pool.get('root')}, "
            f"{pool.get('cost_mib')} MiB of a {pool.get('budget_mib')} MiB budget")


SHIM_V2 = "containerd-shim-paracell-v2"


def shim_v2() -> dict[str, object]:
    """containerd's shim v2 (docs/shim-v2.md): installed beside this
    `paracell`, and whether it is on PATH, where containerd looks for it."""
    import shutil
    import sys
    from pathlib import Path

    beside = Path(sys.executable).with_name(SHIM_V2)
    found = shutil.which(SHIM_V2)
    return {"path": str(beside), "installed": beside.is_file(), "on_path": found}


def relays() -> dict[str, bool]:
    """The C programs that a container's and an exec's host process exec once
    they run (docs/shim-v2.md), and whether each is built: without one, that
    process stays a Python one, tens of MiB for as long as it runs."""
    import os

    from paracell.runtime.agent.channel import RELAY_EXEC
    from paracell.runtime.vm.shim import VMSHIM_EXEC

    return {str(path): path.is_file() and os.access(path, os.X_OK)
            for path in (RELAY_EXEC, VMSHIM_EXEC)}


def checkpoint_method() -> dict[str, object]:
    """How a snapshot-mode VM's checkpoints find the pages that changed here
    (docs/snapshots.md): QEMU's log of writes where this kernel keeps one
    (tried on a few pages of this process's own), else a hash of every page."""
    import os

    from paracell._native import lib
    from paracell.runtime.snapshots import writelog

    failed = lib.pc_dirty_probe()
    if failed:
        return {"method": writelog.EVERY_PAGE, "detail": f"no log of writes: {os.strerror(failed)} "
                "(asynchronous userfaultfd write-protection and PAGEMAP_SCAN need Linux 6.7)"}
    if writelog.swap_in_use():
        return {"method": writelog.EVERY_PAGE, "detail": "the host swaps, which loses the log"}
    return {"method": writelog.WRITTEN_PAGES,
            "detail": "QEMU logs the pages it writes: userfaultfd and PAGEMAP_SCAN"}


def _checkpoints_line(found: dict[str, object]) -> str:
    if found.get("method") == "written pages":
        return f"ckpts:   read only the written pages ({found['detail']})"
    return f"ckpts:   hash every page ({found['detail']})"


def _relays_line(found: dict[str, bool]) -> str:
    missing = [path for path, built in found.items() if not built]
    if not missing:
        names = ", ".join(path.rsplit("/", 1)[-1] for path in found)
        return f"relays:  built ({names})"
    return (f"relays:  not built: {', '.join(missing)} (run `make venv`; until then each "
            "container's and exec's host process stays a Python one)")


def _shim_v2_line(found: dict[str, object]) -> str:
    if not found.get("installed"):
        return f"shim v2: not installed ({found['path']}: run `make venv`)"
    if found.get("on_path"):
        return f"shim v2: {found['on_path']} (containerd's runtime io.containerd.paracell.v2)"
    return (f"shim v2: {found['path']}, not on PATH: link it into a directory on containerd's "
            "PATH, such as /usr/local/bin")


def _daemon_lines(name: str, found: dict[str, object]) -> list[str]:
    if not found.get("reachable"):
        return [f"{name}: not reachable at {found['uri']} ({found.get('detail')})"]
    lines = [f"{name}: {found['version']} at {found['uri']}"]
    marks = {True: "yes", False: "MISSING", None: "unverified"}
    for feature in [*(found.get("setup") or []), *(found.get("features") or [])]:
        assert isinstance(feature, dict)
        lines.append(f"  {feature['name']}: {marks[feature['present']]} ({feature['detail']})")
    if found.get("refusal"):
        lines.append(f"  create fails: {found['refusal']}")
    return lines


def require(report: dict[str, object], backend: Backend) -> None:
    """For a host whose new containers run under a daemon backend: the line
    `create` would fail with, as an error."""
    found = report.get(backend.name)
    if not isinstance(found, dict):
        return
    if not found.get("reachable"):
        raise ParacellError(str(found.get("detail")))
    if found.get("refusal"):
        raise ParacellError(str(found["refusal"]))


def render(report: dict[str, object], as_json: bool, daemons: list[Backend]) -> str:
    if as_json:
        return json.dumps(report, indent=2)
    host = report["host"]
    guest = report["guest"]
    chosen = report["engine"]
    xgates = report["xgates"]
    assert isinstance(host, dict) and isinstance(guest, dict) and isinstance(chosen, dict)
    assert isinstance(xgates, dict)
    if guest.get("built"):
        guest_line = "built" + ("" if guest.get("up_to_date") else " (stale: rebuild)")
    else:
        guest_line = f"not built ({guest.get('detail')})"
    lines = [
        f"kvm:     {KIND_TEXT[host['kvm_kind']]} — {host['kvm_detail']}",
        f"pku:     {'yes' if host['host_pku'] else 'no'} on the host CPU",
        f"qemu:    {host['qemu_path'] or 'not found'} {host['qemu_version'] or ''}".rstrip(),
        f"guest:   {guest_line}",
        f"engine:  {chosen['engine'] or 'none'} ({chosen['reason']})",
        f"xgates:  {'yes' if xgates['supported'] else 'unsupported'} ({xgates['reason']})",
    ]
    built = report.get("relays")
    if isinstance(built, dict):
        lines.append(_relays_line(built))
    method = report.get("checkpoints")
    if isinstance(method, dict):
        lines.append(_checkpoints_line(method))
    shim = report.get("shim_v2")
    if isinstance(shim, dict):
        lines.append(_shim_v2_line(shim))
    pool = report.get("pool")
    if isinstance(pool, dict):
        lines.append(f"warm pool: {pool_summary(pool)}")
    for backend in daemons:
        found = report.get(backend.name)
        if isinstance(found, dict):
            lines += _daemon_lines(backend.name, found)
    return "\n".join(lines)
