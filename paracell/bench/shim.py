"""`paracell bench shim`: how containerd reaches ParaCell, three ways,
interleaved round by round in one private containerd:
- `runc`: plain runc under containerd's runc v2 shim (the baseline of a
  container without a VM);
- `binaryname`: the same runc v2 shim with `paracell` as its BinaryName;
- `v2`: ParaCell's own shim v2 (paracell/shimv2/).

Figures per way: `ctr run --rm` of /bin/true; `ctr task exec` of /bin/true
in a running task, and of a loop of 20 /bin/true, whose difference is the
guest's own process creation; State and Kill round trips, timed over
ttrpc on the task's shim socket as containerd makes them, and an exec
of /bin/true the same way (Exec, Start, Wait, Delete); a 3-container
pod through the CRI plugin, from RunPodSandbox to the last container
running, and the PSS of that pod's shim processes with two execs running
in it, and of its QEMU apart.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

from paracell.bench import common
from paracell.bench.plot import save_figure
from paracell.runtime.context import Context

MODES = ("runc", "binaryname", "v2")
HANDLERS = {"runc": "runc", "binaryname": "paracell", "v2": "paracell-v2"}
IMAGE = "localhost/bb:latest"
PAUSE_IMAGE = "localhost/pause:paracell"
NAMESPACE = "default"
BRIDGE = "pcbench0"
SUBNET = "10.219.0.0/24"
CNI_BIN = "/usr/lib/cni"
LOOP = 20  # /bin/true runs in the exec that measures the guest's process creation
STATE_CALLS = 20
KILL_CALLS = 10
EXEC_CALLS = 5
POD_MEMBERS = 3
POD_EXECS = 2  # running in that pod while its memory is read
IDLE_S = 2.0
CTR_TIMEOUT_S = 180

GOAL_STATE_MS = 5.0
GOAL_EXEC_OVERHEAD_MS = 20.0
GOAL_POD_SHIM_MIB = 30.0


@dataclass
class PrivateContainerd:
    """containerd with its CRI plugin, state and sockets under `base`, the
    three handlers, a CNI bridge of its own, and the busybox and pause images."""

    base: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def socket(self) -> Path:
        return self.base / "containerd.sock"

    @property
    def binaryname_root(self) -> Path:
        return self.base / "paracell"

    @property
    def env(self) -> dict[str, str]:
        shim_dir = Path(common.paracell_executable()).parent
        return dict(os.environ, PATH=f"{shim_dir}:{os.environ.get('PATH', '')}",
                    PARACELL_SHIM_ROOT=str(self.base / "shim"))

    def config(self) -> str:
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        runtimes = f"{cri}.containerd.runtimes"
        return f"""version = 2
root = "{self.base}/root"
state = "{self.base}/state"
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
[{cri}.containerd]
  default_runtime_name = "runc"
[{runtimes}.runc]
  runtime_type = "io.containerd.runc.v2"
[{runtimes}.paracell]
  runtime_type = "io.containerd.runc.v2"
[{runtimes}.paracell.options]
  BinaryName = "{common.paracell_executable()}"
  Root = "{self.binaryname_root}"
[{runtimes}.paracell-v2]
  runtime_type = "io.containerd.paracell.v2"
[{cri}.cni]
  bin_dir = "{CNI_BIN}"
  conf_dir = "{self.base}/cni"
"""

    def cni(self) -> str:
        return f"""{{"cniVersion": "0.4.0", "name": "paracell-bench", "plugins": [
  {{"type": "bridge", "bridge": "{BRIDGE}", "isGateway": true, "ipMasq": false,
    "ipam": {{"type": "host-local", "ranges": [[{{"subnet": "{SUBNET}"}}]],
             "dataDir": "{self.base}/ipam"}}}},
  {{"type": "loopback"}}]}}
"""

    def start(self) -> None:
        from paracell.images.ocilayout import oci_image_tar
        from paracell.runtime.bundle import defaultspec

        for tool in ("containerd", "ctr", "gcc"):
            if not shutil.which(tool):
                raise RuntimeError(f"bench shim needs {tool}: run `make deps`")
        (self.base / "cni").mkdir(parents=True)
        (self.base / "cni" / "10-paracell-bench.conflist").write_text(self.cni())
        (self.base / "config.toml").write_text(self.config())
        log = open(self.base / "containerd.log", "wb")  # noqa: SIM115 - the daemon's
        self.proc = subprocess.Popen(["containerd", "--config", str(self.base / "config.toml")],
                                     stdout=log, stderr=log, env=self.env,
                                     start_new_session=True)
        log.close()
        deadline = time.monotonic() + 30
        while not self.socket.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"containerd did not start: see {self.base}/containerd.log")
            time.sleep(0.1)
        rootfs = defaultspec.busybox_rootfs(self.base / "bb" / "rootfs")
        pause = self.base / "pause" / "rootfs"
        pause.mkdir(parents=True)
        source = Path(__file__).resolve().parents[2] / "oci" / "kubernetes" / "pause.c"
        common.run_checked(["gcc", "-static", "-O2", "-o", str(pause / "pause"), str(source)])
        for tar in (oci_image_tar(rootfs, self.base / "bb.tar", name=IMAGE),
                    oci_image_tar(pause, self.base / "pause.tar", name=PAUSE_IMAGE,
                                  cmd=("/pause",))):
            self.ctr("images", "import", "--platform", "linux/amd64", str(tar),
                     namespace="k8s.io")
            self.ctr("images", "import", "--platform", "linux/amd64", str(tar))

    def ctr(self, *args: str, namespace: str = NAMESPACE,
            check: bool = True) -> subprocess.CompletedProcess[bytes]:
        result = subprocess.run(["ctr", "--address", str(self.socket), "-n", namespace, *args],
                                capture_output=True, timeout=CTR_TIMEOUT_S,
                                stdin=subprocess.DEVNULL, env=self.env)
        if check and result.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args[:3])}: "
                               f"{result.stderr.decode(errors='replace')[-300:]}")
        return result

    def run_args(self, mode: str) -> list[str]:
        if mode == "v2":
            return ["--runtime", "io.containerd.paracell.v2"]
        args = ["--runtime", "io.containerd.runc.v2"]
        if mode == "binaryname":
            args += ["--runc-binary", common.paracell_executable(),
                     "--runc-root", str(self.binaryname_root)]
        return args

    def bundle(self, task_id: str, namespace: str = NAMESPACE) -> Path:
        return self.base / "state" / "io.containerd.runtime.v2.task" / namespace / task_id

    def shim_socket(self, task_id: str) -> str:
        return (self.bundle(task_id) / "address").read_text().strip().removeprefix("unix://")

    def process_of(self, task_id: str) -> dict[str, Any]:
        """The task's own process object, the base of an exec's, as ctr makes one."""
        import json

        return dict(json.loads((self.bundle(task_id) / "config.json").read_text())["process"])

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        subprocess.run(["umount", "-R", "-l", str(self.base / "state")], capture_output=True)
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)


def _median(summary: dict[str, float]) -> float:
    return next(value for name, value in summary.items() if name.startswith("median"))


async def _round_trips(path: str, task_id: str, process: dict[str, Any]) -> dict[str, float]:
    """As containerd calls a task's shim, on its own socket: State; Kill
    (SIGCONT: harmless, and a real delivery); and an exec of /bin/true
    (Exec, Start, Wait, Delete), the shim's share of `ctr task exec`."""
    import json

    from google.protobuf import any_pb2, empty_pb2

    from paracell.shimv2 import messages
    from paracell.shimv2.ttrpc import Client

    api, service = messages.task_api, messages.TASK_SERVICE
    meta = {messages.NAMESPACE_METADATA_KEY: NAMESPACE}
    spec = any_pb2.Any(type_url=messages.RUNTIME_SPEC_PROCESS_URL,
                       value=json.dumps(dict(process, args=["/bin/true"], terminal=False))
                       .encode())
    async with await Client.connect(path) as client:
        async def call(method: str, request: Any, answer: Any) -> float:
            began = time.perf_counter()
            await client.call(service, method, request, answer, timeout=60, metadata=meta)
            return time.perf_counter() - began

        states = [await call("State", api.StateRequest(id=task_id), api.StateResponse)
                  for _ in range(STATE_CALLS)]
        kills = [await call("Kill", api.KillRequest(id=task_id, signal=int(signal.SIGCONT)),
                            empty_pb2.Empty) for _ in range(KILL_CALLS)]
        execs = []
        for i in range(EXEC_CALLS):
            exec_id = f"rt{i}"
            execs.append(
                await call("Exec", api.ExecProcessRequest(id=task_id, exec_id=exec_id, spec=spec),
                           empty_pb2.Empty)
                + await call("Start", api.StartRequest(id=task_id, exec_id=exec_id),
                             api.StartResponse)
                + await call("Wait", api.WaitRequest(id=task_id, exec_id=exec_id),
                             api.WaitResponse)
                + await call("Delete", api.DeleteRequest(id=task_id, exec_id=exec_id),
                             api.DeleteResponse))
    return {"state_s": median(states), "kill_s": median(kills), "shim_exec_true_s": median(execs)}


def _task_figures(daemon: PrivateContainerd, mode: str, tag: str) -> dict[str, float]:
    figures: dict[str, float] = {}
    figures["run_rm_s"] = common.time_call(lambda: daemon.ctr(
        "run", *daemon.run_args(mode), "--rm", IMAGE, f"{tag}-rm", "/bin/true"))
    task = f"{tag}-task"
    daemon.ctr("run", *daemon.run_args(mode), "-d", IMAGE, task, "sleep", "1000000")
    try:
        execs = [common.time_call(lambda i=i: daemon.ctr("task", "exec", "--exec-id", f"t{i}", task,
                                               "/bin/true")) for i in range(3)]
        loop = common.time_call(lambda: daemon.ctr(
            "task", "exec", "--exec-id", "loop", task, "sh", "-c",
            f"i=0; while [ $i -lt {LOOP} ]; do /bin/true; i=$((i+1)); done"))
        figures["exec_true_s"] = median(execs)
        # The loop's exec costs what the first did, plus LOOP guest processes.
        figures["guest_process_s"] = max(loop - figures["exec_true_s"], 0.0) / LOOP
        figures |= asyncio.run(_round_trips(daemon.shim_socket(task), task,
                                            daemon.process_of(task)))
    finally:
        daemon.ctr("task", "kill", "-s", "SIGKILL", task, check=False)
        deadline = time.monotonic() + 60
        while daemon.ctr("task", "delete", task, check=False).returncode != 0 \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        daemon.ctr("containers", "delete", task, check=False)
    return figures


def _pod_processes(pod_id: str) -> tuple[list[int], list[int], list[int]]:
    """The pod's shim (runc's or ours), its descendants apart from its QEMU,
    and its QEMU."""
    import psutil

    marks = ("containerd-shim-runc-v2", "paracell.shimv2.command")
    tops = {p.pid: p.info["ppid"] for p in psutil.process_iter(["cmdline", "ppid"])
            if any(m in " ".join(p.info["cmdline"] or []) for m in marks)
            and f"-id {pod_id}" in " ".join(p.info["cmdline"] or [])}
    roots = [pid for pid, parent in tops.items() if parent not in tops]
    shims, vmms = [], []
    for pid in {p for root in roots for p in common.process_tree(root)}:
        try:
            is_vmm = "qemu-system" in " ".join(psutil.Process(pid).cmdline())
        except psutil.Error:
            continue
        (vmms if is_vmm else shims).append(pid)
    return roots, shims, vmms


def _pss(pid: int) -> int:
    import psutil

    try:
        return int(psutil.Process(pid).memory_full_info().pss)
    except psutil.Error:
        return 0


def _pod_figures(daemon: PrivateContainerd, mode: str, tag: str) -> dict[str, float]:
    from paracell.cri.client import CriClient

    logs = daemon.base / "logs" / tag
    logs.mkdir(parents=True)
    pod_config = {"metadata": {"name": tag, "uid": f"uid-{tag}", "namespace": "bench"},
                  "hostname": tag, "log_directory": str(logs),
                  "linux": {"cgroup_parent": f"/paracell-bench-{os.getpid()}"}}
    with CriClient(daemon.socket) as client:
        began = time.perf_counter()
        pod = client.run_pod(pod_config, HANDLERS[mode])
        try:
            ids = []
            for i in range(POD_MEMBERS):
                config = {"metadata": {"name": f"c{i}"}, "image": {"image": IMAGE},
                          "command": ["sleep", "1000000"], "log_path": f"c{i}.log"}
                ids.append(client.create(pod, config, pod_config))
                client.start(ids[-1])
            deadline = time.monotonic() + 120
            while not all(client.pb.ContainerState.Name(client.status(c).state)
                          == "CONTAINER_RUNNING" for c in ids):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the {mode} pod's containers never all ran")
                time.sleep(0.05)
            ready = time.perf_counter() - began
            # The pod: three containers and two execs that run on.
            for i in range(POD_EXECS):
                daemon.ctr("task", "exec", "--detach", "--exec-id", f"x{i}", ids[i],
                           "sleep", "1000000", namespace="k8s.io")
            time.sleep(IDLE_S)
            roots, shims, vmms = _pod_processes(pod)
            # Each set on its own: pss_of_tree would count a shim's QEMU child with it.
            return {"pod_ready_s": ready,
                    "pod_shim_mib": sum(_pss(p) for p in shims) / (1 << 20),
                    "pod_shim_processes": float(len(shims)),
                    # The shim containerd talks to, alone: the daemon, or runc's shim.
                    "pod_shim_root_mib": sum(_pss(p) for p in roots) / (1 << 20),
                    "pod_vmm_mib": sum(_pss(p) for p in vmms) / (1 << 20)}
        finally:
            client.stop_pod(pod)
            client.remove_pod(pod)


def goals(results: dict[str, dict[str, dict[str, float]]]) -> list[dict[str, Any]]:
    v2, binary = results["v2"], results["binaryname"]

    def med(of: dict[str, dict[str, float]], key: str) -> float:
        return _median(of[key])

    guest = med(v2, "guest_process_s")
    return [
        {"goal": f"State through the shim v2 <= {GOAL_STATE_MS} ms",
         "value_ms": med(v2, "state_s") * 1e3, "binaryname_ms": med(binary, "state_s") * 1e3,
         "met": med(v2, "state_s") * 1e3 <= GOAL_STATE_MS},
        {"goal": f"exec of /bin/true <= the guest's own process creation + "
                 f"{GOAL_EXEC_OVERHEAD_MS:.0f} ms",
         "value_ms": med(v2, "shim_exec_true_s") * 1e3, "guest_process_ms": guest * 1e3,
         "binaryname_ms": med(binary, "shim_exec_true_s") * 1e3,
         "through_ctr_ms": med(v2, "exec_true_s") * 1e3,
         "met": med(v2, "shim_exec_true_s") <= guest + GOAL_EXEC_OVERHEAD_MS / 1e3},
        {"goal": f"a 3-container pod's shim processes, two execs running, <= "
                 f"{GOAL_POD_SHIM_MIB:.0f} MiB PSS",
         "value_mib": med(v2, "pod_shim_mib"), "binaryname_mib": med(binary, "pod_shim_mib"),
         "met": med(v2, "pod_shim_mib") <= GOAL_POD_SHIM_MIB},
    ]


def run(ctx: Context, rounds: int, output: str) -> str:
    import tempfile

    samples: dict[str, dict[str, list[float]]] = {mode: {} for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="paracell-bench-shim-") as tmp:
        daemon = PrivateContainerd(Path(tmp))
        try:
            common.progress("shim", "starting a private containerd and importing images")
            daemon.start()
            for r in range(rounds):
                # Rotate who goes first, so that none always meets a cold cache.
                order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
                for mode in order:
                    common.progress("shim", f"round {r + 1}/{rounds}: {mode}")
                    tag = f"bench-{r}-{mode}"
                    figures = _task_figures(daemon, mode, tag) | _pod_figures(daemon, mode, tag)
                    for key, value in figures.items():
                        samples[mode].setdefault(key, []).append(value)
        finally:
            daemon.stop()
    results = {mode: {key: common.summarize(values, "mib" if key.endswith("mib") else
                                            "count" if key.endswith("processes") else "s")
                      for key, values in by.items()} for mode, by in samples.items()}
    met = goals(results)
    result = {"benchmark": "containerd to ParaCell: runc v2 + BinaryName against the shim v2",
              "rounds": rounds, "engine": ctx.engine, "results": results, "goals": met}
    path = common.write_result(output, result)
    _plot(results, path.with_suffix(".png"))
    lines = []
    for mode in MODES:
        fig = {key: _median(summary) for key, summary in results[mode].items()}
        lines.append(
            f"{mode}: run --rm {fig['run_rm_s']:.3f} s, exec {fig['exec_true_s'] * 1e3:.0f} ms "
            f"through ctr, {fig['shim_exec_true_s'] * 1e3:.0f} ms at the shim "
            f"(guest process {fig['guest_process_s'] * 1e3:.1f} ms), State "
            f"{fig['state_s'] * 1e3:.2f} ms, Kill {fig['kill_s'] * 1e3:.2f} ms, 3-container pod "
            f"{fig['pod_ready_s']:.2f} s, its shims {fig['pod_shim_mib']:.1f} MiB in "
            f"{fig['pod_shim_processes']:.0f} processes, its QEMU {fig['pod_vmm_mib']:.1f} MiB")
    lines += [f"{g['goal']}: {'met' if g['met'] else 'NOT met'}" for g in met]
    return "\n".join([*lines, f"-> {path}"])


def _plot(results: dict[str, Any], output: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("shim_exec_true_s", "exec of /bin/true at the shim (ms)", 1e3),
              ("state_s", "State (ms)", 1e3),
              ("pod_ready_s", "3-container pod ready (s)", 1.0),
              ("pod_shim_mib", "pod's shim processes (MiB PSS)", 1.0)]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6))
    for ax, (key, title, scale) in zip(axes, panels, strict=True):
        values = [_median(results[m][key]) * scale for m in MODES]
        ax.bar(MODES, values, color=["#888888", "#4C72B0", "#55A868"])
        ax.set_title(title, fontsize=10)
    fig.suptitle("containerd to ParaCell: runc, runc v2 + BinaryName, shim v2 (medians)")
    return save_figure(fig, output)
