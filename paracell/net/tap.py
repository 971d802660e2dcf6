"""TAP devices for QEMU's virtio-net, made in the container's network namespace.

A TAP is opened, never made persistent: it exists while an fd to it is open,
so when QEMU (which inherits the fd) dies, the kernel removes the TAP and the
tc filters on it, whoever was supposed to clean up.
"""

from __future__ import annotations

import fcntl
import os
import struct

from paracell.errors import ParacellError
from paracell.linux import (
    IFF_NO_PI,
    IFF_TAP,
    IFF_UP,
    IFF_VNET_HDR,
    IFNAMSIZ,
    SIOCGIFFLAGS,
    SIOCSIFFLAGS,
    TUNSETIFF,
    TUNSETPERSIST,
)
from paracell.net.discover import TAP_PREFIX

# QEMU finds IFF_VNET_HDR on the fd and then passes checksum and segmentation
# offloads between the guest and the host kernel instead of doing them itself.


def open_tap(name: str = f"{TAP_PREFIX}%d") -> tuple[int, str]:
    """A new TAP in the current network namespace: its fd (close-on-exec;
    QEMU gets it through pass_fds) and the name the kernel gave it. The
    default name's "%d" lets the kernel pick the first free number, so no
    name can collide."""
    try:
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
    except OSError as err:
        raise ParacellError(f"open /dev/net/tun: {err.strerror}") from None
    try:
        request = struct.pack(f"{IFNAMSIZ}sH22x", name.encode(), IFF_TAP | IFF_NO_PI | IFF_VNET_HDR)
        answer = fcntl.ioctl(fd, TUNSETIFF, request)
    except OSError as err:
        os.close(fd)
        raise ParacellError(f"creating a TAP device: {err.strerror}") from None
    return fd, answer[:IFNAMSIZ].split(b"\0", 1)[0].decode()


def make_persistent_tap(name: str) -> None:
    """A TAP that outlives our fd, for a VMM that opens it by name (libvirt's
    managed='no'); it must be deleted by name (`ip link del`) when done."""
    fd, _ = open_tap(name)
    try:
        fcntl.ioctl(fd, TUNSETPERSIST, 1)
    except OSError as err:
        raise ParacellError(f"making TAP {name} persistent: {err.strerror}") from None
    finally:
        os.close(fd)


def disable_ipv6(name: str) -> None:
    """The TAP is a wire, not a host interface: without this, the namespace's
    stack would give it a link-local address and send neighbour discovery
    into the guest. /proc/sys/net shows the writer's own network namespace."""
    try:
        with open(f"/proc/sys/net/ipv6/conf/{name}/disable_ipv6", "w") as f:
            f.write("1")
    except FileNotFoundError:
        pass  # a host kernel without IPv6


def bring_up(name: str) -> None:
    """IFF_UP on an interface of the current namespace, with an ioctl: the
    shim does it itself, without a netlink child (paracell/net/netlinkchild.py)."""
    import socket

    ifreq = struct.Struct(f"{IFNAMSIZ}sH22x")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            raw = name.encode()[:IFNAMSIZ - 1]
            flags = ifreq.unpack(fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, ifreq.pack(raw, 0)))[1]
            fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, ifreq.pack(raw, flags | IFF_UP))
    except OSError as err:
        raise ParacellError(f"bringing TAP {name} up: {err.strerror}") from None
