"""The shim v2 wire layer over real unix sockets: ttrpc's framing and statuses as
containerd 1.6's Go side has them, the vendored protos, and the Any type URLs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib.resources import files
from pathlib import Path

import pytest
from google.protobuf import any_pb2, empty_pb2

from paracell.shimv2 import generate

# A checkout where `make venv` has not run yet: what it would have generated.
if not generate.up_to_date():
    generate.generate()

from paracell.shimv2 import messages  # noqa: E402
from paracell.shimv2.messages import (  # noqa: E402
    cgroups_v1,
    cgroups_v2,
    task_api,
    task_events,
    task_types,
    ttrpc_wire,
)
from paracell.shimv2.ttrpc import (  # noqa: E402
    MESSAGE_LENGTH_MAX,
    CallInfo,
    Client,
    Code,
    Server,
    TtrpcError,
    current_call,
)

TASK = messages.TASK_SERVICE
HEADER = struct.Struct(">IIBB")
REQUEST, RESPONSE = 1, 2


def run(test: Awaitable[None]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(60):
            await test
    asyncio.run(bounded())


@contextlib.asynccontextmanager
async def serving(server: Server, path: Path) -> AsyncIterator[Path]:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()
    task = asyncio.create_task(server.serve(listener))
    try:
        yield path
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def task_server(**handlers: Callable[[object], Awaitable[object]]) -> Server:
    """A server of the Task service: State echoes, the rest as given."""
    async def state(request: task_api.StateRequest) -> task_api.StateResponse:
        return task_api.StateResponse(id=request.id, exec_id=request.exec_id, pid=42,
                                      status=task_types.RUNNING)

    server = Server(write_timeout=0.5)
    methods = {"State": (task_api.StateRequest, state)}
    requests = {"Start": task_api.StartRequest, "Kill": task_api.KillRequest,
                "Pids": task_api.PidsRequest, "Delete": task_api.DeleteRequest,
                "Wait": task_api.WaitRequest, "Update": task_api.UpdateTaskRequest}
    methods.update({name: (requests[name], handler) for name, handler in handlers.items()})
    server.register(TASK, methods)
    return server


def frame(stream_id: int, data: bytes, kind: int = REQUEST) -> bytes:
    return HEADER.pack(len(data), stream_id, kind, 0) + data


def request(method: str, payload: bytes, service: str = TASK) -> bytes:
    return ttrpc_wire.Request(service=service, method=method,
                              payload=payload).SerializeToString()


def state_request(cid: str = "c1") -> bytes:
    return request("State", task_api.StateRequest(id=cid).SerializeToString())


async def read_response(reader: asyncio.StreamReader) -> tuple[int, ttrpc_wire.Response]:
    length, stream_id, kind, flags = HEADER.unpack(await reader.readexactly(HEADER.size))
    assert (kind, flags) == (RESPONSE, 0)
    return stream_id, ttrpc_wire.Response.FromString(await reader.readexactly(length))


async def assert_closed(reader: asyncio.StreamReader) -> None:
    async with asyncio.timeout(10):
        while await reader.read(1 << 16):
            pass


async def assert_served(path: Path) -> None:
    async with await Client.connect(path) as client:
        answer = await client.call(TASK, "State", task_api.StateRequest(id="again"),
                                   task_api.StateResponse, timeout=10)
    assert answer.id == "again"


# ---- calls


def test_a_task_state_call_goes_there_and_back(tmp_path):
    seen: list[CallInfo] = []
    peer_open: list[bool] = []

    async def state(request: task_api.StateRequest) -> task_api.StateResponse:
        seen.append(current_call())
        peer_open.append(not current_call().peer_closed.is_set())
        return task_api.StateResponse(id=request.id, exec_id=request.exec_id, bundle="/b",
                                      pid=42, status=task_types.STOPPED, exit_status=137,
                                      exited_at={"seconds": 1700000000, "nanos": 5})

    async def test() -> None:
        server = Server()
        server.register(TASK, {"State": (task_api.StateRequest, state)})
        async with serving(server, tmp_path / "s") as path, await Client.connect(path) as client:
            before = time.monotonic()
            answer = await client.call(
                TASK, "State", task_api.StateRequest(id="c1", exec_id="e1"),
                task_api.StateResponse, timeout=5,
                metadata={"Containerd-Namespace-TTRPC": "k8s.io", "multi": ["a", "b"]})
        assert (answer.id, answer.exec_id, answer.bundle, answer.pid) == ("c1", "e1", "/b", 42)
        assert answer.status == task_types.STOPPED and answer.exit_status == 137
        assert answer.exited_at.ToNanoseconds() == 1700000000 * 10**9 + 5
        call, = seen
        assert (call.service, call.method) == ("containerd.task.v2.Task", "State")
        assert call.metadata == {messages.NAMESPACE_METADATA_KEY: ("k8s.io",),
                                 "multi": ("a", "b")}
        assert call.deadline is not None and before < call.deadline <= time.monotonic() + 5
        assert peer_open == [True]

    run(test())


def test_unknown_services_and_methods_are_unimplemented(tmp_path):
    async def test() -> None:
        async with serving(task_server(), tmp_path / "s") as path, \
                await Client.connect(path) as client:
            with pytest.raises(TtrpcError) as service:
                await client.call("containerd.task.v3.Task", "State", task_api.StateRequest(),
                                  task_api.StateResponse)
            with pytest.raises(TtrpcError) as method:
                await client.call(TASK, "Teleport", task_api.StateRequest(),
                                  task_api.StateResponse)
            # The connection outlives both refusals.
            assert (await client.call(TASK, "State", task_api.StateRequest(id="x"),
                                      task_api.StateResponse)).id == "x"
        assert (service.value.code, service.value.message) == \
            (Code.UNIMPLEMENTED, "service containerd.task.v3.Task")
        assert (method.value.code, method.value.message) == (Code.UNIMPLEMENTED, "method Teleport")

    run(test())


def test_handler_failures_become_statuses(tmp_path):
    async def kill(request: task_api.KillRequest) -> empty_pb2.Empty:
        raise TtrpcError(Code.NOT_FOUND, f"process {request.exec_id} not found")

    async def pids(request: task_api.PidsRequest) -> task_api.PidsResponse:
        raise ValueError("cannot list\n  the pids")

    async def delete(request: task_api.DeleteRequest) -> object:
        return {"not": "a message"}

    async def test() -> None:
        server = task_server(Kill=kill, Pids=pids, Delete=delete)
        async with serving(server, tmp_path / "s") as path, await Client.connect(path) as client:
            failures = {}
            for method, message in [("Kill", task_api.KillRequest(exec_id="e9")),
                                    ("Pids", task_api.PidsRequest()),
                                    ("Delete", task_api.DeleteRequest())]:
                with pytest.raises(TtrpcError) as failure:
                    await client.call(TASK, method, message, empty_pb2.Empty)
                failures[method] = (failure.value.code, failure.value.message)
        assert failures["Kill"] == (Code.NOT_FOUND, "process e9 not found")
        assert failures["Pids"] == (Code.UNKNOWN, "cannot list; the pids")
        assert failures["Delete"][0] == Code.INTERNAL

    run(test())


def test_calls_on_one_connection_are_answered_as_they_finish(tmp_path):
    slow_started = asyncio.Event()
    release = asyncio.Event()
    finished: list[str] = []

    async def start(request: task_api.StartRequest) -> task_api.StartResponse:
        slow_started.set()
        await release.wait()
        return task_api.StartResponse(pid=int(request.exec_id))

    async def kill(request: task_api.KillRequest) -> empty_pb2.Empty:
        release.set()
        return empty_pb2.Empty()

    async def call_start(client: Client, n: int) -> int:
        answer = await client.call(TASK, "Start", task_api.StartRequest(exec_id=str(n)),
                                   task_api.StartResponse)
        finished.append(f"start {n}")
        return answer.pid

    async def test() -> None:
        async with serving(task_server(Start=start, Kill=kill), tmp_path / "s") as path, \
                await Client.connect(path) as client:
            slow = [asyncio.create_task(call_start(client, n)) for n in range(1, 21)]
            await slow_started.wait()
            states = await asyncio.gather(*(
                client.call(TASK, "State", task_api.StateRequest(id=f"c{n}"),
                            task_api.StateResponse) for n in range(5)))
            assert [state.id for state in states] == [f"c{n}" for n in range(5)]
            assert finished == []
            await client.call(TASK, "Kill", task_api.KillRequest(), empty_pb2.Empty)
            # Each slow answer reached the call that asked for it.
            assert await asyncio.gather(*slow) == list(range(1, 21))

    run(test())


def test_calls_in_flight_per_connection_are_bounded(tmp_path):
    started = 0
    release = asyncio.Event()

    async def wait(request: task_api.WaitRequest) -> task_api.WaitResponse:
        nonlocal started
        started += 1
        await release.wait()
        return task_api.WaitResponse(exit_status=int(request.exec_id))

    async def test() -> None:
        server = task_server(Wait=wait)
        server.max_in_flight = 3
        async with serving(server, tmp_path / "s") as path, await Client.connect(path) as client:
            calls = [asyncio.create_task(client.call(
                TASK, "Wait", task_api.WaitRequest(exec_id=str(n)), task_api.WaitResponse))
                for n in range(8)]
            async with asyncio.timeout(10):
                while started < 3:
                    await asyncio.sleep(0.01)
            # Time for a fourth to start, were the bound not kept.
            await asyncio.sleep(0.3)
            assert started == 3
            release.set()
            answers = await asyncio.gather(*calls)
        assert started == 8
        assert [answer.exit_status for answer in answers] == list(range(8))

    run(test())


def test_a_call_that_runs_out_of_time_leaves_the_client_usable(tmp_path):
    release = asyncio.Event()
    deadlines: list[float | None] = []

    async def wait(request: task_api.WaitRequest) -> task_api.WaitResponse:
        deadlines.append(current_call().deadline)
        await release.wait()
        return task_api.WaitResponse()

    async def test() -> None:
        async with serving(task_server(Wait=wait), tmp_path / "s") as path, \
                await Client.connect(path) as client:
            with pytest.raises(TtrpcError) as late:
                await client.call(TASK, "Wait", task_api.WaitRequest(), task_api.WaitResponse,
                                  timeout=0.2)
            assert late.value.code == Code.DEADLINE_EXCEEDED
            # Its answer, when it comes, finds no one; the next call gets its own.
            release.set()
            assert (await client.call(TASK, "State", task_api.StateRequest(id="after"),
                                      task_api.StateResponse)).id == "after"
        assert deadlines[0] is not None

    run(test())


def test_pending_calls_fail_when_the_server_goes(tmp_path):
    entered = asyncio.Event()

    async def wait(request: task_api.WaitRequest) -> task_api.WaitResponse:
        entered.set()
        await asyncio.Event().wait()
        raise AssertionError("never answered")

    async def test() -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(tmp_path / "s"))
        listener.listen()
        serve = asyncio.create_task(task_server(Wait=wait).serve(listener))
        async with await Client.connect(tmp_path / "s") as client:
            pending = asyncio.create_task(client.call(TASK, "Wait", task_api.WaitRequest(),
                                                      task_api.WaitResponse))
            await entered.wait()
            serve.cancel()
            with pytest.raises(TtrpcError) as gone:
                await pending
            assert gone.value.code == Code.UNAVAILABLE
            with pytest.raises(TtrpcError) as after:
                await client.call(TASK, "State", task_api.StateRequest(), task_api.StateResponse)
            assert after.value.code == Code.UNAVAILABLE
        await asyncio.gather(serve, return_exceptions=True)

    run(test())


def test_shutdown_lets_calls_in_flight_answer_first(tmp_path):
    entered = asyncio.Event()

    async def start(request: task_api.StartRequest) -> task_api.StartResponse:
        entered.set()
        await asyncio.sleep(0.3)
        return task_api.StartResponse(pid=7)

    async def test() -> None:
        server = task_server(Start=start)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(tmp_path / "s"))
        listener.listen()
        serve = asyncio.create_task(server.serve(listener))
        async with await Client.connect(tmp_path / "s") as client:
            call = asyncio.create_task(client.call(TASK, "Start", task_api.StartRequest(),
                                                   task_api.StartResponse))
            await entered.wait()
            await server.shutdown(grace=10)
            assert (await call).pid == 7
        await serve
        with pytest.raises(ConnectionRefusedError):
            await Client.connect(tmp_path / "s")

    run(test())


def test_messages_over_the_limit_are_refused_by_either_side(tmp_path):
    called = False

    async def update(request: task_api.UpdateTaskRequest) -> empty_pb2.Empty:
        nonlocal called
        called = True
        return empty_pb2.Empty()

    async def pids(request: task_api.PidsRequest) -> task_api.PidsResponse:
        info = any_pb2.Any(value=bytes(MESSAGE_LENGTH_MAX))
        return task_api.PidsResponse(processes=[task_types.ProcessInfo(pid=1, info=info)])

    async def test() -> None:
        async with serving(task_server(Update=update, Pids=pids), tmp_path / "s") as path, \
                await Client.connect(path) as client:
            huge = task_api.UpdateTaskRequest(annotations={"a": "x" * MESSAGE_LENGTH_MAX})
            with pytest.raises(TtrpcError) as sent:
                await client.call(TASK, "Update", huge, empty_pb2.Empty)
            with pytest.raises(TtrpcError) as answered:
                await client.call(TASK, "Pids", task_api.PidsRequest(), task_api.PidsResponse)
        assert sent.value.code == answered.value.code == Code.RESOURCE_EXHAUSTED
        assert not called

    run(test())


# ---- framing, as a raw peer sends it


def test_an_oversized_frame_is_read_past_and_refused(tmp_path):
    async def test() -> None:
        async with serving(task_server(), tmp_path / "s") as path:
            reader, writer = await asyncio.open_unix_connection(path)
            length = MESSAGE_LENGTH_MAX + 1
            writer.write(HEADER.pack(length, 1, REQUEST, 0) + bytes(length))
            writer.write(frame(3, state_request("next")))
            await writer.drain()
            stream_id, refused = await read_response(reader)
            assert (stream_id, refused.status.code) == (1, Code.RESOURCE_EXHAUSTED)
            assert refused.status.message == \
                f"message length {length} exceed maximum message size of {MESSAGE_LENGTH_MAX}"
            # The frame after it is read from the right place.
            stream_id, answered = await read_response(reader)
            assert (stream_id, answered.status.code) == (3, Code.OK)
            assert task_api.StateResponse.FromString(answered.payload).id == "next"
            writer.close()
            await assert_served(path)

    run(test())


def test_a_frame_cut_short_closes_only_its_connection(tmp_path):
    async def test() -> None:
        async with serving(task_server(), tmp_path / "s") as path:
            for length in (0xFFFFFFFF, 100):
                reader, writer = await asyncio.open_unix_connection(path)
                writer.write(HEADER.pack(length, 1, REQUEST, 0) + bytes(10))
                writer.write_eof()
                await assert_closed(reader)
                writer.close()
            await assert_served(path)

    run(test())


@pytest.mark.parametrize("stream_id, kind", [(1, RESPONSE), (1, 3), (2, REQUEST), (0, REQUEST)])
def test_frames_no_client_sends_close_the_connection(tmp_path, stream_id, kind):
    async def test() -> None:
        async with serving(task_server(), tmp_path / "s") as path:
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(frame(stream_id, state_request(), kind))
            await writer.drain()
            await assert_closed(reader)
            writer.close()
            await assert_served(path)

    run(test())


def test_undecodable_requests_and_payloads_are_invalid_arguments(tmp_path):
    async def test() -> None:
        async with serving(task_server(), tmp_path / "s") as path:
            reader, writer = await asyncio.open_unix_connection(path)
            # A length-delimited field claiming more bytes than follow, in each layer.
            writer.write(frame(1, b"\x0a\x09State"))
            writer.write(frame(3, request("State", b"\x0a\x05ab")))
            writer.write(frame(5, state_request("fine")))
            await writer.drain()
            answers = dict([await read_response(reader) for _ in range(3)])
            writer.close()
        assert answers[1].status.code == answers[3].status.code == Code.INVALID_ARGUMENT
        assert answers[1].status.message.startswith("unmarshal request error")
        assert answers[3].status.message.startswith("ttrpc: error unmarshalling payload")
        assert answers[5].status.code == Code.OK

    run(test())


def test_a_peer_that_never_reads_holds_up_no_one(tmp_path, caplog):
    async def start(request: task_api.StartRequest) -> task_api.StartResponse:
        return task_api.StartResponse(pid=1)

    async def update(request: task_api.UpdateTaskRequest) -> task_api.StateResponse:
        return task_api.StateResponse(bundle="x" * (1 << 20))

    async def test() -> None:
        async with serving(task_server(Start=start, Update=update), tmp_path / "s") as path:
            reader, writer = await asyncio.open_unix_connection(path)
            for stream_id in range(1, 33, 2):
                writer.write(frame(stream_id, request("Update", b"")))
            await writer.drain()
            async with asyncio.timeout(5):
                await assert_served(path)
            # The server gives up on this peer after its write timeout (0.5 s).
            async with asyncio.timeout(10):
                while "has not read" not in caplog.text:
                    await asyncio.sleep(0.05)
            received = 0
            async with asyncio.timeout(10):
                while chunk := await reader.read(1 << 16):
                    received += len(chunk)
            assert received < 16 << 20
            writer.close()
            await assert_served(path)

    run(test())


def answer_length_as(address: str, uid: int | None) -> int:
    """In a child forked to run as `uid` (None: as this process), connects, sends a State
    request and tells how many bytes came back: 0 when the server shut the door."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            peer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            peer.connect(address)
            try:
                peer.sendall(frame(1, state_request()))
                received = len(peer.recv(1 << 16))
            except (BrokenPipeError, ConnectionResetError):
                received = 0  # shut before or after the request went
            os.write(write_end, str(received).encode())
        except BaseException as exc:
            os.write(write_end, repr(exc).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        said = os.read(read_end, 1024).decode()
        assert said.isdigit(), said
        return int(said)
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)


@pytest.mark.skipif(os.geteuid() != 0, reason="connecting as another user needs root")
def test_only_the_servers_own_user_is_served():
    async def test() -> None:
        # Abstract, so no directory's permissions turn the other user away first.
        address = f"\0paracell-ttrpc-test-{os.getpid()}"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(address)
        listener.listen()
        serve = asyncio.create_task(task_server().serve(listener))
        try:
            assert await asyncio.to_thread(answer_length_as, address, None) > 0
            assert await asyncio.to_thread(answer_length_as, address, 65534) == 0
        finally:
            serve.cancel()
            await asyncio.gather(serve, return_exceptions=True)

    run(test())


# ---- the messages and their Any type URLs


def test_any_type_urls_are_the_bare_full_names_containerd_registers():
    exit_event = task_events.TaskExit(container_id="c", id="c", pid=9, exit_status=137)
    packed = messages.pack_any(exit_event)
    assert packed.type_url == "containerd.events.TaskExit"
    assert messages.unpack_any(packed, task_events.TaskExit) == exit_event
    assert messages.pack_any(cgroups_v1.Metrics()).type_url == "io.containerd.cgroups.v1.Metrics"
    assert messages.pack_any(cgroups_v2.Metrics()).type_url == "io.containerd.cgroups.v2.Metrics"
    # What protobuf's own Any.Pack writes is read too, and a wrong type is refused.
    packed.type_url = "type.googleapis.com/containerd.events.TaskExit"
    assert messages.unpack_any(packed, task_events.TaskExit) == exit_event
    with pytest.raises(ValueError):
        messages.unpack_any(packed, task_events.TaskOOM)


def test_runtime_spec_anys_are_json():
    packed = messages.pack_any(task_events.TaskOOM())
    packed.type_url = messages.RUNTIME_SPEC_PROCESS_URL
    packed.value = b'{"args": ["sh"], "cwd": "/"}'
    assert messages.unpack_json_any(packed, messages.RUNTIME_SPEC_PROCESS_URL) == \
        {"args": ["sh"], "cwd": "/"}
    assert messages.RUNTIME_SPEC_PROCESS_URL == \
        "types.containerd.io/opencontainers/runtime-spec/1/Process"


def test_every_task_event_has_its_topic():
    names = ["TaskCreate", "TaskStart", "TaskDelete", "TaskExit", "TaskOOM", "TaskExecAdded",
             "TaskExecStarted", "TaskPaused", "TaskResumed", "TaskCheckpointed"]
    topics = {name: messages.event_topic(getattr(task_events, name)()) for name in names}
    assert topics["TaskExit"] == "/tasks/exit"
    assert topics["TaskExecStarted"] == "/tasks/exec-started"
    assert len(set(topics.values())) == len(names)
    with pytest.raises(ValueError):
        messages.event_topic(task_events.TaskIO())


def test_a_forwarded_event_is_enveloped_as_a_go_shim_does():
    forward = messages.forward_request(task_events.TaskExit(container_id="c"), "k8s.io",
                                       1_700_000_000_123_456_789)
    envelope = forward.envelope
    assert (envelope.namespace, envelope.topic) == ("k8s.io", "/tasks/exit")
    assert envelope.event.type_url == "containerd.events.TaskExit"
    assert envelope.timestamp.ToNanoseconds() == 1_700_000_000_123_456_789
    assert messages.forward_request(task_events.TaskOOM(), "default").envelope.timestamp.seconds


def test_field_numbers_give_go_s_bytes():
    # Hand-encoded: tag = field number << 3 | wire type.
    assert task_events.TaskExit(container_id="c", pid=7, exit_status=1).SerializeToString() == \
        b"\x0a\x01c\x18\x07\x20\x01"
    assert ttrpc_wire.Request(service="s", method="m", payload=b"p", timeout_nano=1,
                              metadata=[ttrpc_wire.KeyValue(key="k", value="v")]) \
        .SerializeToString() == b"\x0a\x01s\x12\x01m\x1a\x01p\x20\x01\x2a\x06\x0a\x01k\x12\x01v"
    assert ttrpc_wire.Response(status={"code": 5, "message": "x"}).SerializeToString() == \
        b"\x0a\x05\x08\x05\x12\x01x"


def test_the_services_are_containerd_1_6s():
    task = task_api.DESCRIPTOR.services_by_name["Task"]
    assert task.full_name == "containerd.task.v2.Task"
    assert [method.name for method in task.methods] == [
        "State", "Create", "Start", "Delete", "Pids", "Pause", "Resume", "Checkpoint", "Kill",
        "Exec", "ResizePty", "CloseIO", "Update", "Wait", "Stats", "Connect", "Shutdown"]
    events = messages.events_api.DESCRIPTOR.services_by_name["Events"]
    assert events.full_name == messages.EVENTS_SERVICE
    assert messages.EVENTS_SERVICE == "containerd.services.events.ttrpc.v1.Events"
    assert [method.name for method in events.methods] == ["Forward"]
    assert task_types.Status.Name(5) == "PAUSING"


# ---- generation


PROTO_ROOT = Path(generate.__file__).parent / "proto"


def test_the_generated_modules_are_up_to_date():
    assert generate.up_to_date()


def test_generating_afresh_gives_a_module_per_proto(tmp_path):
    out = tmp_path / "_gen"
    generate.generate(out)
    assert generate.up_to_date(out)
    assert not (tmp_path / "_gen.new").exists()
    protos = generate.proto_files()
    assert {p.relative_to(PROTO_ROOT).as_posix() for p in protos} == {
        "containerd/cgroups/stats/v1/metrics.proto", "containerd/cgroups/v2/stats/metrics.proto",
        "containerd/containerd/api/events/task.proto",
        "containerd/containerd/api/services/ttrpc/events/v1/events.proto",
        "containerd/containerd/api/types/mount.proto",
        "containerd/containerd/api/types/task/task.proto",
        "containerd/containerd/runtime/v2/runc/options/oci.proto",
        "containerd/containerd/runtime/v2/task/shim.proto", "containerd/ttrpc/request.proto",
        "google/rpc/status.proto"}
    for proto in protos:
        module = out.joinpath(*generate.module_name(proto).split(".")).with_suffix(".py")
        text = module.read_text()
        for line in text.splitlines():
            if line.startswith(("import ", "from ")) and "_pb2" in line:
                assert line.startswith(("from google.protobuf", "from paracell.shimv2._gen.")), \
                    line


@pytest.mark.parametrize("proto", generate.proto_files(),
                         ids=lambda proto: proto.relative_to(PROTO_ROOT).as_posix())
def test_each_vendored_proto_compiles_without_gogo(tmp_path, proto):
    from grpc_tools import protoc

    text = proto.read_text()
    assert '"gogoproto/gogo.proto"' not in text and "(gogoproto." not in text
    rc = protoc.main(["protoc", f"-I{PROTO_ROOT}", f"-I{files('grpc_tools') / '_proto'}",
                      f"--descriptor_set_out={tmp_path / 'set.pb'}", str(proto)])
    assert rc == 0
