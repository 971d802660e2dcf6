"""The `paracell` command: runc-compatible verbs plus check, guest and bench.

Imports stay inside the commands: containerd runs `state`, `kill` and `delete`
often, and they must not pay for QEMU, cffi or the bench code.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import click

from paracell import OCI_VERSION, __version__, globalopts
from paracell.errors import ParacellError
from paracell.log import RuntimeLog
from paracell.runtime.context import Context


def _version_text() -> str:
    return (
        f"paracell version {__version__}\nspec: {OCI_VERSION}\n"
        f"python: {sys.version.split()[0]}"
    )


def _global_options(group: Callable[..., None]) -> Callable[..., None]:
    """The global options, from their one definition (paracell/globalopts.py)."""
    from paracell import settings
    from paracell.vmm import backends

    words = {"engines": settings.ENGINES, "memory managers": settings.MEMORY_MANAGERS,
             "backends": backends.NAMES, "log formats": globalopts.LOG_FORMATS}
    for name, dest, valued, _, choices, default, text in reversed(globalopts.OPTIONS):
        kind = click.Choice(list(words[choices])) if choices else None
        option = click.option(name, dest, is_flag=not valued, type=kind, default=default,
                              show_default=name == "--root", help=text or None,
                              hidden=not text)
        group = option(group)
    return group


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@_global_options
@click.version_option(__version__, "-v", "--version", message=_version_text())
@click.pass_context
def main(
    ctx: click.Context, root: str, log_path: str | None, log_format: str, debug: bool,
    systemd_cgroup: bool, rootless: str, criu: str | None, engine: str | None,
    memory_manager: str | None, no_template: bool, vmm: str | None, libvirt_uri: str | None,
) -> None:
    """ParaCell: an OCI runtime that runs every container in its own micro-VM."""
    log = RuntimeLog(log_path, log_format, debug)
    # The shim leaves the caller's directory (chdir "/"): a relative root
    # would name another place there.
    ctx.obj = Context(root=os.path.abspath(root), log=log, engine_flag=engine,
                      memory_manager=memory_manager, systemd_cgroup=systemd_cgroup,
                      no_template=no_template, vmm_flag=vmm, libvirt_uri_flag=libvirt_uri)


def _ctx() -> Context:
    return click.get_current_context().obj


@main.command()
@click.option("--bundle", "-b", default=".", help="bundle directory")
@click.option("--pid-file", default=None)
@click.option("--console-socket", default=None)
@click.option("--no-pivot", is_flag=True, hidden=True)
@click.option("--no-new-keyring", is_flag=True, hidden=True)
@click.option("--preserve-fds", default=0, type=int, hidden=True)
@click.argument("container_id")
def create(bundle: str, pid_file: str | None, console_socket: str | None, no_pivot: bool,
           no_new_keyring: bool, preserve_fds: int, container_id: str) -> None:
    """Create a container: boot its VM and prepare its process."""
    from paracell.runtime.verbs import lifecycle

    lifecycle.create(_ctx(), container_id, bundle, pid_file, console_socket)


@main.command()
@click.argument("container_id")
def start(container_id: str) -> None:
    """Start the process of a created container."""
    from paracell.runtime.verbs import lifecycle

    lifecycle.start(_ctx(), container_id)


@main.command()
@click.option("--bundle", "-b", default=".")
@click.option("--pid-file", default=None)
@click.option("--console-socket", default=None)
@click.option("--detach", "-d", is_flag=True)
@click.option("--keep", is_flag=True, help="do not delete the container after it exits")
@click.option("--no-pivot", is_flag=True, hidden=True)
@click.option("--no-new-keyring", is_flag=True, hidden=True)
@click.argument("container_id")
def run(bundle: str, pid_file: str | None, console_socket: str | None, detach: bool, keep: bool,
        no_pivot: bool, no_new_keyring: bool, container_id: str) -> None:
    """Create and start a container, and wait for it unless --detach."""
    from paracell.runtime.verbs import lifecycle

    status = lifecycle.run(_ctx(), container_id, bundle, pid_file, console_socket, detach, keep)
    sys.exit(status)


@main.command()
@click.argument("container_id")
def state(container_id: str) -> None:
    """Print the OCI state of a container."""
    from paracell.runtime.verbs import lifecycle

    st = _ctx().store.load(container_id)
    click.echo(json.dumps(lifecycle.oci_state(st), indent=2))


@main.command()
@click.option("--all", "-a", "all_processes", is_flag=True)
@click.argument("container_id")
@click.argument("signal_name", default="SIGTERM")
def kill(all_processes: bool, container_id: str, signal_name: str) -> None:
    """Send a signal to the container's init (or every process with --all)."""
    from paracell.runtime.agent import signals
    from paracell.runtime.verbs import kill as verb

    verb.kill(_ctx(), container_id, signals.parse_signal(signal_name), all_processes)


@main.command()
@click.option("--force", "-f", is_flag=True)
@click.argument("container_id")
def delete(force: bool, container_id: str) -> None:
    """Delete a stopped container (any container with --force)."""
    from paracell.runtime.verbs import lifecycle

    lifecycle.delete(_ctx(), container_id, force)


@main.command("exec", context_settings={"allow_interspersed_args": False})
@click.option("--process", "-p", "process_file", default=None, help="process.json")
@click.option("--detach", "-d", is_flag=True)
@click.option("--pid-file", default=None)
@click.option("--console-socket", default=None)
@click.option("--tty", "-t", is_flag=True)
@click.option("--cwd", default=None)
@click.option("--env", "-e", multiple=True)
@click.option("--user", "-u", default=None, help="UID[:GID]")
@click.option("--additional-gids", "-g", multiple=True, type=int)
@click.option("--no-new-privs", is_flag=True)
@click.option("--cap", "-c", multiple=True)
@click.option("--preserve-fds", default=0, type=int, hidden=True)
@click.argument("container_id")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def exec_(process_file: str | None, detach: bool, pid_file: str | None,
          console_socket: str | None, tty: bool, cwd: str | None, env: tuple[str, ...],
          user: str | None, additional_gids: tuple[int, ...], no_new_privs: bool,
          cap: tuple[str, ...], preserve_fds: int, container_id: str,
          command: tuple[str, ...]) -> None:
    """Run another process inside a running container."""
    from paracell.runtime.verbs import execproc

    process = execproc.process_from_args(
        _ctx(), container_id, process_file, command, tty, cwd, env, user,
        additional_gids, no_new_privs, cap,
    )
    status = execproc.exec_process(_ctx(), container_id, process, detach, pid_file,
                                   console_socket)
    sys.exit(status)


@main.command()
@click.option("--format", "-f", "fmt", type=click.Choice(["table", "json"]), default="table")
@click.argument("container_id")
@click.argument("ps_args", nargs=-1)
def ps(fmt: str, container_id: str, ps_args: tuple[str, ...]) -> None:
    """List the host pids that stand for the container's processes."""
    from paracell.runtime.verbs import query

    click.echo(query.ps(_ctx(), container_id, fmt))


@main.command()
@click.option("--stats", "once", is_flag=True, help="print one stats event and exit")
@click.option("--interval", default=5, type=click.IntRange(1, 3600), show_default=True,
              help="seconds between stats events")
@click.argument("container_id")
def events(once: bool, interval: int, container_id: str) -> None:
    """Stats of the container's VM: runc's events JSON plus a paracell section."""
    import json

    from paracell.runtime.verbs import events as container_events

    if once:
        click.echo(json.dumps(container_events.stats(_ctx(), container_id)))
        return
    for line in container_events.stream(_ctx(), container_id, interval):
        click.echo(line)


@main.group()
def template() -> None:
    """VM templates: saved VMs that creates restore instead of booting."""


@template.command("build")
@click.option("--for", "bundle", default=None, help="bundle whose VM shape to build (default: "
              "the example busybox bundle)")
def template_build(bundle: str | None) -> None:
    """Boot a VM of the bundle's shape cold and save it as its template."""
    from paracell.runtime.verbs import template as verb

    click.echo(verb.build(_ctx(), bundle))


@template.command("list")
@click.option("--format", "-f", "fmt", type=click.Choice(["table", "json"]), default="table")
def template_list(fmt: str) -> None:
    """The templates in the store, most recently used first."""
    from paracell.runtime.verbs import template as verb

    click.echo(verb.list_templates(fmt))


@template.command("rm")
@click.option("--all", "everything", is_flag=True, help="every template")
@click.argument("keys", nargs=-1)
def template_rm(keys: tuple[str, ...], everything: bool) -> None:
    """Remove templates by key (see `template list`)."""
    from paracell.runtime.verbs import template as verb

    click.echo(verb.remove(keys, everything))


@main.group()
def pool() -> None:
    """The warm pool: VMs restored ahead of the creates that take them (docs/pool.md)."""


@pool.command("serve")
@click.option("--size", default=2, show_default=True, help="VMs to keep waiting, of each size")
@click.option("--budget-mib", default=256, show_default=True,
              help="the most the waiting VMs may hold (their PSS)")
@click.option("--min-available-mib", default=512, show_default=True,
              help="below this much available host memory, waiting VMs end")
@click.option("--memory-mib", type=int, multiple=True,
              help="a size of VM to keep, repeatable: a create is served where its own VM "
                   "would have had as much  [default: guest_memory_mib, a container's]")
@click.option("--pods", is_flag=True,
              help="VMs of a pod's size (pod_memory_mib), for the pods of CRI's root")
@click.option("--containers", is_flag=True,
              help="VMs of a container's size (guest_memory_mib), with --pods or --memory-mib")
def pool_serve(size: int, budget_mib: int, min_available_mib: int,
               memory_mib: tuple[int, ...], pods: bool, containers: bool) -> None:
    """Keep VMs waiting for this --root's creates, until stopped (SIGTERM, ^C)."""
    from paracell import settings
    from paracell.runtime.pod import pooled
    from paracell.runtime.pool import daemon

    shapes = list(memory_mib)
    if pods:
        shapes.append(settings.pod_memory_mib())
    if containers or not shapes:
        shapes.append(settings.guest_memory_mib())
    # --pods with a --memory-mib of the same size asks for one kind of VM.
    config = daemon.PoolSettings(size, budget_mib, min_available_mib,
                                 tuple(dict.fromkeys(shapes)))
    config.check()  # before the root is made
    ctx = _ctx()
    daemon.Pool(ctx, config, {pooled.kind_of(ctx, mib): mib for mib in config.shapes}).serve()


@pool.command("status")
@click.option("--format", "-f", "fmt", type=click.Choice(["table", "json"]), default="table")
def pool_status(fmt: str) -> None:
    """What the pool of this --root holds and costs."""
    from paracell.runtime.pool import report

    root = _ctx().root
    status = report.ask(root)
    click.echo(report.render(status, root, fmt))
    if status is None:
        raise SystemExit(1)


@main.group()
def sandbox() -> None:
    """A snapshot-mode sandbox's checkpoints: checkpoint, roll back (docs/snapshots.md)."""


@sandbox.command("checkpoint")
@click.option("--name", default=None, help="the checkpoint's name (default: ckpt-SEQ)")
@click.option("--format", "-f", "fmt", type=click.Choice(["text", "json"]), default="text")
@click.argument("container_id")
def sandbox_checkpoint(container_id: str, name: str | None, fmt: str) -> None:
    """Pause, save what changed since the last checkpoint, resume; prints its name."""
    from paracell.runtime.verbs import snapshot

    done = snapshot.checkpoint(_ctx(), container_id, name)
    click.echo(json.dumps(done) if fmt == "json" else done["name"])


@sandbox.command("rollback")
@click.option("--format", "-f", "fmt", type=click.Choice(["text", "json"]), default="text")
@click.argument("container_id")
@click.argument("name")
def sandbox_rollback(container_id: str, name: str, fmt: str) -> None:
    """Return the running sandbox to a checkpoint: memory, processes, files."""
    from paracell.runtime.verbs import snapshot

    done = snapshot.rollback(_ctx(), container_id, name)
    if fmt == "json":
        click.echo(json.dumps(done))


@sandbox.command("fork")
@click.option("--count", "-n", default=1, show_default=True, type=int)
@click.option("--id-prefix", default=None, help="the forks' ids are PREFIX1..PREFIXn "
              "(default: ID-fork-)")
@click.option("--private-memory", is_flag=True, help="each fork gets a copy of the "
              "checkpoint's memory, and can itself be checkpointed (default: forks share it)")
@click.option("--netns", "netns_paths", multiple=True, metavar="PATH",
              help="a network namespace for the next fork, once per fork (a CRI or podman "
              "sandbox's): its VM takes the interfaces there; without, a fork of a sandbox "
              "with interfaces has loopback only")
@click.argument("container_id")
@click.argument("name", required=False)
def sandbox_fork(container_id: str, name: str | None, count: int, id_prefix: str | None,
                 private_memory: bool, netns_paths: tuple[str, ...]) -> None:
    """Start COUNT sandboxes that go on from checkpoint NAME (or from now)."""
    from paracell.runtime.verbs import snapshot

    for fid in snapshot.fork(_ctx(), container_id, name, count, id_prefix, private_memory,
                             list(netns_paths)):
        click.echo(fid)


@sandbox.command("checkpoints")
@click.option("--format", "-f", "fmt", type=click.Choice(["table", "json"]), default="table")
@click.argument("container_id")
def sandbox_checkpoints(container_id: str, fmt: str) -> None:
    """List a sandbox's checkpoints, oldest first."""
    from paracell.runtime.verbs import snapshot

    click.echo(snapshot.listing(_ctx(), container_id, fmt))


@sandbox.command("rm-checkpoint")
@click.argument("container_id")
@click.argument("name")
def sandbox_rm_checkpoint(container_id: str, name: str) -> None:
    """Remove a checkpoint."""
    from paracell.runtime.verbs import snapshot

    snapshot.remove(_ctx(), container_id, name)


@main.command("list")
@click.option("--format", "-f", "fmt", type=click.Choice(["table", "json"]), default="table")
@click.option("--quiet", "-q", is_flag=True)
def list_(fmt: str, quiet: bool) -> None:
    """List containers."""
    from paracell.runtime.verbs import query

    click.echo(query.list_containers(_ctx(), fmt, quiet))


@main.command()
@click.argument("container_id")
def pause(container_id: str) -> None:
    """Pause every process of the container (stops its vCPUs)."""
    from paracell.runtime.verbs import pause as verb

    verb.pause(_ctx(), container_id)


@main.command()
@click.argument("container_id")
def resume(container_id: str) -> None:
    """Resume a paused container."""
    from paracell.runtime.verbs import pause as verb

    verb.resume(_ctx(), container_id)


@main.command()
def features() -> None:
    """Print what this runtime supports, as runc features does."""
    from paracell.runtime.verbs import query

    click.echo(json.dumps(query.features(), indent=2))


@main.command()
@click.option("--bundle", "-b", default=".")
@click.option("--rootless", is_flag=True)
def spec(bundle: str, rootless: bool) -> None:
    """Write a default config.json into the bundle."""
    from paracell.runtime.bundle import defaultspec

    defaultspec.write(bundle)


# runc update's flags; values are checked in runtime/verbs/update.py.
UPDATE_FLAGS = ("blkio-weight", "cpu-period", "cpu-quota", "cpu-burst", "cpu-share",
                "cpu-rt-period", "cpu-rt-runtime", "cpuset-cpus", "cpuset-mems", "cpu-idle",
                "memory", "memory-reservation", "memory-swap", "kernel-memory",
                "kernel-memory-tcp", "pids-limit", "l3-cache-schema", "mem-bw-schema")


def _update_options(func: Callable[..., None]) -> Callable[..., None]:
    for flag in reversed(UPDATE_FLAGS):
        func = click.option(f"--{flag}", flag.replace("-", "_"), default=None)(func)
    # An older spelling this CLI accepted; runc's is --cpu-share.
    return click.option("--cpu-shares", "cpu_shares", default=None, hidden=True)(func)


@main.command()
@click.option("--resources", "-r", default=None, help="JSON file, or - for stdin")
@_update_options
@click.argument("container_id")
def update(resources: str | None, container_id: str, cpu_shares: str | None,
           **flags: str | None) -> None:
    """Update resource limits: the host cgroup, and guest memory by the balloon."""
    from paracell.runtime.verbs import update as verb

    values = {flag: flags[flag.replace("-", "_")] for flag in UPDATE_FLAGS}
    if cpu_shares is not None and values["cpu-share"] is None:
        values["cpu-share"] = cpu_shares
    verb.update(_ctx(), container_id, resources, values)


# CRIU's knobs that mean nothing for a whole VM's snapshot: accepted, as runc
# accepts them, and ignored (the guest keeps its TCP, sockets and locks).
_CRIU_FLAGS = ("tcp-established", "ext-unix-sk", "shell-job", "file-locks", "auto-dedup",
               "no-subreaper", "no-pivot")
_CRIU_VALUES = ("manage-cgroups-mode", "empty-ns", "lsm-profile", "lsm-mount-context")
# And those that ask for what a VM snapshot does not do: refused.
_REFUSED = ("pre-dump", "lazy-pages")
_REFUSED_VALUES = ("page-server", "parent-path", "status-fd")


def _criu_options(command: Callable[..., None]) -> Callable[..., None]:
    for flag in _CRIU_FLAGS + _REFUSED:
        command = click.option(f"--{flag}", is_flag=True, hidden=True)(command)
    for flag in _CRIU_VALUES + _REFUSED_VALUES:
        command = click.option(f"--{flag}", default=None, hidden=True)(command)
    return command


def _refuse_criu_only(flags: dict[str, object]) -> None:
    for flag in _REFUSED + _REFUSED_VALUES:
        if flags.get(flag.replace("-", "_")):
            raise ParacellError(f"--{flag} is not supported: ParaCell checkpoints the whole VM "
                                "(docs/snapshots.md)")


@main.command()
@click.option("--image-path", default=None, help="directory for the checkpoint")
@click.option("--work-path", default=None, help="directory for its log")
@click.option("--leave-running", is_flag=True, help="leave the container running afterwards")
@_criu_options
@click.argument("container_id")
def checkpoint(container_id: str, image_path: str | None, work_path: str | None,
               leave_running: bool, **criu: object) -> None:
    """Checkpoint a running snapshot-mode container into --image-path."""
    from paracell.runtime.verbs import snapshot

    _refuse_criu_only(criu)
    if not image_path:
        raise ParacellError("checkpoint needs --image-path DIR")
    snapshot.runc_checkpoint(_ctx(), container_id, image_path, work_path, leave_running)


@main.command()
@click.option("--image-path", default=None, help="directory of the checkpoint")
@click.option("--work-path", default=None)
@click.option("--bundle", "-b", default=".")
@click.option("--detach", "-d", is_flag=True)
@click.option("--pid-file", default=None)
@click.option("--console-socket", default=None)
@_criu_options
@click.argument("container_id")
def restore(container_id: str, image_path: str | None, work_path: str | None, bundle: str,
            detach: bool, pid_file: str | None, console_socket: str | None,
            **criu: object) -> None:
    """Restore a container from a checkpoint made by `checkpoint`."""
    from paracell.runtime.verbs import snapshot

    _refuse_criu_only(criu)
    if not image_path:
        raise ParacellError("restore needs --image-path DIR")
    if console_socket:
        raise ParacellError("a restored container has no terminal yet (--console-socket)")
    snapshot.runc_restore(_ctx(), container_id, image_path, work_path, bundle, detach, pid_file)


@main.command()
@click.option("--json", "as_json", is_flag=True)
def check(as_json: bool) -> None:
    """Probe the host: KVM kind, PKU, QEMU, guest artifacts, the engine, and
    the libvirt daemon at --libvirt-uri. Fails, after the report, when new
    containers run under a daemon backend (--vmm) and create would refuse them."""
    from paracell import hostcheck
    from paracell.vmm import backends

    ctx = _ctx()
    daemons = [cls(ctx.location_of(cls)) for cls in backends.classes() if cls.default_location]
    report = hostcheck.collect(ctx.engine, daemons, ctx.root)
    click.echo(hostcheck.render(report, as_json, daemons))
    chosen = ctx.backend({})
    if chosen.default_location:
        hostcheck.require(report, chosen)


@main.group()
def xgate() -> None:
    """XGates: vet binaries for instructions that write PKRU."""


@xgate.command("vet")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.argument("paths", nargs=-1, required=True)
def xgate_vet(as_json: bool, paths: tuple[str, ...]) -> None:
    """Scan ELF files, directories or bundles (their rootfs). Exit 0 when clean,
    1 when an offence was found, 2 on input that cannot be vetted."""
    from paracell.runtime.bundle import spec
    from paracell.xgate import report, vet

    found = vet.vet_paths(list(paths), bundle_rootfs=spec.bundle_rootfs)
    click.echo(report.as_json(found) if as_json else report.text(found))
    sys.exit(report.exit_status(found))


def _register_cri() -> None:
    from paracell.cri.cli import cri

    main.add_command(cri)


_register_cri()


@main.group()
def guest() -> None:
    """Build the guest kernel, agent and initramfs."""


@guest.command("build")
def guest_build() -> None:
    """Build what is missing; cached by a hash of every input."""
    from paracell.guest import artifacts

    built = artifacts.build_all()
    click.echo(f"kernel: {built.kernel}\ninitramfs: {built.initramfs}")


@main.group()
def bench() -> None:
    """Benchmarks: ratios against baselines measured in the same run."""


@bench.command("pod")
@click.option("--rounds", default=3, show_default=True)
@click.option("--output", "-o", default="bench-results/pod.json")
def bench_pod(rounds: int, output: str) -> None:
    """Idle pods of 1 and 3 containers: one VM per pod vs a VM per container."""
    from paracell.bench import pod as bench_pod_mod

    if not 1 <= rounds <= 50:
        raise ParacellError(f"--rounds {rounds} is outside 1..50")
    click.echo(bench_pod_mod.run(_ctx(), rounds, output))


@bench.command("shim")
@click.option("--rounds", default=5, show_default=True)
@click.option("--output", "-o", default="bench-results/shim.json")
def bench_shim(rounds: int, output: str) -> None:
    """containerd to ParaCell: runc v2 + BinaryName against the shim v2, with runc beside."""
    from paracell.bench import shim as bench_shim_mod

    if not 1 <= rounds <= 50:
        raise ParacellError(f"--rounds {rounds} is outside 1..50")
    click.echo(bench_shim_mod.run(_ctx(), rounds, output))


@bench.command("sdk")
@click.option("--runs", default=30, show_default=True)
@click.option("--output", "-o", default="bench-results/sdk.json")
def bench_sdk(runs: int, output: str) -> None:
    """A command in a running sandbox: the Python SDK against `paracell exec`."""
    from paracell.bench import sdk as bench_sdk_mod

    if not 1 <= runs <= 1000:
        raise ParacellError(f"--runs {runs} is outside 1..1000")
    click.echo(bench_sdk_mod.run(_ctx(), runs, output))


@bench.command("density")
@click.option("--count", default=None, type=int,
              help="idle sandboxes per runtime [default: 20, or 5 with --quick]")
@click.option("--window", "window_s", default=None, type=float,
              help="seconds of idle measured once all are up [default: 30, or 10 with --quick]")
@click.option("--rounds", default=None, type=int,
              help="rounds, runtimes alternating first [default: 2, or 1 with --quick]")
@click.option("--quick", is_flag=True, help="5 sandboxes, a 10 s window, one round")
@click.option("--curve", default=0, type=int,
              help="then start up to N copy-on-write sandboxes, memory against count [0: off]")
@click.option("--output", "-o", default="bench-results/density.json")
def bench_density(count: int | None, window_s: float | None, rounds: int | None, quick: bool,
                  curve: int, output: str) -> None:
    """N idle sandboxes: host CPU, memory and start time per sandbox, vs runc."""
    from paracell.bench import density as bench_density_mod

    count, window_s, rounds = bench_density_mod.plan(quick, count, window_s, rounds)
    if not (1 <= count <= 200 and 0 < window_s <= 600 and 1 <= rounds <= 20
            and 0 <= curve <= 200):
        raise ParacellError("paracell bench density: --count 1..200, --window in (0, 600], "
                            "--rounds 1..20, --curve 0..200")
    click.echo(bench_density_mod.run(_ctx(), count, window_s, rounds, output, curve))


@bench.command("start")
@click.option("--runs", default=10, show_default=True)
@click.option("--output", "-o", default="bench-results/start.json")
@click.option("--baseline-kernel", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="also boot this bzImage raw in every round, to compare guest kernels")
@click.option("--vmm", "vmm", default=None, metavar="BACKEND",
              help="also start each round's container under this backend (libvirt: at the "
                   "global --libvirt-uri), next to the default's")
def bench_start(runs: int, output: str, baseline_kernel: Path | None, vmm: str | None) -> None:
    """Median start-to-exit of /bin/true vs raw QEMU boot and runc."""
    from paracell.bench import start as bench_start_mod
    from paracell.vmm import backends

    if not 1 <= runs <= 200:
        raise ParacellError(f"--runs {runs} is outside 1..200")
    ctx = _ctx()
    also = None
    if vmm is not None:
        cls = backends.backend_class(vmm)
        also = cls(ctx.location_of(cls))
    click.echo(bench_start_mod.run(ctx, runs, output, baseline_kernel, also))


@bench.command("memory")
@click.option("--quick", is_flag=True, help="workloads 1 and 2 only, one round (about 3 min)")
@click.option("--output", "-o", default="bench-results/memory.json")
def bench_memory(quick: bool, output: str) -> None:
    """The Pager against virtio-balloon and no memory manager, interleaved."""
    from paracell.bench import memory as bench_memory_mod

    click.echo(bench_memory_mod.run(_ctx(), quick, output))


@bench.command("snapshot")
@click.option("--rounds", default=10, show_default=True, type=click.IntRange(2, 100))
@click.option("--sizes", default="16,64,256", show_default=True,
              help="MiB the workload touches, one sandbox each")
@click.option("--output", "-o", default="bench-results/snapshot.json")
def bench_snapshot(rounds: int, sizes: str, output: str) -> None:
    """Checkpoint and rollback of a snapshot-mode sandbox (docs/snapshots.md)."""
    from paracell.bench import snapshot as bench_snapshot_mod

    try:
        chosen = tuple(int(s) for s in sizes.split(","))
    except ValueError:
        chosen = ()
    if not chosen or any(not 1 <= s <= 320 for s in chosen):
        raise ParacellError("paracell bench snapshot: --sizes is MiB from 1 to 320, "
                            "comma-separated")
    click.echo(bench_snapshot_mod.run(_ctx(), rounds, output, chosen))


@bench.command("agent")
@click.option("--branching", default=2, show_default=True, type=click.IntRange(1, 4),
              help="children of every node")
@click.option("--depth", default=3, show_default=True, type=click.IntRange(1, 5))
@click.option("--output", "-o", default="bench-results/agent.json")
def bench_agent(branching: int, depth: int, output: str) -> None:
    """A tree search over a Python project: ParaCell's checkpoints vs a whole-VM
    save and runc + CRIU (DeltaBox's workload)."""
    from paracell.bench import agent as bench_agent_mod

    nodes = len(bench_agent_mod.tree(branching, depth))
    if nodes > bench_agent_mod.MAX_NODES:
        raise ParacellError(f"paracell bench agent: --branching {branching} --depth {depth} "
                            f"makes {nodes} nodes; at most {bench_agent_mod.MAX_NODES}")
    click.echo(bench_agent_mod.run(_ctx(), branching, depth, output))


@bench.command("cli")
@click.option("--runs", default=30, show_default=True)
@click.option("--output", "-o", default="bench-results/cli.json")
def bench_cli(runs: int, output: str) -> None:
    """Median wall time of state and kill vs runc's."""
    from paracell.bench import verblatency as bench_cli_mod

    click.echo(bench_cli_mod.run(_ctx(), runs, output))


@bench.command("net")
@click.option("--rounds", default=3, show_default=True)
@click.option("--seconds", default=3.0, show_default=True, help="per test, per round")
@click.option("--output", "-o", default="bench-results/net.json")
def bench_net(rounds: int, seconds: float, output: str) -> None:
    """TCP throughput and round trips, container to host, vs runc."""
    from paracell.bench import net as bench_net_mod

    if not (1 <= rounds <= 100 and 0 < seconds <= 60):
        raise ParacellError("paracell bench net: --rounds 1..100, --seconds in (0, 60]")
    click.echo(bench_net_mod.run(_ctx(), rounds, seconds, output))


@bench.command("xgate")
@click.option("--output", "-o", default="bench-results/xgate.json")
@click.option("--pvm-switch-ns", type=float, default=None,
              help="published cost of one user/kernel round trip under PVM: adds a projection")
@click.option("--pvm-source", default=None, help="where --pvm-switch-ns is published")
def bench_xgate(output: str, pvm_switch_ns: float | None, pvm_source: str | None) -> None:
    """Gate calls against syscalls, vDSO and a pipe round trip, in a guest."""
    import paracell.bench.xgate as bench_xgate_mod

    if (pvm_switch_ns is None) != (pvm_source is None):
        raise click.UsageError("--pvm-switch-ns and --pvm-source go together")
    pvm = bench_xgate_mod.PUBLISHED_PVM if pvm_switch_ns is None else \
        bench_xgate_mod.PvmCost(pvm_switch_ns, pvm_source or "")
    click.echo(bench_xgate_mod.run(_ctx(), output, pvm))


@bench.command("suite-pool")
@click.argument("results", nargs=-1, required=True)
@click.option("--output", "-o", default="bench-results/suite-pool.json", show_default=True)
def bench_suite_pool(results: tuple[str, ...], output: str) -> None:
    """The server goals over the rounds of several `bench suite` runs at
    once, from their suite.json files."""
    import json
    from pathlib import Path

    from paracell.bench.suite import report

    if len(results) > 100:
        raise ParacellError("paracell bench suite-pool: at most 100 results")
    pooled = report.pooled_goals([report.load_result(Path(r)) for r in results])
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(pooled, indent=1) + "\n")
    rounds = ", ".join(f"{w} {n}" for w, n in pooled["rounds"].items() if n)
    click.echo(f"{pooled['runs']} run(s); rounds: {rounds or 'no server workload'}")
    for line in report.goal_lines(pooled["goals"]):
        click.echo(line)
    click.echo(f"-> {out}")


def _names(value: str | None) -> list[str] | None:
    """A comma-separated list (repeatable option values are joined first)."""
    if value is None:
        return None
    names = [n.strip() for n in value.split(",")]
    if not all(names) or len(value) > 200:
        raise ParacellError("paracell bench suite: a list of names, separated by commas")
    return names


@bench.command("suite")
@click.option("--quick", is_flag=True, help="fewer rounds and smaller loads (under 10 min)")
@click.option("--runtimes", default=None,
              help="comma-separated subset of runc,none,pager,balloon,xgates")
@click.option("--workloads", default=None,
              help="comma-separated subset of http,redis,memcached,sqlite,build,swe,skills")
@click.option("--rounds", type=int, default=None, help="default 1 with --quick, else 3")
@click.option("--output-dir", "-o", default="bench-results/suite", show_default=True)
def bench_suite(quick: bool, runtimes: str | None, workloads: str | None, rounds: int | None,
                output_dir: str) -> None:
    """Real applications under runc and ParaCell's memory managers, with a report."""
    from paracell.bench.suite import run as suite_run

    plan = suite_run.make_plan(quick, _names(runtimes), _names(workloads), rounds)
    click.echo(suite_run.run(_ctx(), plan, output_dir))


@main.command()
def demo() -> None:
    """Run the bundled example container in a micro-VM and show memory figures."""
    from paracell import demo as demo_mod

    sys.exit(demo_mod.run_demo(_ctx()))
