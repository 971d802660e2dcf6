"""The container's terminal: a host pty whose master goes to the caller over
--console-socket (one SCM_RIGHTS message, as runc sends it)."""

from __future__ import annotations

import array
import os
import socket
import termios
import tty

from paracell.errors import ParacellError

NEED_CONSOLE_SOCKET = (
    "cannot allocate tty if paracell will detach without setting console socket"
)


def send_master(console_socket: str, master_fd: int) -> None:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(console_socket)
            fds = array.array("i", [master_fd])
            sock.sendmsg([b"/dev/ptmx"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
    except OSError as err:
        raise ParacellError(f"console socket {console_socket}: {err.strerror}") from None


def open_for_container(console_socket: str | None) -> int:
    """Returns the pty slave the shim relays; the guest has its own pty behind it."""
    if not console_socket:
        raise ParacellError("a terminal needs --console-socket")
    master, slave = os.openpty()
    try:
        # Raw: the guest's pty does the line discipline; doing it twice would echo twice.
        tty.setraw(slave, termios.TCSANOW)
        send_master(console_socket, master)
    except BaseException:
        os.close(slave)
        raise
    finally:
        os.close(master)
    # The shim is a session leader; opening the slave again makes it the
    # controlling tty, so resizes of the master reach us as SIGWINCH.
    ctty = os.open(os.ttyname(slave), os.O_RDWR)
    os.close(slave)
    return ctty
