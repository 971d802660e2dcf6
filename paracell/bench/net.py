"""`paracell bench net`: TCP throughput and request round trips from a
container to the host side of its veth, ParaCell against runc, interleaved.

The bench wires two network namespaces of its own with a veth pair, as CNI
would: the container's (10.211.0.2) and a "host" one (10.211.0.1) where the
server runs, so nothing touches the machine's own network. Both runtimes get
the same bundle, joined to the same namespace by path, and run the same
static program (paracell/bench/programs/netload.c) against the same server.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from paracell.bench import common, plot, programs
from paracell.errors import ParacellError
from paracell.runtime.bundle import defaultspec
from paracell.runtime.context import Context

HOST_ADDR, CONTAINER_ADDR, PREFIX = "10.211.0.1", "10.211.0.2", 24
PORT = 5201
# What a containerised agent needs from its network: bulk transfers at
# 1 Gbit/s and a request round trip (mean) well under a millisecond. The
# output says which engine ran: under TCG the guest's CPU is emulated.
GOAL_MBIT = 1000.0
GOAL_RTT_US = 500.0
RUN_TIMEOUT_S = 300


@contextmanager
def _wired() -> Iterator[tuple[str, str]]:
    """(container namespace path, host-side namespace path), removed afterwards."""
    from pyroute2 import IPRoute
    from pyroute2 import netns as pr_netns

    from paracell.net import netns

    names = [f"pcbench{side}{os.getpid()}" for side in ("ct", "host")]
    paths = [f"/run/netns/{n}" for n in names]
    made = []
    try:
        for name in names:
            pr_netns.create(name)
            made.append(name)

        def wire() -> None:
            with IPRoute() as ipr:
                ipr.link("add", ifname="eth0", kind="veth",
                         peer={"ifname": "host0", "net_ns_fd": paths[1]})
                index = ipr.link_lookup(ifname="eth0")[0]
                ipr.link("set", index=index, state="up")
                ipr.addr("add", index=index, address=CONTAINER_ADDR, prefixlen=PREFIX)

        def host_side() -> None:
            with IPRoute() as ipr:
                index = ipr.link_lookup(ifname="host0")[0]
                ipr.link("set", index=index, state="up")
                ipr.addr("add", index=index, address=HOST_ADDR, prefixlen=PREFIX)
        netns.run_inside(paths[0], wire)
        netns.run_inside(paths[1], host_side)
        yield paths[0], paths[1]
    finally:
        for name in made:
            pr_netns.remove(name)


def _bundle(netns_path: str, seconds: float) -> Path:
    bundle = common.bench_dir() / "net"
    bundle.mkdir(exist_ok=True)
    load = "/usr/local/bin/netload"
    config = defaultspec.default_config(
        ["sh", "-c", f"{load} stream {HOST_ADDR} {PORT} {seconds} && "
                     f"{load} rr {HOST_ADDR} {PORT} {seconds}"])
    rootfs = programs.busybox_rootfs_with("netload", common.bench_dir() / "net-rootfs")
    config["root"] = {"path": str(rootfs), "readonly": True}
    config["linux"]["namespaces"].append({"type": "network", "path": netns_path})
    (bundle / "config.json").write_text(json.dumps(config))
    return bundle


@contextmanager
def _server(host_ns: str) -> Iterator[None]:
    from paracell.net import netns

    proc = subprocess.Popen([str(programs.built("netload")), "server", str(PORT)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, preexec_fn=lambda: netns.join(host_ns))
    try:
        assert proc.stdout is not None
        if not proc.stdout.readline().startswith(b"listening"):
            raise ParacellError("bench net: the server did not start")
        yield
    finally:
        proc.kill()
        proc.wait()


def _parse(out: str) -> dict[str, float]:
    """netload's two lines: throughput in Mbit/s, round trips in µs. The mean
    round trip is the whole test's time over its count: it holds even when a
    TCG guest's clock falls back to jiffies (4 ms steps), which turns the
    per-trip median and p99 into 0 or 4000 µs; those are kept as measured."""
    fields = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip()}
    try:
        nbytes, took = (float(v) for v in fields["stream"][:2])
        count, rr_took, median_us, p99_us = (float(v) for v in fields["rr"][:4])
        mean_us = rr_took / count * 1e6
    except (KeyError, ValueError, ZeroDivisionError) as err:
        raise ParacellError(f"bench net: unexpected output {out[-200:]!r}") from err
    return {"mbit_s": nbytes * 8 / took / 1e6, "rtt_mean_us": mean_us,
            "rtt_median_us": median_us, "rtt_p99_us": p99_us, "round_trips": count}


def _run(cmd: list[str]) -> dict[str, float]:
    result = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True,
                            timeout=RUN_TIMEOUT_S)
    if result.returncode != 0:
        raise ParacellError(f"bench net: {' '.join(cmd[:1] + cmd[-3:])} failed: "
                            f"{result.stderr.decode(errors='replace').strip()[-300:]}")
    return _parse(result.stdout.decode())


def _summary(runs: list[dict[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": runs}
    for key in ("mbit_s", "rtt_mean_us", "rtt_median_us", "rtt_p99_us"):
        values = [r[key] for r in runs]
        out[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    return out


def run(ctx: Context, rounds: int, seconds: float, output: str) -> str:
    from paracell.vmm import probe

    engine = probe.choose_engine(ctx.engine, probe.probe_host()).engine
    paracell = common.paracell_executable()
    root = common.state_root()
    runc = common.oci_runtime("runc")
    variants = ["paracell", *(["runc"] if runc else [])]
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    with _wired() as (ct_ns, host_ns), _server(host_ns), \
            tempfile.TemporaryDirectory(prefix="paracell-bench-") as tmp:
        bundle = _bundle(ct_ns, seconds)
        for i in range(rounds):
            # Alternate who goes first, so that drift hits both alike.
            for variant in (variants if i % 2 == 0 else variants[::-1]):
                cid = f"bench-net-{os.getpid()}-{i}"
                if variant == "paracell":
                    cmd = [paracell, "--root", root, "--engine", engine, "--no-template",
                           "run", "--bundle", str(bundle), cid]
                else:
                    cmd = [str(runc), "--root", f"{tmp}/runc", "run", "--bundle", str(bundle),
                           cid]
                runs[variant].append(_run(cmd))
    stats = {v: _summary(r) for v, r in runs.items()}
    ours = stats["paracell"]
    result: dict[str, Any] = {
        "benchmark": "TCP from a container to the host side of its veth",
        "engine": engine, "seconds_per_test": seconds, "rounds": rounds, "results": stats,
        "goal": {"mbit_s": GOAL_MBIT, "rtt_mean_us": GOAL_RTT_US,
                 "met": ours["mbit_s"]["median"] >= GOAL_MBIT
                 and ours["rtt_mean_us"]["median"] <= GOAL_RTT_US},
    }
    if runc:
        result["ratio_to_runc"] = {
            "throughput": ours["mbit_s"]["median"] / stats["runc"]["mbit_s"]["median"],
            "rtt": ours["rtt_mean_us"]["median"] / stats["runc"]["rtt_mean_us"]["median"],
        }
    path = common.write_result(output, result)
    # The chart shows round trips: the figure an agent's API calls feel.
    plot.bar_chart({v: {"median_s": s["rtt_mean_us"]["median"] / 1e6,
                        "min_s": s["rtt_mean_us"]["min"] / 1e6,
                        "max_s": s["rtt_mean_us"]["max"] / 1e6} for v, s in stats.items()},
                   f"TCP round trip (mean), container to host ({engine})", 1e6, "µs",
                   path.with_suffix(".png"))
    parts = [f"{v}: {s['mbit_s']['median']:.0f} Mbit/s, round trip "
             f"{s['rtt_mean_us']['median']:.0f} µs" for v, s in stats.items()]
    if runc:
        ratio = result["ratio_to_runc"]
        parts.append(f"ParaCell/runc: throughput {ratio['throughput']:.3f}x, "
                     f"round trip {ratio['rtt']:.1f}x")
    verdict = "met" if result["goal"]["met"] else "not met"
    return (f"{'; '.join(parts)}; goal (>= {GOAL_MBIT:.0f} Mbit/s, <= {GOAL_RTT_US:.0f} µs) "
            f"{verdict} ({engine}) -> {path}")
