"""Unix sockets at paths of any length: bound and connected through a
/proc/self/fd path to the directory, so a long --root never hits the 108-byte
sun_path limit."""

from __future__ import annotations

import os
import socket
from pathlib import Path


def _via_dir(path: Path, act: str) -> socket.socket:
    dir_fd = os.open(path.parent, os.O_PATH | os.O_CLOEXEC)
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            getattr(sock, act)(f"/proc/self/fd/{dir_fd}/{path.name}")
        except OSError:
            sock.close()
            raise
        return sock
    finally:
        os.close(dir_fd)


def connect(path: Path) -> socket.socket:
    return _via_dir(path, "connect")


def listen(path: Path, backlog: int = 64) -> socket.socket:
    sock = _via_dir(path, "bind")
    sock.listen(backlog)
    return sock


def unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
