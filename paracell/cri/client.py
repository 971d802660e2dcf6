"""A CRI v1 client over containerd's unix socket, with every call bounded in time.

Configs come in as JSON dicts in the CRI's own field names (as crictl takes
them) and are turned into messages by protobuf's json_format, so an unknown
or mistyped field is one clear error, not a silently empty request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paracell.errors import ParacellError

DEFAULT_TIMEOUT_S = 120.0


def _modules() -> tuple[Any, Any]:
    try:
        from paracell.cri._gen import api_pb2, api_pb2_grpc
    except ImportError:
        raise ParacellError("the CRI stubs are not built: run `make venv` "
                            "(python -m paracell.cri.generate)") from None
    return api_pb2, api_pb2_grpc


class CriError(ParacellError):
    def __init__(self, call: str, code: str, details: str) -> None:
        super().__init__(f"{call}: {code}: {details}")
        self.code = code
        self.details = details


class CriClient:
    def __init__(self, socket: str | Path, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        import grpc

        self.pb, grpc_stubs = _modules()
        self._grpc = grpc
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.runtime = grpc_stubs.RuntimeServiceStub(self.channel)
        self.images = grpc_stubs.ImageServiceStub(self.channel)
        self.timeout_s = timeout_s

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> CriClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def message(self, name: str, fields: dict[str, Any] | None = None) -> Any:
        from google.protobuf import json_format

        try:
            return json_format.ParseDict(fields or {}, getattr(self.pb, name)())
        except json_format.ParseError as err:
            raise ParacellError(f"invalid {name}: {err}") from None

    def call(self, service: str, method: str, request: Any, timeout_s: float | None = None) -> Any:
        stub = self.runtime if service == "runtime" else self.images
        try:
            return getattr(stub, method)(request, timeout=timeout_s or self.timeout_s)
        except self._grpc.RpcError as err:
            raise CriError(method, err.code().name, err.details() or "") from None

    # The calls the tests and `paracell cri` use, in CRI order.

    def version(self) -> Any:
        return self.call("runtime", "Version", self.message("VersionRequest", {"version": "v1"}))

    def run_pod(self, config: dict[str, Any], handler: str) -> str:
        request = self.pb.RunPodSandboxRequest(
            config=self.message("PodSandboxConfig", config), runtime_handler=handler)
        return self.call("runtime", "RunPodSandbox", request).pod_sandbox_id

    def stop_pod(self, pod_id: str) -> None:
        self.call("runtime", "StopPodSandbox", self.pb.StopPodSandboxRequest(pod_sandbox_id=pod_id))

    def remove_pod(self, pod_id: str) -> None:
        self.call("runtime", "RemovePodSandbox",
                  self.pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id))

    def pod_status(self, pod_id: str) -> Any:
        return self.call("runtime", "PodSandboxStatus",
                         self.pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id)).status

    def pods(self) -> list[Any]:
        return list(self.call("runtime", "ListPodSandbox", self.pb.ListPodSandboxRequest()).items)

    def create(self, pod_id: str, config: dict[str, Any], pod_config: dict[str, Any]) -> str:
        request = self.pb.CreateContainerRequest(
            pod_sandbox_id=pod_id, config=self.message("ContainerConfig", config),
            sandbox_config=self.message("PodSandboxConfig", pod_config))
        return self.call("runtime", "CreateContainer", request).container_id

    def start(self, container_id: str) -> None:
        self.call("runtime", "StartContainer",
                  self.pb.StartContainerRequest(container_id=container_id))

    def stop(self, container_id: str, timeout_s: int) -> None:
        request = self.pb.StopContainerRequest(container_id=container_id, timeout=timeout_s)
        self.call("runtime", "StopContainer", request, timeout_s=timeout_s + self.timeout_s)

    def remove(self, container_id: str) -> None:
        self.call("runtime", "RemoveContainer",
                  self.pb.RemoveContainerRequest(container_id=container_id))

    def containers(self, pod_id: str = "") -> list[Any]:
        request = self.pb.ListContainersRequest(
            filter=self.pb.ContainerFilter(pod_sandbox_id=pod_id))
        return list(self.call("runtime", "ListContainers", request).containers)

    def status(self, container_id: str) -> Any:
        return self.call("runtime", "ContainerStatus",
                         self.pb.ContainerStatusRequest(container_id=container_id)).status

    def exec_sync(self, container_id: str, cmd: list[str], timeout_s: int = 60) -> Any:
        request = self.pb.ExecSyncRequest(container_id=container_id, cmd=cmd, timeout=timeout_s)
        return self.call("runtime", "ExecSync", request, timeout_s=timeout_s + self.timeout_s)

    def port_forward(self, pod_id: str, ports: list[int]) -> str:
        """The streaming server's URL for forwarding these ports of the pod."""
        request = self.pb.PortForwardRequest(pod_sandbox_id=pod_id, port=ports)
        return self.call("runtime", "PortForward", request).url

    def container_stats(self, container_id: str) -> Any:
        return self.call("runtime", "ContainerStats",
                         self.pb.ContainerStatsRequest(container_id=container_id)).stats

    def pod_stats(self, pod_id: str) -> Any:
        return self.call("runtime", "PodSandboxStats",
                         self.pb.PodSandboxStatsRequest(pod_sandbox_id=pod_id)).stats

    def runtime_status(self) -> Any:
        return self.call("runtime", "Status", self.pb.StatusRequest(verbose=True))

    def image_status(self, image: str) -> Any:
        request = self.pb.ImageStatusRequest(image=self.pb.ImageSpec(image=image))
        return self.call("image", "ImageStatus", request).image
