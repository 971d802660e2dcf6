"""Terminals: the pty master arrives over --console-socket (one SCM_RIGHTS
message), the guest process runs on a pty, and window-size changes made on
the master reach it."""

from __future__ import annotations

import array
import fcntl
import os
import socket
import struct
import termios
import threading
import time

import pytest

pytestmark = pytest.mark.integration


class ConsoleReceiver:
    def __init__(self, path) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(str(path))
        self.sock.listen(1)
        self.master = -1
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        conn, _ = self.sock.accept()
        fds = array.array("i")
        _, ancdata, _, _ = conn.recvmsg(64, socket.CMSG_LEN(fds.itemsize))
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: fds.itemsize])
        self.master = fds[0]
        conn.close()

    def read_until(self, needle: bytes, timeout: float = 30) -> bytes:
        data = b""
        deadline = time.monotonic() + timeout
        while needle not in data:
            assert time.monotonic() < deadline, f"never saw {needle!r} in {data!r}"
            try:
                chunk = os.read(self.master, 4096)
            except OSError:
                break
            data += chunk
        return data


def set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


@pytest.mark.both_vmms
def test_console_socket_and_resize(runtime, make_bundle, tmp_path):
    script = ('tty; stty size; while read line; do stty size; echo got-$line; '
              '[ "$line" = end ] && break; done')
    bundle = make_bundle(["sh", "-c", script], terminal=True)
    receiver = ConsoleReceiver(tmp_path / "console.sock")
    result = runtime("create", "--bundle", str(bundle), "--console-socket",
                     str(tmp_path / "console.sock"), "tty1")
    assert result.returncode == 0, result.stderr
    receiver.thread.join(10)
    assert receiver.master >= 0
    set_size(receiver.master, 40, 100)
    runtime("start", "tty1", check=True)
    first = receiver.read_until(b"40 100")
    assert b"/dev/pts/" in first or b"/dev/console" in first
    set_size(receiver.master, 50, 120)
    # The resize travels as SIGWINCH -> RESIZE frame -> TIOCSWINSZ: ask again
    # until the guest sees it, for a bounded time.
    rest = b""
    for attempt in range(40):
        os.write(receiver.master, f"hello{attempt}\r".encode())
        rest += receiver.read_until(f"got-hello{attempt}".encode())
        if b"50 120" in rest:
            break
        time.sleep(0.25)
    assert b"50 120" in rest
    os.write(receiver.master, b"end\r")
    runtime("delete", "--force", "tty1", check=True)
    os.close(receiver.master)
    runtime.assert_no_leaks()
