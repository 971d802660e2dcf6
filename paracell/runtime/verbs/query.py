"""Verbs that only look: ps, list, features."""

from __future__ import annotations

import json
import sys
from typing import Any

from paracell import OCI_VERSION
from paracell.errors import ParacellError
from paracell.runtime.bundle import spec
from paracell.runtime.context import Context
from paracell.runtime.inguest import mountopts, seccomp
from paracell.runtime.state import status
from paracell.runtime.state.store import ContainerState
from paracell.runtime.verbs.lifecycle import oci_state


def host_pids(ctx: Context, state: ContainerState) -> list[int]:
    """The shim stands for init; each exec proxy for its process. These are the
    pids a client can wait on and signal; guest pids are not host processes."""
    if not status.stands_for_a_process(state.status):
        return []
    from paracell.runtime.verbs.execproc import EXECS_DIR, exec_marker_alive

    pids = [state.shim_pid]
    execs = ctx.store.dir(state.id) / EXECS_DIR
    if execs.is_dir():
        pids += sorted(int(entry.name) for entry in execs.iterdir() if exec_marker_alive(entry))
    return pids


def ps(ctx: Context, container_id: str, fmt: str) -> str:
    state = ctx.store.load(container_id)
    status.transition("ps", state.status, container_id)
    pids = host_pids(ctx, state)
    if fmt == "json":
        return json.dumps(pids)
    import psutil

    rows = ["PID    ROLE    COMMAND"]
    for i, pid in enumerate(pids):
        try:
            cmd = " ".join(psutil.Process(pid).cmdline())[:60]
        except psutil.Error:
            cmd = "?"
        rows.append(f"{pid:<6} {'init' if i == 0 else 'exec':<7} {cmd}")
    return "\n".join(rows)


def list_containers(ctx: Context, fmt: str, quiet: bool) -> str:
    states = []
    for cid in ctx.store.list_ids():
        try:
            states.append(ctx.store.load(cid))
        except ParacellError as err:
            # As runc: one bad container must not hide the others.
            print(f"paracell: list: skipping {cid}: {err}", file=sys.stderr)
            ctx.log.warning(f"list: skipping {cid}: {err}")
    if quiet:
        return "\n".join(s.id for s in states)
    if fmt == "json":
        return json.dumps([oci_state(s) for s in states])
    rows = [f"{'ID':<24} {'PID':<8} {'STATUS':<10} {'BUNDLE':<40} CREATED"]
    for s in states:
        pid = s.shim_pid if status.stands_for_a_process(s.status) else 0
        rows.append(f"{s.id:<24} {pid:<8} {s.status:<10} {s.bundle:<40} {s.created}")
    return "\n".join(rows)


def features() -> dict[str, Any]:
    return {
        "ociVersionMin": "1.0.0",
        "ociVersionMax": OCI_VERSION,
        "hooks": ["prestart", "createRuntime", "poststart", "poststop"],
        "mountOptions": mountopts.option_names(),
        "linux": {
            "namespaces": ["mount", "pid", "uts", "ipc", "user", "cgroup", "network"],
            "capabilities": [f"CAP_{name}" for name in spec.CAPABILITIES],
            # The host cgroup of the shim and QEMU (runtime/host/cgroups/); systemd
            # paths only where systemd is PID 1.
            "cgroup": {"v1": True, "v2": True, "systemd": False},
            "seccomp": seccomp.features(),
            "apparmor": {"enabled": False},
            "selinux": {"enabled": False},
        },
        "annotations": {"io.paracell.engine": "tcg|kvm", "io.paracell.isolation": "micro-vm"},
    }
