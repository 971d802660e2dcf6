"""Task events to containerd: each one forwarded, in order, to containerd's
ttrpc events service (TTRPC_ADDRESS), as containerd's own shims do.
containerd learns that a task exited only from its TaskExit, so an event
that cannot be delivered is retried before it is given up, with a log line."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from google.protobuf import empty_pb2

from paracell.log import RuntimeLog
from paracell.shimv2 import messages
from paracell.shimv2.ttrpc import Client, TtrpcError

ATTEMPTS = 5
RETRY_S = 0.1
CALL_TIMEOUT_S = 5.0
MAX_QUEUED = 4096


class Publisher:
    def __init__(self, address: str, namespace: str, log: RuntimeLog) -> None:
        self.address = address.removeprefix("unix://")
        self.namespace = namespace
        self.log = log
        self.queue: asyncio.Queue[tuple[Any, int]] = asyncio.Queue(MAX_QUEUED)
        self.client: Client | None = None
        self.worker: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.worker = asyncio.create_task(self._run())

    def publish(self, event: Any) -> None:
        try:
            self.queue.put_nowait((event, time.time_ns()))
        except asyncio.QueueFull:
            self.log.error(f"event {messages.event_topic(event)} dropped: {MAX_QUEUED} events "
                           "wait already", to_stderr=False)

    async def drain(self, timeout_s: float) -> None:
        """Waits (bounded) until every queued event has been sent or given up."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.queue.join(), timeout_s)

    async def _run(self) -> None:
        while True:
            event, at_ns = await self.queue.get()
            try:
                await self._forward(event, at_ns)
            finally:
                self.queue.task_done()

    async def _forward(self, event: Any, at_ns: int) -> None:
        request = messages.forward_request(event, self.namespace, at_ns)
        topic = request.envelope.topic
        for attempt in range(ATTEMPTS):
            try:
                if self.client is None:
                    self.client = await Client.connect(self.address)
                await self.client.call(messages.EVENTS_SERVICE, "Forward", request, empty_pb2.Empty,
                                       timeout=CALL_TIMEOUT_S)
                return
            except (TimeoutError, OSError, TtrpcError, EOFError) as err:
                if self.client is not None:
                    await self.client.close()
                    self.client = None
                if attempt == ATTEMPTS - 1:
                    self.log.error(f"event {topic} not delivered to containerd: {err}",
                                   to_stderr=False)
                    return
                await asyncio.sleep(RETRY_S * (2 ** attempt))

    async def close(self) -> None:
        if self.worker is not None:
            self.worker.cancel()
        if self.client is not None:
            await self.client.close()
