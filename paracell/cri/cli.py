"""`paracell cri`: a tiny crictl over the CRI client, to try a pod without a
cluster. Pod and container configs are crictl's JSON: the CRI's own messages."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from paracell.errors import ParacellError

DEFAULT_ADDRESS = "/run/containerd/containerd.sock"
MAX_CONFIG_BYTES = 1 << 20


def _client(ctx: click.Context) -> Any:
    from paracell.cri.client import CriClient

    return CriClient(ctx.obj["address"], timeout_s=ctx.obj["timeout"])


def _config(path: str) -> dict[str, Any]:
    from paracell.runtime.bundle.spec import read_json_file

    value = read_json_file(path, MAX_CONFIG_BYTES)
    if not isinstance(value, dict):
        raise ParacellError(f"{path}: a CRI config must be a JSON object")
    return value


def _show(message: Any) -> None:
    from google.protobuf import json_format

    click.echo(json.dumps(json_format.MessageToDict(message), indent=2))


@click.group()
@click.option("--address", "-a", default=DEFAULT_ADDRESS, show_default=True,
              help="the CRI server's socket (containerd's)")
@click.option("--timeout", default=120.0, show_default=True, help="seconds per call")
@click.pass_context
def cri(ctx: click.Context, address: str, timeout: float) -> None:
    """Drive a CRI runtime (containerd) as kubelet would: pods, containers, exec."""
    if not 0 < timeout <= 3600:
        raise ParacellError(f"--timeout {timeout} is outside 0..3600 seconds")
    ctx.obj = {"address": address, "timeout": timeout}


@cri.command("run")
@click.option("--runtime", "-r", "handler", default="paracell", show_default=True,
              help="runtime handler (RuntimeClass)")
@click.argument("container_config")
@click.argument("pod_config")
@click.pass_context
def run(ctx: click.Context, handler: str, container_config: str, pod_config: str) -> None:
    """Run a pod with one container; prints the container's ID."""
    pod_cfg, ctr_cfg = _config(pod_config), _config(container_config)
    with _client(ctx) as client:
        pod = client.run_pod(pod_cfg, handler)
        try:
            container = client.create(pod, ctr_cfg, pod_cfg)
            client.start(container)
        except BaseException:
            client.stop_pod(pod)
            client.remove_pod(pod)
            raise
    click.echo(container)


@cri.command("runp")
@click.option("--runtime", "-r", "handler", default="paracell", show_default=True)
@click.argument("pod_config")
@click.pass_context
def runp(ctx: click.Context, handler: str, pod_config: str) -> None:
    """Run a pod sandbox; prints its ID."""
    with _client(ctx) as client:
        click.echo(client.run_pod(_config(pod_config), handler))


@cri.command("create")
@click.argument("pod_id")
@click.argument("container_config")
@click.argument("pod_config")
@click.pass_context
def create(ctx: click.Context, pod_id: str, container_config: str, pod_config: str) -> None:
    """Create a container in a pod; prints its ID."""
    with _client(ctx) as client:
        click.echo(client.create(pod_id, _config(container_config), _config(pod_config)))


@cri.command("start")
@click.argument("container_id")
@click.pass_context
def start(ctx: click.Context, container_id: str) -> None:
    """Start a created container."""
    with _client(ctx) as client:
        client.start(container_id)


@cri.command("exec", context_settings={"allow_interspersed_args": False,
                                      "ignore_unknown_options": True})
@click.option("--timeout", "exec_timeout", default=60, show_default=True)
@click.argument("container_id")
@click.argument("command", nargs=-1, required=True)
@click.pass_context
def exec_sync(ctx: click.Context, exec_timeout: int, container_id: str,
              command: tuple[str, ...]) -> None:
    """Run a command in a container (ExecSync); exits with its status."""
    with _client(ctx) as client:
        reply = client.exec_sync(container_id, list(command), exec_timeout)
    sys.stdout.buffer.write(reply.stdout)
    sys.stderr.buffer.write(reply.stderr)
    sys.exit(reply.exit_code)


@cri.command("stop")
@click.option("--timeout", "grace", default=10, show_default=True, help="grace period, seconds")
@click.argument("container_id")
@click.pass_context
def stop(ctx: click.Context, grace: int, container_id: str) -> None:
    """Stop a container: SIGTERM, then SIGKILL after the grace period."""
    with _client(ctx) as client:
        client.stop(container_id, grace)


@cri.command("rm")
@click.argument("container_id")
@click.pass_context
def rm(ctx: click.Context, container_id: str) -> None:
    """Remove a container."""
    with _client(ctx) as client:
        client.remove(container_id)


@cri.command("rmp")
@click.argument("pod_id")
@click.pass_context
def rmp(ctx: click.Context, pod_id: str) -> None:
    """Stop and remove a pod with every container in it."""
    with _client(ctx) as client:
        client.stop_pod(pod_id)
        client.remove_pod(pod_id)


@cri.command("pods")
@click.pass_context
def pods(ctx: click.Context) -> None:
    """List pods."""
    with _client(ctx) as client:
        for pod in client.pods():
            state = client.pb.PodSandboxState.Name(pod.state)
            click.echo(f"{pod.id[:13]}  {state:<16}  {pod.metadata.name}  {pod.runtime_handler}")


@cri.command("ps")
@click.pass_context
def ps(ctx: click.Context) -> None:
    """List containers."""
    with _client(ctx) as client:
        for ctr in client.containers():
            state = client.pb.ContainerState.Name(ctr.state)
            pod = ctr.pod_sandbox_id[:13]
            click.echo(f"{ctr.id[:13]}  {state:<18}  {ctr.metadata.name}  {pod}")


# Commands that print one CRI message as JSON: name, client method, help.
_SHOW = (
    ("inspect", "status", "A container's status, as JSON."),
    ("inspectp", "pod_status", "A pod's status, as JSON."),
    ("stats", "container_stats", "A container's CPU and memory figures, as JSON."),
    ("statsp", "pod_stats", "A pod's CPU, memory and process figures, as JSON."),
)


def _show_command(name: str, method: str, help_text: str) -> None:
    @cri.command(name, help=help_text)
    @click.argument("object_id", metavar="ID")
    @click.pass_context
    def show(ctx: click.Context, object_id: str) -> None:
        with _client(ctx) as client:
            _show(getattr(client, method)(object_id))


for _name, _method, _help in _SHOW:
    _show_command(_name, _method, _help)
