"""The shim's view of its domain through libvirt's lifecycle events.

One connection, with libvirt's default event loop run by a thread of its own
(started after the shim's jail: unshare(CLONE_NEWNS) wants one thread). When
libvirtd restarts, the connection closes; the watch reconnects every
RECONNECT_S and registers again, and a domain that ended meanwhile counts as
stopped. The container itself never depends on libvirtd being up: the agent
channel is QEMU's, and the relay sees it hang up when QEMU ends.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from paracell.errors import ParacellError
from paracell.vmm.libvirt import connection

RECONNECT_S = 0.5
# The loop wakes this often even with no event, to see `close`.
TICK_MS = 200
# libvirt's STOPPED details, in the words stop() maps to an exit.
STOPPED_DETAILS = {0: "shutdown", 1: "destroyed", 2: "crashed", 3: "migrated", 4: "saved",
                   5: "failed", 6: "from-snapshot"}
_loop: list[threading.Thread] = []
_loop_lock = threading.Lock()


def _ensure_event_loop() -> None:
    """libvirt's default event implementation, registered once per process
    (before any connection that wants events) and run by one daemon thread."""
    libvirt = connection.libvirt_module()
    with _loop_lock:
        if _loop:
            return
        libvirt.virEventRegisterDefaultImpl()
        libvirt.virEventAddTimeout(TICK_MS, lambda _timer, _opaque: None, None)

        def run() -> None:
            # No signal may land here: the shim's relay takes the signals it
            # forwards from a signalfd, which sees only those no thread took.
            signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
            while True:
                if libvirt.virEventRunDefaultImpl() < 0:
                    return

        thread = threading.Thread(target=run, name="libvirt-events", daemon=True)
        thread.start()
        _loop.append(thread)


class DomainWatch:
    def __init__(self, uri: str, name: str) -> None:
        _ensure_event_loop()
        self.uri, self.name = uri, name
        self._stopped = threading.Event()
        self._detail: str | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._callback_id = -1
        self._timer = -1
        self.conn: Any = None
        self._connect()

    def _connect(self) -> None:
        libvirt = connection.libvirt_module()
        conn = connection.open_uri(self.uri)
        try:
            # Keepalive: a daemon that is gone is noticed within seconds.
            conn.setKeepAlive(5, 3)
            self._callback_id = conn.domainEventRegisterAny(
                None, libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE, self._lifecycle, None)
            conn.registerCloseCallback(self._connection_closed, None)
        except libvirt.libvirtError as err:
            conn.close()
            raise ParacellError(f"libvirt at {self.uri}: watching domain {self.name}: "
                                f"{connection.describe(err)}") from None
        self.conn = conn

    def _lifecycle(self, _conn: Any, dom: Any, event: int, detail: int, _opaque: Any) -> None:
        libvirt = connection.libvirt_module()
        if event == libvirt.VIR_DOMAIN_EVENT_STOPPED and dom.name() == self.name:
            self._mark_stopped(STOPPED_DETAILS.get(detail, f"detail {detail}"))

    def _mark_stopped(self, detail: str) -> None:
        with self._lock:
            if self._detail is None:
                self._detail = detail
        self._stopped.set()

    def _connection_closed(self, _conn: Any, _reason: int, _opaque: Any) -> None:
        """libvirtd went away: try again from the event loop, as a timer."""
        libvirt = connection.libvirt_module()
        with self._lock:
            self.conn = None
            self._callback_id = -1
            if self._closed or self._timer >= 0:
                return
            self._timer = libvirt.virEventAddTimeout(int(RECONNECT_S * 1000), self._reconnect,
                                                     None)

    def _reconnect(self, timer: int, _opaque: Any) -> None:
        libvirt = connection.libvirt_module()
        if self._closed:
            libvirt.virEventRemoveTimeout(timer)
            return
        try:
            self._connect()
        except ParacellError:
            return  # the timer fires again
        libvirt.virEventRemoveTimeout(timer)
        with self._lock:
            self._timer = -1
        if not connection.is_active(self.conn, self.name):
            self._mark_stopped("failed")

    def wait_stopped(self, timeout_s: float) -> str | None:
        """The STOPPED detail, or None if the domain still ran after the time.
        A connection that is down counts the domain as running until then."""
        if not self._stopped.wait(timeout_s) and not self._gone():
            return None
        self._stopped.set()
        return self._detail or "failed"

    def _gone(self) -> bool:
        conn = self.conn
        return conn is not None and not connection.is_active(conn, self.name)

    def close(self) -> None:
        libvirt = connection.libvirt_module()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conn, callback = self.conn, self._callback_id
            self.conn, self._callback_id = None, -1
        if conn is None:
            return
        try:
            if callback >= 0:
                conn.domainEventDeregisterAny(callback)
            conn.unregisterCloseCallback()
        except libvirt.libvirtError:
            pass
        try:
            conn.close()
        except libvirt.libvirtError:
            pass
