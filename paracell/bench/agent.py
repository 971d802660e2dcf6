"""`paracell bench agent`: DeltaBox's workload (arXiv 2605.22781), a tree
search over a sandbox that holds a real Python project, by each way of
saving and going back to a state, in one run.

The project is CPython's `json` package with its own test suite, both from
Debian's packages (python3.11 and libpython3.11-testsuite), in /project of a
Debian python3 userland (userland.py). The container's process is the
snapshot bench's workload: it holds MEMORY_MIB of memory and rewrites
CHANGE_MIB of it on SIGUSR1, its generation in /gen.

Every node of the tree, in depth-first order: go back to its parent's state
if the sandbox is elsewhere (a rollback), check that the files and the
process's memory are the parent's (the node's first step fails otherwise),
change a source file, write a file of its own and have the process rewrite
its memory, run the tests, and save the state (a checkpoint). Siblings thus
each start from a rollback to their parent. The methods, each its own
sandbox on the same bundle, take their turn at every node (their order
rotates), so a noisy moment of the host falls on all of them:

- `paracell`: ParaCell's checkpoints and rollbacks, through the SDK
  (paracell.sandbox.Sandbox): what changed since the last one is saved,
  what differs is put back (docs/snapshots.md);
- `whole-vm`: the whole VM saved to an image directory and restored from it,
  through the runc-compatible verbs (`checkpoint --image-path
  --leave-running`; `delete` then `restore --image-path`), in this process:
  every page is written, and going back starts a new VM from the image;
- `runc+criu`: runc with CRIU, which saves the process tree, and the
  container's changed files copied beside it (an overlay's upper layer, as
  podman's `checkpoint --export` takes them); going back kills the
  container, puts the files back and restores the processes. Debian 12's
  CRIU cannot run on newer kernels, so the bench takes Debian 13's
  (bench/criu.py); where no CRIU passes `criu check`, the method is
  reported as not run, with CRIU's words.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paracell.bench import common, userland
from paracell.bench import criu as bench_criu
from paracell.bench.snapshot import WORKLOAD, host_bytes
from paracell.errors import ParacellError
from paracell.runtime.context import Context

GUEST_MIB = 512
MEMORY_MIB = 64
CHANGE_MIB = 4
NODE_FILE_KIB = 256   # the file each node writes into the project
TEST_TIMEOUT_S = 300
# The tests each node runs: the json package's own, without test_tool
# (subprocesses of python -m json.tool) and test_recursion (deep recursion,
# seconds under TCG): 108 tests.
TESTS = ("test_decode", "test_dump", "test_fail", "test_float", "test_indent", "test_pass1",
         "test_separators", "test_unicode", "test_speedups", "test_scanstring")
PROJECT = "/project"
# A checkpoint per node, and the root's, within a sandbox's limit
# (checkpoints.MAX_LIMIT); about 10 s per node per method under TCG.
MAX_NODES = 120
METHODS = ("paracell", "whole-vm", "runc+criu")
# Published figures to set beside ours.
DELTABOX = {"source": "DeltaBox, arXiv 2605.22781", "checkpoint_ms": 14, "rollback_ms": 5,
            "rollback_v2_ms": 1.86}


def stdlib_dir() -> Path:
    return Path(f"/usr/lib/python{sys.version_info.major}.{sys.version_info.minor}")


# ---- the tree


@dataclass(frozen=True)
class Node:
    path: tuple[int, ...]  # () is the root

    @property
    def name(self) -> str:
        return "n" + "-".join(str(i) for i in self.path) if self.path else "root"

    @property
    def parent(self) -> Node:
        return Node(self.path[:-1])


def tree(branching: int, depth: int) -> list[Node]:
    """Every node below the root, depth first: a node's subtree before its
    next sibling, as a search that goes deep first explores."""
    order: list[Node] = []

    def visit(node: Node) -> None:
        for i in range(branching):
            child = Node((*node.path, i))
            order.append(child)
            if len(child.path) < depth:
                visit(child)

    visit(Node(()))
    return order


def node_script(node: Node) -> str:
    """One node's work in the sandbox, as the agent's one command: check that
    it starts from its parent, change the project and the process's memory,
    run the tests. Exit codes above 2 say which check failed."""
    gen_before, gen_after = len(node.path) - 1, len(node.path)
    tests = " ".join(f"test.test_json.{t}" for t in TESTS)
    return f"""
cd {PROJECT} || exit 3
[ "$(cat NODE)" = "{node.parent.name}" ] || {{ echo "files: NODE is $(cat NODE), not \
{node.parent.name}"; exit 4; }}
[ "$(cat /gen)" = "{gen_before}" ] || {{ echo "memory: generation $(cat /gen), not \
{gen_before}"; exit 5; }}
kill -USR1 1
echo "NODE_{node.name.replace('-', '_')} = '{node.name}'" >> json/__init__.py
head -c {NODE_FILE_KIB * 1024} /dev/urandom > data-{node.name}.bin
echo {node.name} > NODE
i=0
while [ "$(cat /gen)" != "{gen_after}" ]; do
    i=$((i + 1)); [ $i -lt 400 ] || {{ echo "memory: the process did not change it"; exit 6; }}
    sleep 0.05
done
{userland.PYTHON.resolve()} -B -m unittest -q {tests} > /tmp/tests.out 2>&1 || \
{{ tail -5 /tmp/tests.out; exit 7; }}
tail -1 /tmp/tests.out
"""


# ---- the bundle


def _project(rootfs: Path) -> None:
    """CPython's json package and its tests, with test.support, into the
    userland's /project, and the root's NODE mark."""
    stdlib = stdlib_dir()
    tests = stdlib / "test" / "test_json"
    if not tests.is_dir():
        raise ParacellError(f"paracell bench agent needs {tests}: Debian's "
                            f"libpython{sys.version_info.major}.{sys.version_info.minor}-testsuite "
                            "(make deps installs it)")
    project = rootfs / PROJECT.lstrip("/")
    shutil.rmtree(project, ignore_errors=True)
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(stdlib / "json", project / "json", ignore=skip)
    (project / "test").mkdir()
    shutil.copy2(stdlib / "test" / "__init__.py", project / "test" / "__init__.py")
    for sub in ("support", "test_json"):
        shutil.copytree(stdlib / "test" / sub, project / "test" / sub, ignore=skip)
    (project / "NODE").write_text("root\n")


def bundle(base: Path, checkpoints: int) -> Path:
    from paracell.runtime.bundle import defaultspec
    from paracell.runtime.snapshots.checkpoints import LIMIT_ANNOTATION

    rootfs = userland.rootfs()
    (rootfs / "usr" / "local" / "bin" / WORKLOAD.name).write_bytes(WORKLOAD.read_bytes())
    _project(rootfs)
    path = base / "bundle"
    path.mkdir()
    config = defaultspec.default_config([str(userland.PYTHON.resolve()), "-B",
                                         f"/usr/local/bin/{WORKLOAD.name}", str(MEMORY_MIB),
                                         str(CHANGE_MIB)])
    config["root"] = {"path": str(rootfs), "readonly": False}
    config["annotations"] = {"io.paracell.snapshot": "on", LIMIT_ANNOTATION: str(checkpoints)}
    (path / "config.json").write_text(json.dumps(config))
    return path


# ---- the methods


class Method(ABC):
    """One way to save a sandbox's state and go back to it."""

    name: str

    @abstractmethod
    def start(self) -> None:
        """The sandbox runs, its process has touched its memory."""

    @abstractmethod
    def run(self, script: str) -> tuple[int, str]:
        """The exit code and output of a shell script in the sandbox."""

    @abstractmethod
    def checkpoint(self, node: Node) -> dict[str, Any]:
        """What the method says of the checkpoint it took ({}: nothing)."""

    @abstractmethod
    def rollback(self, node: Node) -> dict[str, Any]: ...

    @abstractmethod
    def host_bytes(self) -> int:
        """The sandbox's processes and guest RAM on the host now."""

    @abstractmethod
    def saved_bytes(self) -> int:
        """What its saved states hold on disk or tmpfs."""

    @abstractmethod
    def close(self) -> None: ...


def _ctx(root: Path) -> Context:
    from paracell.log import RuntimeLog

    return Context(root=str(root), log=RuntimeLog(None, "text", False))


def _tree_bytes(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
    return total


class _ParacellSandbox(Method):
    """What both ParaCell methods share: the sandbox, its commands through the SDK."""

    def __init__(self, root: Path, bundle_dir: Path, cid: str) -> None:
        self.root, self.bundle_dir, self.cid = root, bundle_dir, cid

    def start(self) -> None:
        from paracell.sandbox import Sandbox

        Sandbox.create(str(self.bundle_dir), self.cid, str(self.root))
        self._wait_for_workload()

    def _wait_for_workload(self) -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            code, out = self.run("cat /gen")
            if code == 0 and out.strip() == "0":
                return
            time.sleep(0.2)
        raise ParacellError(f"bench agent: {self.cid}: the workload never touched its memory")

    def run(self, script: str) -> tuple[int, str]:
        from paracell.sandbox import Sandbox

        done = Sandbox(self.cid, str(self.root)).run(["/bin/sh", "-c", script],
                                                     timeout=TEST_TIMEOUT_S)
        return done.exit_code, (done.stdout + done.stderr).decode(errors="replace")

    def host_bytes(self) -> int:
        return host_bytes(self.root, self.cid)

    def close(self) -> None:
        from paracell.runtime.verbs import lifecycle

        with contextlib.suppress(ParacellError):
            lifecycle.delete(_ctx(self.root), self.cid, force=True)


class ParacellCheckpoints(_ParacellSandbox):
    name = "paracell"

    def checkpoint(self, node: Node) -> dict[str, Any]:
        from paracell.sandbox import Sandbox

        return Sandbox(self.cid, str(self.root)).checkpoint(node.name)

    def rollback(self, node: Node) -> dict[str, Any]:
        from paracell.sandbox import Sandbox

        return Sandbox(self.cid, str(self.root)).rollback(node.name)

    def saved_bytes(self) -> int:
        return _tree_bytes(self.root / self.cid / "checkpoints")


class WholeVm(_ParacellSandbox):
    """runc's checkpoint and restore verbs, which ParaCell serves with a whole
    VM in an image directory (docs/snapshots.md, "runc and podman")."""

    name = "whole-vm"

    def __init__(self, root: Path, bundle_dir: Path, cid: str, images: Path) -> None:
        super().__init__(root, bundle_dir, cid)
        self.images = images

    def checkpoint(self, node: Node) -> dict[str, Any]:
        from paracell.runtime.verbs import snapshot

        image = self.images / node.name
        snapshot.runc_checkpoint(_ctx(self.root), self.cid, str(image), None,
                                 leave_running=True)
        return {"bytes": _tree_bytes(image)}

    def rollback(self, node: Node) -> dict[str, Any]:
        from paracell.runtime.verbs import lifecycle, snapshot

        ctx = _ctx(self.root)
        lifecycle.delete(ctx, self.cid, force=True)
        snapshot.runc_restore(ctx, self.cid, str(self.images / node.name), None,
                              str(self.bundle_dir), True, None)
        return {}

    def saved_bytes(self) -> int:
        return _tree_bytes(self.images)


def _host_command(cmd: list[str]) -> None:
    """A host tool the runc+criu method needs (cp, mount), its failure one line."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TEST_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ParacellError(f"bench agent: {cmd[0]} took more than {TEST_TIMEOUT_S} s") from None
    if done.returncode != 0:
        raise ParacellError(f"bench agent: {cmd[0]}: {done.stderr.strip()[-300:]}")


def _copy_tree(source: Path, dest: Path) -> None:
    """An overlay's upper layer, as it is: `cp -a` keeps its whiteouts (0:0
    character devices), hard links and the overlay's xattrs."""
    _host_command(["cp", "-a", "--", str(source), str(dest)])


class RuncCriu(Method):
    """runc with CRIU (bench/criu.py): a process tree's checkpoint, which
    leaves the container's files out. They go with it as podman's
    `container checkpoint --export` takes them, as the rootfs's changes:
    the container's root is an overlay whose upper layer is copied at each
    checkpoint and put back at each rollback. Nothing runs in the container
    between a node's command and its checkpoint, so the two agree."""

    name = "runc+criu"

    def __init__(self, base: Path, criu: str, cid: str) -> None:
        self.base, self.criu, self.cid = base, criu, cid
        self.bundle_dir, self.upper, self.work = base / "bundle", base / "upper", base / "work"
        self.saved, self.images, self.logs = base / "saved", base / "images", base / "logs"
        self.rootfs = self.bundle_dir / "rootfs"
        self._mounted = False

    def _runc(self, *args: str, timeout: float = TEST_TIMEOUT_S, detach: bool = False
              ) -> subprocess.CompletedProcess[str]:
        """Its output through files, not pipes. A container that `run` or
        `restore` detaches (`detach`) keeps runc's stdio for its life, and
        CRIU can dump no stdio but a device: /dev/null then, and runc's
        words go to its log."""
        cmd = ["runc", "--root", str(self.base / "state"), "--log", str(self.logs / "runc.log"),
               "--criu", self.criu, *args]
        try:
            return self._run_runc(cmd, timeout, detach)
        except subprocess.TimeoutExpired:
            raise ParacellError(f"bench agent: runc {args[0]} took more than {timeout:.0f} s"
                                ) from None

    @staticmethod
    def _run_runc(cmd: list[str], timeout: float, detach: bool
                  ) -> subprocess.CompletedProcess[str]:
        if detach:
            done = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, timeout=timeout)
            return subprocess.CompletedProcess(cmd, done.returncode, "", "")
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            done = subprocess.run(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                  timeout=timeout)
            out.seek(0)
            err.seek(0)
            return subprocess.CompletedProcess(cmd, done.returncode,
                                               out.read().decode(errors="replace"),
                                               err.read().decode(errors="replace"))

    def _checked(self, *args: str, detach: bool = False) -> None:
        done = self._runc(*args, detach=detach)
        if done.returncode == 0:
            return
        said = [done.stderr.strip()]
        # CRIU's first error is the cause; runc's last line says what it tried.
        for log, pick in (("runc.log", -1), ("dump.log", 0), ("restore.log", 0)):
            path = self.logs / log
            lines = path.read_text(errors="replace").splitlines() if path.exists() else []
            errors = [ln for ln in lines if "rror" in ln]
            if errors:
                said.append(errors[pick])
            path.unlink(missing_ok=True)
        raise ParacellError(f"bench agent: runc {args[0]}: {' / '.join(filter(None, said))[:600]}")

    def _mount(self) -> None:
        self.work.mkdir(exist_ok=True)
        lower = userland.rootfs()
        _host_command(["mount", "-t", "overlay", "overlay", "-o",
                       f"lowerdir={lower},upperdir={self.upper},workdir={self.work}",
                       str(self.rootfs)])
        self._mounted = True

    def _unmount(self) -> None:
        if self._mounted:
            subprocess.run(["umount", str(self.rootfs)], check=True, capture_output=True,
                           timeout=30)
            self._mounted = False
        shutil.rmtree(self.work, ignore_errors=True)

    def start(self) -> None:
        from paracell.runtime.bundle import defaultspec

        for d in (self.rootfs, self.upper, self.saved, self.images, self.logs):
            d.mkdir(parents=True)
        config = defaultspec.default_config([str(userland.PYTHON.resolve()), "-B",
                                             f"/usr/local/bin/{WORKLOAD.name}",
                                             str(MEMORY_MIB), str(CHANGE_MIB)])
        config["root"] = {"path": "rootfs", "readonly": False}
        config["process"]["terminal"] = False
        (self.bundle_dir / "config.json").write_text(json.dumps(config))
        self._mount()
        self._checked("run", "--detach", "--bundle", str(self.bundle_dir), self.cid, detach=True)
        deadline = time.monotonic() + 300
        while self.run("cat /gen")[1] != "0":  # the workload writes no newline
            if time.monotonic() > deadline:
                raise ParacellError("bench agent: runc+criu: the workload never touched its "
                                    "memory")
            time.sleep(0.2)

    def run(self, script: str) -> tuple[int, str]:
        done = self._runc("exec", self.cid, "/bin/sh", "-c", script)
        return done.returncode, done.stdout + done.stderr

    def checkpoint(self, node: Node) -> dict[str, Any]:
        image = self.images / node.name
        self._checked("checkpoint", "--leave-running", "--image-path", str(image),
                      "--work-path", str(self.logs), self.cid)
        _copy_tree(self.upper, self.saved / node.name)
        return {"bytes": _tree_bytes(image) + _tree_bytes(self.saved / node.name)}

    def rollback(self, node: Node) -> dict[str, Any]:
        self._runc("delete", "--force", self.cid)
        self._unmount()
        shutil.rmtree(self.upper)
        _copy_tree(self.saved / node.name, self.upper)
        self._mount()
        self._checked("restore", "--detach", "--image-path", str(self.images / node.name),
                      "--work-path", str(self.logs), "--bundle", str(self.bundle_dir), self.cid,
                      detach=True)
        return {}

    def host_bytes(self) -> int:
        done = self._runc("state", self.cid, timeout=30)
        pid = json.loads(done.stdout).get("pid", 0) if done.returncode == 0 else 0
        return (common.pss_of_tree([pid]) + _tree_bytes(self.upper)) if pid else 0

    def saved_bytes(self) -> int:
        return _tree_bytes(self.images) + _tree_bytes(self.saved)

    def close(self) -> None:
        with contextlib.suppress(ParacellError, OSError):
            self._runc("delete", "--force", self.cid, timeout=60)
        try:
            self._unmount()
        except (subprocess.SubprocessError, OSError):
            subprocess.run(["umount", "-l", str(self.rootfs)], capture_output=True, timeout=30)
            self._mounted = False


# ---- the run


@dataclass
class Tally:
    checkpoint_ms: list[float]
    rollback_ms: list[float]
    tests_ms: list[float]
    node_ms: list[float]
    said: dict[str, list[dict[str, Any]]]  # "checkpoint", "rollback": the method's words
    first_checkpoint_ms: float = 0.0
    host_mib: float = 0.0
    saved_mib: float = 0.0

    @classmethod
    def empty(cls) -> Tally:
        return cls([], [], [], [], {"checkpoint": [], "rollback": []})

    def report(self) -> dict[str, Any]:
        minutes = sum(self.node_ms) / 60e3
        return {"ran": True, "nodes": len(self.node_ms),
                "nodes_per_minute": len(self.node_ms) / minutes if minutes else 0.0,
                # What saving and going back cost a node, the tests aside.
                "saving_ms_per_node": (sum(self.checkpoint_ms) + sum(self.rollback_ms))
                / max(1, len(self.node_ms)),
                "checkpoint_ms": common.median_p95(self.checkpoint_ms),
                "rollback_ms": common.median_p95(self.rollback_ms),
                "tests_ms": common.median_p95(self.tests_ms),
                "checkpoint_samples_ms": [round(v, 2) for v in self.checkpoint_ms],
                "rollback_samples_ms": [round(v, 2) for v in self.rollback_ms],
                **{f"{op}_said": _medians(words) for op, words in self.said.items()},
                "first_checkpoint_ms": self.first_checkpoint_ms,
                "host_mib": self.host_mib, "saved_mib": self.saved_mib}


def _medians(said: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of every number a method said of its operations, and
    every word it used (a checkpoint's "method")."""
    out: dict[str, Any] = {}
    for key in sorted({k for words in said for k in words} - {"name", "seq"}):
        values = [w[key] for w in said if key in w]
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            out[key] = common.median_p95([float(v) for v in values])["median"]
        elif all(isinstance(v, str) for v in values):
            out[key] = sorted(set(values))
    return out


def _timed(tally: Tally, op: str, fn: Any, node: Node) -> float:
    began = time.perf_counter()
    tally.said[op].append(fn(node))
    return (time.perf_counter() - began) * 1e3


def _one_node(method: Method, node: Node, at: Node, tally: Tally) -> None:
    began = time.perf_counter()
    if at != node.parent:
        tally.rollback_ms.append(_timed(tally, "rollback", method.rollback, node.parent))
    tests_began = time.perf_counter()
    code, out = method.run(node_script(node))
    tally.tests_ms.append((time.perf_counter() - tests_began) * 1e3)
    if code != 0 or not out.strip().endswith("OK"):
        raise ParacellError(f"bench agent: {method.name}, node {node.name}: exit {code}: "
                           f"{out.strip()[-300:]}")
    tally.checkpoint_ms.append(_timed(tally, "checkpoint", method.checkpoint, node))
    tally.node_ms.append((time.perf_counter() - began) * 1e3)


def search(methods: list[Method], nodes: list[Node]
           ) -> tuple[dict[str, Tally], dict[str, str]]:
    """Each method's tally, and why each baseline that failed on the way
    stopped: its figures are dropped, the others' go on (ParaCell's failure
    ends the run)."""
    tallies = {m.name: Tally.empty() for m in methods}
    at = {m.name: Node(()) for m in methods}
    failed: dict[str, str] = {}
    running = list(methods)

    def attempt(m: Method, step: Any) -> None:
        try:
            step()
        except ParacellError as err:
            if m.name == "paracell":
                raise
            common.progress("agent", f"{m.name}: stopped: {err}")
            failed[m.name] = str(err)
            running.remove(m)
            tallies.pop(m.name)

    def first(m: Method) -> None:
        m.start()
        began = time.perf_counter()
        m.checkpoint(Node(()))
        tallies[m.name].first_checkpoint_ms = (time.perf_counter() - began) * 1e3

    for m in methods:
        common.progress("agent", f"{m.name}: starting its sandbox")
        attempt(m, lambda m=m: first(m))
    for k, node in enumerate(nodes):
        common.progress("agent", f"node {k + 1}/{len(nodes)} ({node.name})")
        turn = running[k % len(running):] + running[:k % len(running)]
        for m in turn:
            attempt(m, lambda m=m, node=node: _one_node(m, node, at[m.name], tallies[m.name]))
            at[m.name] = node
    for m in running:
        tallies[m.name].host_mib = m.host_bytes() / 2**20
        tallies[m.name].saved_mib = m.saved_bytes() / 2**20
    return tallies, failed


def goals(report: dict[str, dict[str, Any]]) -> list[tuple[str, bool]]:
    return [("nodes per minute for all three methods (ParaCell, whole-VM save and restore, "
             "runc + CRIU), from one run", all(r["ran"] for r in report.values()))]


def ratios(report: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """ParaCell's figures against each other method that ran, from the same
    run (0 where there is nothing to compare: a tree with one branch rolls
    back nothing)."""
    ours = report["paracell"]

    def over(a: float, b: float) -> float:
        return a / b if b else 0.0

    return {name: {
        "checkpoint_speedup": over(other["checkpoint_ms"]["median"],
                                   ours["checkpoint_ms"]["median"]),
        "rollback_speedup": over(other["rollback_ms"]["median"], ours["rollback_ms"]["median"]),
        "saving_per_node_speedup": over(other["saving_ms_per_node"],
                                        ours["saving_ms_per_node"]),
        "nodes_per_minute": over(ours["nodes_per_minute"], other["nodes_per_minute"]),
        "saved_bytes": over(ours["saved_mib"], other["saved_mib"]),
    } for name, other in report.items() if name != "paracell" and other["ran"]}


def run(ctx: Context, branching: int, depth: int, output: str) -> str:
    nodes = tree(branching, depth)
    base = Path(tempfile.mkdtemp(prefix="paracell-agentbench-"))
    env = {"PARACELL_GUEST_MEMORY_MIB": str(GUEST_MIB),
           "PARACELL_TEMPLATES": str(base / "templates")}
    common.progress("agent", f"state under {base}")
    criu_path, refusal = bench_criu.find() if shutil.which("runc") else \
        ("", "Debian's runc is not installed")
    if refusal:
        common.progress("agent", f"runc+criu: not run: {refusal}")
    methods: list[Method] = []
    try:
        with common.sigterm_as_interrupt(), common.environment(env):
            bundle_dir = bundle(base, len(nodes) + 1)
            root = base / "root"
            methods = [ParacellCheckpoints(root, bundle_dir, "agent-paracell"),
                       WholeVm(root, bundle_dir, "agent-wholevm", base / "images")]
            if criu_path:
                methods.append(RuncCriu(base / "criu", criu_path, f"paracell-agent-{base.name}"))
            tallies, failed = search(methods, nodes)
    finally:
        for m in methods:
            try:
                m.close()
            except Exception as err:  # the others' cleanup goes on
                common.progress("agent", f"{m.name}: its cleanup failed: {err}")
        with open("/proc/self/mountinfo") as mounts:
            mounted = str(base) in mounts.read()
        if mounted:  # never delete through a mount that is still there
            common.progress("agent", f"left {base}: a mount under it is still there")
        else:
            shutil.rmtree(base, ignore_errors=True)
    report: dict[str, dict[str, Any]] = {name: t.report() for name, t in tallies.items()}
    report.update({name: {"ran": False, "why_not": f"it failed: {why}"}
                   for name, why in failed.items()})
    if refusal:
        report["runc+criu"] = {"ran": False, "why_not": refusal}
    checked = goals(report)
    against = ratios(report)
    png = _plot(report, Path(output).with_suffix(".png"))
    common.write_result(output, {
        "benchmark": "agent", "guest_mib": GUEST_MIB, "memory_mib": MEMORY_MIB,
        "change_mib": CHANGE_MIB, "branching": branching, "depth": depth,
        "nodes": len(nodes), "tests": [f"test.test_json.{t}" for t in TESTS],
        "methods": report, "paracell_against": against, "deltabox": DELTABOX,
        "goals": {name: met for name, met in checked}, "plot": str(png)})
    said = [f"ParaCell against {name}, same run: checkpoint {r['checkpoint_speedup']:.1f}x "
            f"faster, rollback {r['rollback_speedup']:.1f}x faster, saving and going back "
            f"{r['saving_per_node_speedup']:.1f}x faster per node, "
            f"{r['nodes_per_minute']:.2f}x the nodes per minute, {r['saved_bytes']:.2f}x the "
            "bytes saved" for name, r in against.items()]
    return "\n".join([*_table(report), *said, *(f"goal {'met' if met else 'NOT met'}: {name}"
                                         for name, met in checked),
                      f"wrote {output} and {png}"])


def _table(report: dict[str, dict[str, Any]]) -> list[str]:
    lines = [f"{'method':<10} {'nodes/min':>9} {'ckpt p50':>9} {'p95':>7} {'rollback':>9} "
             f"{'p95':>7} {'saving/node':>11} {'tests':>7} {'host MiB':>9} {'saved MiB':>9} "
             f"{'per ckpt':>9}"]
    for name in METHODS:
        r = report[name]
        if not r["ran"]:
            lines.append(f"{name:<10} not run: {r['why_not']}")
            continue
        lines.append(f"{name:<10} {r['nodes_per_minute']:9.1f} "
                     f"{r['checkpoint_ms']['median']:9.1f} {r['checkpoint_ms']['p95']:7.1f} "
                     f"{r['rollback_ms']['median']:9.1f} {r['rollback_ms']['p95']:7.1f} "
                     f"{r['saving_ms_per_node']:11.1f} "
                     f"{r['tests_ms']['median']:7.0f} {r['host_mib']:9.1f} "
                     f"{r['saved_mib']:9.1f} "
                     f"{r['checkpoint_said'].get('bytes', 0) / 2**20:9.1f}")
    lines.append(f"{'DeltaBox':<10} {'':>9} {DELTABOX['checkpoint_ms']:9.1f} {'':>7} "
                 f"{DELTABOX['rollback_ms']:9.1f} {'':>7}   (published: {DELTABOX['source']}; "
                 f"its second version rolls back in {DELTABOX['rollback_v2_ms']} ms)")
    return lines


def _plot(report: dict[str, dict[str, Any]], output: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from paracell.bench.plot import save_figure

    ran = [name for name in METHODS if report[name]["ran"]]
    fig, (lat, rate) = plt.subplots(1, 2, figsize=(10, 4.5))
    xs = range(len(ran))
    for k, key in enumerate(("checkpoint_ms", "rollback_ms")):
        lat.bar([x + (k - 0.5) * 0.4 for x in xs],
                [report[n][key]["median"] for n in ran], 0.4, label=key.split("_")[0])
    for key, style in (("checkpoint_ms", ":"), ("rollback_ms", "--")):
        lat.axhline(DELTABOX[key], color="gray", ls=style, lw=1)
        lat.text(len(ran) - 0.5, DELTABOX[key] * 1.08,
                 f"DeltaBox {key.split('_')[0]} {DELTABOX[key]} ms", fontsize=7, ha="right")
    lat.set_xticks(list(xs), ran)
    lat.set_yscale("log")
    lat.set_ylabel("ms (median, log scale)")
    lat.legend(fontsize=8)
    tests = [report[n]["tests_ms"]["median"] / 1e3 for n in ran]
    saving = [report[n]["saving_ms_per_node"] / 1e3 for n in ran]
    rate.bar(list(xs), tests, label="the node's tests (median)")
    rate.bar(list(xs), saving, bottom=tests, label="saving and going back (per node)")
    for x, n in zip(xs, ran, strict=True):
        rate.text(x, tests[x] + saving[x], f"{report[n]['nodes_per_minute']:.1f} nodes/min",
                  ha="center", va="bottom", fontsize=8)
    rate.set_xticks(list(xs), ran)
    rate.set_ylabel("seconds per node")
    rate.legend(fontsize=8)
    missing = [n for n in METHODS if not report[n]["ran"]]
    fig.suptitle("Tree search over CPython's json project: the VMs under TCG, runc natively"
                 + (f" ({', '.join(missing)}: could not run here)" if missing else ""))
    return save_figure(fig, output)

