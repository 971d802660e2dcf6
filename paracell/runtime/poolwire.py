"""The warm pool's socket and messages (docs/pool.md), defined once for its
three parties: the pool's daemon (runtime/pool/), a pooled VM's shim, which
takes its lease there, and a create that claims a VM.

Each message is one JSON object on one line, at most MESSAGE_MAX bytes, on a
connection of its own. A lease is a connection: the shim holds one end for
its VM's life and ends the VM when the other end is gone. The pool holds that
other end while the VM waits; a claim hands it, as an fd, to the create that
takes the VM, whose container holds it from then on.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from paracell import unixsock
from paracell.errors import ParacellError

# In the runtime's --root, named so no container ID can take it ("~" is not
# a character of an ID: runtime/state/ids.py).
POOL_DIR = "~pool"
SOCKET = "pool.sock"
LOCK = "lock"
# A pooled VM is a container of the root, with an ID under this prefix.
VM_PREFIX = "paracell-pool-"
MESSAGE_MAX = 4096
TIMEOUT_S = 5.0
# What a claim answers when no VM is waiting.
NONE_WAITING = ""


def pool_dir(root: str) -> Path:
    return Path(root) / POOL_DIR


def socket_path(root: str) -> Path:
    return pool_dir(root) / SOCKET


def is_pool_vm(container_id: str) -> bool:
    return container_id.startswith(VM_PREFIX)


def send(sock: socket.socket, message: dict[str, object], fds: tuple[int, ...] = ()) -> None:
    line = json.dumps(message).encode() + b"\n"
    if len(line) > MESSAGE_MAX:
        raise ParacellError("pool message too long")
    if fds:
        socket.send_fds(sock, [line], list(fds))
    else:
        sock.sendall(line)


def receive(sock: socket.socket, max_fds: int = 0) -> tuple[dict[str, object], list[int]]:
    """One message and the fds that came with it (at most max_fds; any more
    are closed). Whatever is not one bounded JSON object is refused."""
    data, fds = b"", []
    while not data.endswith(b"\n"):
        chunk, got, _, _ = socket.recv_fds(sock, MESSAGE_MAX, max(max_fds, 1))
        fds.extend(got)
        if not chunk or len(data) + len(chunk) > MESSAGE_MAX:
            break
        data += chunk
    for extra in fds[max_fds:]:
        os.close(extra)
    fds = fds[:max_fds]
    try:
        message = json.loads(data) if data.endswith(b"\n") else None
    except ValueError:
        message = None
    if not isinstance(message, dict):
        for fd in fds:
            os.close(fd)
        raise ParacellError("the pool sent no valid message")
    return message, fds


def take_lease(root: str, vm_id: str) -> socket.socket:
    """A pooled VM's shim: its lease from the pool that made it."""
    sock = unixsock.connect(socket_path(root))
    sock.settimeout(TIMEOUT_S)
    send(sock, {"lease": vm_id})
    sock.settimeout(None)
    return sock


def lend_port_forwarding(lease_fd: int, fds: list[int]) -> None:
    """The one message on a lease (csrc/relay.h, PC_LEASE_FORWARD_*), from
    the container that holds it: its namespace's port forwarding listeners,
    which the pooled VM's shim serves from then on."""
    from paracell._native import lib

    if not lib.PC_LEASE_FORWARD_MIN_FDS <= len(fds) <= lib.PC_LEASE_FORWARD_MAX_FDS:
        raise ParacellError(f"internal: {len(fds)} port forwarding fds for a lease")
    with socket.socket(fileno=os.dup(lease_fd)) as sock:
        socket.send_fds(sock, [bytes([len(fds)])], fds)


@dataclass
class Claim:
    """A pooled VM taken for a container, and its lease: holding the fd keeps
    the VM; closing it ends the VM."""

    vm_id: str
    lease_fd: int

    def release(self) -> None:
        if self.lease_fd >= 0:
            os.close(self.lease_fd)
            self.lease_fd = -1


def request(root: str, message: dict[str, object], max_fds: int = 0
            ) -> tuple[dict[str, object], list[int]]:
    """One request to the pool of this root, and its answer."""
    sock = unixsock.connect(socket_path(root))
    with sock:
        sock.settimeout(TIMEOUT_S)
        send(sock, message)
        return receive(sock, max_fds)


def claim(root: str, kind: str) -> Claim | None:
    """A waiting VM of this kind (runtime/pod/pooled.py's kind_of) from this
    root's pool, or None where no pool serves it or none is waiting (the
    create then makes a VM of its own)."""
    try:
        answer, fds = request(root, {"claim": kind}, max_fds=1)
    except (OSError, ParacellError):
        return None
    vm_id = answer.get("id")
    if not isinstance(vm_id, str) or not is_pool_vm(vm_id) or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        return None
    return Claim(vm_id, fds[0])
