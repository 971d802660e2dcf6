"""ttrpc, containerd's RPC over unix sockets, on asyncio: the unary calls containerd 1.6 makes.

Framing (containerd/ttrpc PROTOCOL.md and channel.go): every message is a
10-byte header, then that many bytes of data. The header is the data length
(uint32, big-endian), the stream id (uint32, big-endian), the message type
(uint8) and flags (uint8). A client opens a stream with a Request frame on a
fresh odd id; the server closes it with one Response frame on the same id.
Their data is a ttrpc.Request or ttrpc.Response (messages.ttrpc_wire) whose
payload holds the method's own message. Data frames (type 3) and streams came
with ttrpc 1.2; containerd 1.6 links ttrpc 1.1.1, which never sends them.

Where the Go server (ttrpc v1.1.1 server.go) has a behaviour, this one copies
it: an oversized frame is read past, never buffered, and answered with
RESOURCE_EXHAUSTED on its stream; unknown services and methods are
UNIMPLEMENTED with the same messages. It is stricter about what only a broken
peer sends: a frame that is not a request, or a request on an even stream id,
closes that connection (Go ignores the first and answers the second). It also
bounds what Go does not: requests in flight per connection, and how long a
response may wait for a peer that does not read."""

from __future__ import annotations

import asyncio
import contextvars
import enum
import functools
import logging
import os
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from google.protobuf.message import DecodeError, Message

from paracell.shimv2.messages import rpc_status, ttrpc_wire

log = logging.getLogger(__name__)

HEADER = struct.Struct(">IIBB")
MESSAGE_LENGTH_MAX = 4 << 20
TYPE_REQUEST = 0x1
TYPE_RESPONSE = 0x2

MAX_IN_FLIGHT = 128
WRITE_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 10.0
_SKIP_CHUNK = 64 << 10
_STREAM_ID_MASK = 0xFFFFFFFF

M = TypeVar("M", bound=Message)
Handler = Callable[[Any], Awaitable[Message]]


class Code(enum.IntEnum):
    """gRPC status codes (google/rpc/code.proto), which ttrpc statuses carry."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class TtrpcError(Exception):
    """A call's non-OK status: raised by a handler to answer with it, and by Client.call
    when the server answered with it (or the call could not complete)."""

    def __init__(self, code: Code | int, message: str) -> None:
        # A peer may send a code this enum lacks; it is kept as the number.
        try:
            code = Code(code)
        except ValueError:
            pass
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        name = self.code.name if isinstance(self.code, Code) else str(self.code)
        return f"{name}: {self.message}"


@dataclass(frozen=True)
class CallInfo:
    """What a handler may want to know beyond its request (ttrpc's Go handlers get it through
    their context): the method, the caller's metadata and its deadline."""

    service: str
    method: str
    # Keys lowercased, as ttrpc's MD.Get looks them up; values in the order sent.
    metadata: Mapping[str, tuple[str, ...]]
    # On time.monotonic()'s clock; None when the caller set no timeout. Nothing enforces
    # it: a handler cut off halfway (a Create, a Delete) would leave worse than a late answer.
    deadline: float | None
    # Set once the connection is gone, for a handler that waits (Wait) to stop waiting.
    peer_closed: asyncio.Event


_CALL: contextvars.ContextVar[CallInfo] = contextvars.ContextVar("paracell_ttrpc_call")


def current_call() -> CallInfo:
    """The call the running handler serves; LookupError outside a handler."""
    return _CALL.get()


class _Header(NamedTuple):
    length: int
    stream_id: int
    kind: int
    flags: int


class _ProtocolError(Exception):
    pass


def _frame(stream_id: int, kind: int, data: bytes) -> bytes:
    return HEADER.pack(len(data), stream_id, kind, 0) + data


async def _read_header(reader: asyncio.StreamReader) -> _Header:
    return _Header(*HEADER.unpack(await reader.readexactly(HEADER.size)))


async def _read_data(reader: asyncio.StreamReader, length: int) -> bytes | None:
    """The frame's data, or None when it is over the limit: then it has been read past
    in small pieces, so a peer's length field never decides how much memory is taken."""
    if length <= MESSAGE_LENGTH_MAX:
        return await reader.readexactly(length)
    left = length
    while left:
        chunk = await reader.read(min(left, _SKIP_CHUNK))
        if not chunk:
            raise asyncio.IncompleteReadError(b"", left)
        left -= len(chunk)
    return None


def _oversized(length: int) -> str:
    # ttrpc's own wording, so logs read the same whichever side refused.
    return f"message length {length} exceed maximum message size of {MESSAGE_LENGTH_MAX}"


def _status_response(code: Code | int, message: str) -> ttrpc_wire.Response:
    return ttrpc_wire.Response(status=rpc_status.Status(code=int(code), message=message))


def _peer_is_this_user(sock: socket.socket) -> bool:
    # struct ucred: pid, uid, gid, as the kernel recorded them when the peer connected.
    ucred = struct.Struct("=iII")
    _pid, uid, gid = ucred.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                  ucred.size))
    return uid == os.geteuid() and gid == os.getegid()


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return "; ".join(lines) or type(exc).__name__


class Server:
    """A ttrpc server: services registered by name, served on unix sockets."""

    def __init__(self, *, max_in_flight: int = MAX_IN_FLIGHT,
                 write_timeout: float = WRITE_TIMEOUT_S, same_user_only: bool = True) -> None:
        self.max_in_flight = max_in_flight
        self.write_timeout = write_timeout
        # containerd's Linux shims take calls only from their own effective uid and gid
        # (runtime/v2/shim/shim_linux.go: ttrpc.UnixSocketRequireSameUser); so does this.
        self.same_user_only = same_user_only
        self._services: dict[str, dict[str, tuple[type[Message], Handler]]] = {}
        # One set of live connections per serve() call, so each can drop its own.
        self._served: list[set[_ServerConnection]] = []
        self._listeners: list[asyncio.AbstractServer] = []
        self._stopped = asyncio.Event()

    def register(self, service: str,
                 methods: Mapping[str, tuple[type[Message], Handler]]) -> None:
        """Serves `service` (its full name, e.g. messages.TASK_SERVICE): each method name maps
        to its request class and a coroutine function taking the decoded request and
        returning the response message. A handler answers with an error by raising
        TtrpcError; any other exception answers UNKNOWN with its text."""
        if service in self._services:
            raise ValueError(f"ttrpc: service {service} is already registered")
        self._services[service] = dict(methods)

    async def serve(self, sock: socket.socket) -> None:
        """Serves on `sock`, a bound AF_UNIX stream socket (listening or not), which is the
        server's to close from here on. Returns after shutdown(); when cancelled, stops
        listening and drops this socket's connections at once."""
        if self._stopped.is_set():
            raise RuntimeError("ttrpc: the server has been shut down")
        connections: set[_ServerConnection] = set()
        listener = await asyncio.start_unix_server(
            functools.partial(self._connected, connections), sock=sock)
        self._served.append(connections)
        self._listeners.append(listener)
        try:
            await self._stopped.wait()
        finally:
            listener.close()
            self._listeners.remove(listener)
            self._served.remove(connections)
            for connection in list(connections):
                connection.drop()

    async def shutdown(self, grace: float = 5.0) -> None:
        """Stops accepting, gives the calls in flight up to `grace` seconds to be answered, then
        drops every connection; serve() returns. Not to be awaited by a handler, which would
        wait for itself: a Shutdown handler starts it in a task of its own."""
        for listener in self._listeners:
            listener.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        # Requests keep arriving on open connections meanwhile, so wait until none is busy.
        while True:
            busy = [call for connection in self._connections() for call in connection.calls]
            left = deadline - loop.time()
            if not busy or left <= 0:
                break
            await asyncio.wait(busy, timeout=left)
        for connection in self._connections():
            connection.drop()
        self._stopped.set()

    def _connections(self) -> list[_ServerConnection]:
        return [connection for group in self._served for connection in group]

    async def _connected(self, group: set[_ServerConnection], reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
        if self.same_user_only and not _peer_is_this_user(writer.get_extra_info("socket")):
            log.warning("ttrpc: refusing a connection from another user")
            writer.transport.abort()
            return
        connection = _ServerConnection(self, reader, writer)
        group.add(connection)
        try:
            await connection.run()
        finally:
            group.discard(connection)

    async def _answer(self, data: bytes, peer_closed: asyncio.Event) -> ttrpc_wire.Response:
        """The Response to one Request frame's data: a handler's failure becomes a status."""
        try:
            payload = await self._invoke(data, peer_closed)
        except TtrpcError as exc:
            return _status_response(exc.code, exc.message)
        except Exception as exc:
            call = _CALL.get(None)
            log.exception("ttrpc: %s failed",
                          f"{call.service}/{call.method}" if call else "a request")
            return _status_response(Code.UNKNOWN, _one_line(exc))
        return ttrpc_wire.Response(status=rpc_status.Status(code=Code.OK), payload=payload)

    async def _invoke(self, data: bytes, peer_closed: asyncio.Event) -> bytes:
        request = ttrpc_wire.Request()
        try:
            request.ParseFromString(data)
        except DecodeError as exc:
            raise TtrpcError(Code.INVALID_ARGUMENT, f"unmarshal request error: {exc}") from None
        methods = self._services.get(request.service)
        if methods is None:
            raise TtrpcError(Code.UNIMPLEMENTED, f"service {request.service}")
        if request.method not in methods:
            raise TtrpcError(Code.UNIMPLEMENTED, f"method {request.method}")
        request_type, handler = methods[request.method]
        try:
            message = request_type.FromString(request.payload)
        except DecodeError as exc:
            # Go's ttrpc says INTERNAL here; the fault is the caller's, so the code says so.
            raise TtrpcError(Code.INVALID_ARGUMENT,
                             f"ttrpc: error unmarshalling payload: {exc}") from None
        metadata: dict[str, tuple[str, ...]] = {}
        for pair in request.metadata:
            key = pair.key.lower()
            metadata[key] = (*metadata.get(key, ()), pair.value)
        # ttrpc's Go client sends 0 for "no deadline".
        deadline = (time.monotonic() + request.timeout_nano / 1e9
                    if request.timeout_nano else None)
        # Each call runs in a task of its own, so this is seen by that call alone.
        _CALL.set(CallInfo(request.service, request.method, metadata, deadline, peer_closed))
        response = await handler(message)
        if not isinstance(response, Message):
            raise TtrpcError(Code.INTERNAL, "ttrpc: error unsupported response type: "
                                            f"{type(response).__name__}")
        return response.SerializeToString()


class _ServerConnection:
    def __init__(self, server: Server, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        self.calls: set[asyncio.Task[None]] = set()
        self.closed = asyncio.Event()
        self._slots = asyncio.Semaphore(server.max_in_flight)
        self._write_lock = asyncio.Lock()
        self._runner: asyncio.Task[Any] | None = None

    async def run(self) -> None:
        self._runner = asyncio.current_task()
        try:
            await self._receive()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the peer went away, in the middle of a frame or not
        except _ProtocolError as exc:
            log.warning("ttrpc: dropping a connection: %s", exc)
        except asyncio.CancelledError:
            # close() stops this reader so; it runs as the stream's own task, which nothing
            # awaits, and asyncio's callback on that task would choke on a cancelled one.
            pass
        finally:
            self.close()

    async def _receive(self) -> None:
        while True:
            header = await _read_header(self.reader)
            if header.kind != TYPE_REQUEST:
                raise _ProtocolError(f"message type {header.kind} on stream {header.stream_id}")
            if header.stream_id % 2 == 0:
                raise _ProtocolError(f"request on even stream id {header.stream_id}")
            data = await _read_data(self.reader, header.length)
            if data is None:
                await self._send(header.stream_id,
                                 _status_response(Code.RESOURCE_EXHAUSTED,
                                                  _oversized(header.length)))
                continue
            # At the limit this stops reading the socket: the peer then waits, not the heap.
            await self._slots.acquire()
            call = asyncio.create_task(self._call(header.stream_id, data))
            self.calls.add(call)
            call.add_done_callback(self.calls.discard)

    async def _call(self, stream_id: int, data: bytes) -> None:
        try:
            response = await self.server._answer(data, self.closed)
            await self._send(stream_id, response)
        finally:
            # Only once the answer is out: a peer that does not read holds its slots.
            self._slots.release()

    async def _send(self, stream_id: int, response: ttrpc_wire.Response) -> None:
        data = response.SerializeToString()
        if len(data) > MESSAGE_LENGTH_MAX:
            # The client would refuse it unread; tell it why instead.
            data = _status_response(Code.RESOURCE_EXHAUSTED, _oversized(len(data))) \
                .SerializeToString()
        async with self._write_lock:
            if self.closed.is_set():
                return
            self.writer.write(_frame(stream_id, TYPE_RESPONSE, data))
            try:
                await asyncio.wait_for(self.writer.drain(), self.server.write_timeout)
            except TimeoutError:
                log.warning("ttrpc: dropping a connection that has not read for %ss",
                            self.server.write_timeout)
                self.close()
            except ConnectionError:
                self.close()

    def close(self) -> None:
        """Closes the socket; calls still running finish, and their answers are dropped."""
        if self.closed.is_set():
            return
        self.closed.set()
        # abort, not close: close would first flush to a peer that may never read.
        self.writer.transport.abort()
        # The reader may be parked on a full set of slots rather than on the socket.
        if self._runner is not None and self._runner is not asyncio.current_task():
            self._runner.cancel()

    def drop(self) -> None:
        """Closes the socket and cancels the calls still running: the server is stopping."""
        self.close()
        for call in list(self.calls):
            call.cancel()


class Client:
    """One ttrpc connection's client side: unary calls, any number in flight at once."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                 write_timeout: float = WRITE_TIMEOUT_S) -> None:
        self._reader = reader
        self._writer = writer
        self._write_timeout = write_timeout
        self._write_lock = asyncio.Lock()
        self._pending: dict[int, asyncio.Future[ttrpc_wire.Response]] = {}
        self._next_stream_id = 1
        # Why the connection ended, once it has.
        self._closed: str | None = None
        self._receiver = asyncio.create_task(self._receive())

    @classmethod
    async def connect(cls, path: str | os.PathLike[str], *,
                      timeout: float = CONNECT_TIMEOUT_S) -> Client:
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(path), timeout)
        return cls(reader, writer)

    async def call(self, service: str, method: str, request: Message, response_type: type[M],
                   *, timeout: float | None = None,
                   metadata: Mapping[str, str | Sequence[str]] | None = None) -> M:
        """Calls service/method and decodes its answer as `response_type`. Raises TtrpcError
        for a non-OK status, DEADLINE_EXCEEDED when `timeout` (seconds, also sent to the
        server) runs out, UNAVAILABLE once the connection is gone."""
        wire = ttrpc_wire.Request(service=service, method=method,
                                  payload=request.SerializeToString(),
                                  timeout_nano=0 if timeout is None else round(timeout * 1e9))
        for key, values in (metadata or {}).items():
            for value in [values] if isinstance(values, str) else values:
                wire.metadata.add(key=key, value=value)
        data = wire.SerializeToString()
        if len(data) > MESSAGE_LENGTH_MAX:
            raise TtrpcError(Code.RESOURCE_EXHAUSTED, _oversized(len(data)))
        if self._closed is not None:
            raise TtrpcError(Code.UNAVAILABLE, self._closed)
        stream_id = self._allocate_stream_id()
        answer: asyncio.Future[ttrpc_wire.Response] = \
            asyncio.get_running_loop().create_future()
        self._pending[stream_id] = answer
        try:
            async with asyncio.timeout(timeout):
                await self._send(stream_id, data)
                response = await answer
        except TimeoutError:
            raise TtrpcError(Code.DEADLINE_EXCEEDED,
                             f"{service}/{method}: no answer within {timeout}s") from None
        finally:
            # An answer that comes after the caller gave up finds no one and is dropped.
            self._pending.pop(stream_id, None)
        if response.status.code != Code.OK:
            raise TtrpcError(response.status.code, response.status.message)
        try:
            return response_type.FromString(response.payload)
        except DecodeError as exc:
            raise TtrpcError(Code.INTERNAL, f"{service}/{method}: the answer is not a "
                                            f"{response_type.DESCRIPTOR.full_name}: {exc}") \
                from None

    async def close(self) -> None:
        self._receiver.cancel()
        await asyncio.gather(self._receiver, return_exceptions=True)
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except OSError:
            pass

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _allocate_stream_id(self) -> int:
        # Odd ids only (client-initiated); after 2**31 calls they wrap, around live ones.
        while True:
            stream_id = self._next_stream_id
            self._next_stream_id = (stream_id + 2) & _STREAM_ID_MASK
            if stream_id not in self._pending:
                return stream_id

    async def _send(self, stream_id: int, data: bytes) -> None:
        async with self._write_lock:
            if self._closed is not None:
                raise TtrpcError(Code.UNAVAILABLE, self._closed)
            self._writer.write(_frame(stream_id, TYPE_REQUEST, data))
            try:
                await asyncio.wait_for(self._writer.drain(), self._write_timeout)
            except (TimeoutError, ConnectionError) as exc:
                # A server that stopped reading, or one that is gone: either way, done.
                self._writer.transport.abort()
                raise TtrpcError(Code.UNAVAILABLE, f"ttrpc: cannot send: {exc!r}") from None

    async def _receive(self) -> None:
        reason = "ttrpc: closed"
        try:
            while True:
                header = await _read_header(self._reader)
                data = await _read_data(self._reader, header.length)
                answer = self._pending.get(header.stream_id)
                if answer is None or answer.done():
                    continue
                if data is None:
                    answer.set_exception(
                        TtrpcError(Code.RESOURCE_EXHAUSTED, _oversized(header.length)))
                elif header.kind != TYPE_RESPONSE:
                    answer.set_exception(TtrpcError(
                        Code.INTERNAL, f"ttrpc: message type {header.kind} received"))
                else:
                    response = ttrpc_wire.Response()
                    try:
                        response.ParseFromString(data)
                    except DecodeError as exc:
                        answer.set_exception(
                            TtrpcError(Code.INTERNAL, f"ttrpc: undecodable response: {exc}"))
                    else:
                        answer.set_result(response)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            if not isinstance(exc, asyncio.IncompleteReadError):
                reason = f"ttrpc: connection lost: {exc!r}"
        finally:
            self._closed = reason
            for answer in self._pending.values():
                if not answer.done():
                    answer.set_exception(TtrpcError(Code.UNAVAILABLE, reason))
            self._writer.transport.abort()
