"""The shim v2 wire messages, from the one place the rest of the code takes them.

The classes are generated from paracell/shimv2/proto by paracell.shimv2.generate
(run by `make venv`); this module re-exports them under short names and holds
what containerd 1.6 expects beyond the schema: service names, event topics and
the type URLs it puts in google.protobuf.Any.

Type URLs. containerd 1.6 packs Any with github.com/containerd/typeurl v1.0.2
(vendor/github.com/containerd/typeurl/types.go at v1.6.20): TypeURL(v) is the
path given to typeurl.Register when the Go type was registered that way, and
otherwise falls back to gogo's proto.MessageName(v), the bare full name of the
message with no "type.googleapis.com/" prefix. Events and cgroup metrics are
never typeurl.Register-ed; their .pb.go files only call gogo's
proto.RegisterType(..., "containerd.events.TaskExit") and
proto.RegisterType(..., "io.containerd.cgroups.v1.Metrics"), so a shim's
TaskExit travels as "containerd.events.TaskExit" and its stats as
"io.containerd.cgroups.v1.Metrics" or "io.containerd.cgroups.v2.Metrics".
Unpacking goes the other way through proto.MessageType(url), which knows only
the bare names, so a prefixed URL (what protobuf's own Any.Pack writes) is one
containerd 1.6 cannot decode. The OCI runtime-spec types are the exception:
runtime/typeurl.go registers them as JSON under "types.containerd.io/...", which
is how ExecProcessRequest.spec and UpdateTaskRequest.resources arrive."""

from __future__ import annotations

import json
import time
from typing import TypeVar

from google.protobuf import any_pb2, timestamp_pb2
from google.protobuf.message import DecodeError, Message

try:
    from paracell.shimv2._gen.containerd.cgroups.stats.v1 import metrics_pb2 as cgroups_v1
    from paracell.shimv2._gen.containerd.cgroups.v2.stats import metrics_pb2 as cgroups_v2
    from paracell.shimv2._gen.containerd.containerd.api.events import task_pb2 as task_events
    from paracell.shimv2._gen.containerd.containerd.api.services.ttrpc.events.v1 import (
        events_pb2 as events_api,
    )
    from paracell.shimv2._gen.containerd.containerd.api.types import mount_pb2 as mount_types
    from paracell.shimv2._gen.containerd.containerd.api.types.task import task_pb2 as task_types
    from paracell.shimv2._gen.containerd.containerd.runtime.v2.runc.options import (
        oci_pb2 as runc_options,
    )
    from paracell.shimv2._gen.containerd.containerd.runtime.v2.task import shim_pb2 as task_api
    from paracell.shimv2._gen.containerd.ttrpc import request_pb2 as ttrpc_wire
    from paracell.shimv2._gen.google.rpc import status_pb2 as rpc_status
except ModuleNotFoundError as exc:
    if not (exc.name or "").startswith("paracell.shimv2._gen"):
        raise
    raise ModuleNotFoundError("the shim v2 messages are not built: run `make venv` "
                              "(python -m paracell.shimv2.generate)", name=exc.name) from exc

__all__ = [
    "EVENTS_SERVICE", "EVENT_TOPICS", "NAMESPACE_METADATA_KEY", "RUNTIME_SPEC_LINUX_RESOURCES_URL",
    "RUNTIME_SPEC_PROCESS_URL", "RUNTIME_SPEC_SPEC_URL", "TASK_SERVICE", "cgroups_v1",
    "cgroups_v2", "event_topic", "events_api", "forward_request", "mount_types", "pack_any",
    "rpc_status", "runc_options", "task_api", "task_events", "task_types", "ttrpc_wire",
    "type_url", "unpack_any", "unpack_json_any",
]

M = TypeVar("M", bound=Message)

TASK_SERVICE = task_api.DESCRIPTOR.services_by_name["Task"].full_name
EVENTS_SERVICE = events_api.DESCRIPTOR.services_by_name["Events"].full_name

# The ttrpc metadata key containerd's namespaces package (namespaces/ttrpc.go) sends the
# namespace under on every call into the shim.
NAMESPACE_METADATA_KEY = "containerd-namespace-ttrpc"

# runtime/typeurl.go: prefix "types.containerd.io", then "opencontainers/runtime-spec", the
# spec's major version, the Go type name. The values are JSON, not protobuf.
_RUNTIME_SPEC = "types.containerd.io/opencontainers/runtime-spec/1/"
RUNTIME_SPEC_SPEC_URL = _RUNTIME_SPEC + "Spec"
RUNTIME_SPEC_PROCESS_URL = _RUNTIME_SPEC + "Process"
RUNTIME_SPEC_LINUX_RESOURCES_URL = _RUNTIME_SPEC + "LinuxResources"

# runtime/events.go: the topic each task event is published under. containerd's exchange checks
# only the topic's form, so an event sent under the wrong topic would pass unnoticed.
EVENT_TOPICS: dict[str, str] = {
    task_events.TaskCreate.DESCRIPTOR.full_name: "/tasks/create",
    task_events.TaskStart.DESCRIPTOR.full_name: "/tasks/start",
    task_events.TaskOOM.DESCRIPTOR.full_name: "/tasks/oom",
    task_events.TaskExit.DESCRIPTOR.full_name: "/tasks/exit",
    task_events.TaskDelete.DESCRIPTOR.full_name: "/tasks/delete",
    task_events.TaskExecAdded.DESCRIPTOR.full_name: "/tasks/exec-added",
    task_events.TaskExecStarted.DESCRIPTOR.full_name: "/tasks/exec-started",
    task_events.TaskPaused.DESCRIPTOR.full_name: "/tasks/paused",
    task_events.TaskResumed.DESCRIPTOR.full_name: "/tasks/resumed",
    task_events.TaskCheckpointed.DESCRIPTOR.full_name: "/tasks/checkpointed",
}


def type_url(message: Message | type[Message]) -> str:
    """The type URL containerd 1.6 gives a protobuf message: its bare full name."""
    return message.DESCRIPTOR.full_name


def pack_any(message: Message) -> any_pb2.Any:
    # Not Any.Pack: that prefixes "type.googleapis.com/", which containerd 1.6 cannot resolve.
    return any_pb2.Any(type_url=type_url(message), value=message.SerializeToString())


def unpack_any(packed: any_pb2.Any, message_class: type[M]) -> M:
    """Decodes `packed` as `message_class`, accepting the bare name containerd 1.6 writes
    and the "<prefix>/<name>" form later versions and other clients write."""
    name = message_class.DESCRIPTOR.full_name
    if packed.type_url != name and not packed.type_url.endswith("/" + name):
        raise ValueError(f"Any holds {packed.type_url!r}, not {name}")
    try:
        return message_class.FromString(packed.value)
    except DecodeError as exc:
        raise ValueError(f"Any of type {name} does not decode: {exc}") from exc


def unpack_json_any(packed: any_pb2.Any, url: str) -> object:
    """Decodes an Any that containerd filled through typeurl.Register's JSON path."""
    if packed.type_url != url:
        raise ValueError(f"Any holds {packed.type_url!r}, not {url}")
    try:
        return json.loads(packed.value)
    except ValueError as exc:
        raise ValueError(f"Any of type {url} is not JSON: {exc}") from exc


def event_topic(event: Message) -> str:
    try:
        return EVENT_TOPICS[event.DESCRIPTOR.full_name]
    except KeyError:
        raise ValueError(f"{event.DESCRIPTOR.full_name} is not a task event") from None


def forward_request(event: Message, namespace: str,
                    timestamp_ns: int | None = None) -> events_api.ForwardRequest:
    """The Events.Forward request that publishes `event` the way a Go shim's publisher does.

    containerd's exchange refuses a forwarded envelope without a timestamp, so one is
    always set: now, unless the caller has a better one (e.g. the moment of an exit)."""
    stamp = timestamp_pb2.Timestamp()
    stamp.FromNanoseconds(time.time_ns() if timestamp_ns is None else timestamp_ns)
    envelope = events_api.Envelope(timestamp=stamp, namespace=namespace,
                                   topic=event_topic(event), event=pack_any(event))
    return events_api.ForwardRequest(envelope=envelope)
