"""Which network namespace a container's VM lives in, and how the shim gets there.

A VM cannot share a network stack with anything: its kernel has its own. What
the spec's network namespace decides is where the shim and QEMU sit on the
host, and so which interfaces the VM gets (paracell/net/device.py):

- a `network` entry with a path (podman, containerd: the namespace CNI filled):
  the shim joins it, and every Ethernet interface there is mirrored into the VM;
- a `network` entry without a path: a new, empty namespace, so the VM has
  only its own `lo`, and QEMU reaches no network on the host either;
- no `network` entry, or a path to the runtime's own namespace (runc's "host
  network"): the VM gets no interface at all, since it cannot be given the
  host's stack (docs/networking.md); the shim stays where it is;
- a pod's app container (Kubernetes, podman), which joins its sandbox's namespace: the
  shim joins it too, but the sandbox's VM holds its interfaces (one VM per
  namespace), so this VM gets none, and `--log` says so.
"""

from __future__ import annotations

import ctypes
import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from paracell.errors import ParacellError
from paracell.linux import CLONE_NEWNET, libc

HOST, NEW, JOIN, POD = "host", "new", "join", "pod"
NOTICES = {
    HOST: "the spec shares the host's network namespace, which a VM cannot: "
          "the container gets no network interface besides lo",
    POD: "the container joins its pod's network namespace, whose interfaces the pod "
         "sandbox's VM holds: it gets no network interface besides lo",
}
T = TypeVar("T")


@dataclass(frozen=True)
class NetworkPlan:
    mode: str  # HOST, NEW or JOIN
    path: str = ""
    # A fork's (paracell/runtime/snapshots/forking.py): its VM loads its
    # parent's device state, so it has the parent's virtio-net devices
    # (interfaces, spares) whatever its own namespace holds.
    devices: tuple[int, int] | None = None
    # A fork's namespace as `fork` checked it (st_dev, st_ino): the shim joins
    # that namespace or none, whatever the path names by then.
    identity: tuple[int, int] | None = None
    # A fork's or a restore's: its guest wakes with another VM's addresses,
    # so its wire waits until FORKED has replaced them (device.py, fork_ready).
    forked: bool = False


def plan(namespaces: dict[str, str], in_pods_network: bool) -> NetworkPlan:
    """From linux.namespaces as type -> path ("" for a new one).
    in_pods_network: the container is a pod member whose namespace another
    VM holds (runtime/pod/pod.py decides who is one)."""
    if "network" not in namespaces:
        return NetworkPlan(HOST)
    path = namespaces["network"]
    if not path:
        return NetworkPlan(NEW)
    try:
        given, own = os.stat(path), os.stat("/proc/self/ns/net")
    except OSError as err:
        raise ParacellError(f"network namespace {path}: {err.strerror}") from None
    if not stat.S_ISREG(given.st_mode):
        # A namespace file is an empty regular file (nsfs); a FIFO or device
        # is not one, and opening it could block.
        raise ParacellError(f"network namespace {path}: not a namespace file")
    if (given.st_dev, given.st_ino) == (own.st_dev, own.st_ino):
        return NetworkPlan(HOST)
    if in_pods_network:
        return NetworkPlan(POD, path)
    return NetworkPlan(JOIN, path)


def join(path: str, identity: tuple[int, int] | None = None) -> None:
    """setns(2) into the network namespace at path (and, with `identity`,
    only if it is still that namespace). The calling thread moves; the shim
    calls it while it is the only thread, before QEMU exists, so QEMU and
    every later thread start inside."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as err:
        raise ParacellError(f"network namespace {path}: {err.strerror}") from None
    try:
        if identity is not None and _identity(os.fstat(fd)) != identity:
            raise ParacellError(f"network namespace {path}: it is another namespace than "
                                "the one checked before (the path was replaced)")
        if libc().setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise ParacellError(f"joining network namespace {path}: {os.strerror(err)}"
                                + (" (not a network namespace)" if err == 22 else ""))
    finally:
        os.close(fd)


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def identity_of(path: str) -> tuple[int, int] | None:
    """The namespace a live path names (a process's /proc/PID/ns/net), or None."""
    try:
        return _identity(os.stat(path))
    except OSError:
        return None


def check_given(path: str) -> tuple[int, int]:
    """A network namespace file handed to us by a caller (a fork's --netns),
    as hostile input: an absolute path whose last component is no symbolic
    link, a regular file (nsfs; a FIFO or device is never opened for
    reading), that is a network namespace and not this process's own. Its
    identity, which the shim checks again when it joins."""
    import fcntl

    from paracell.linux import NS_GET_NSTYPE

    shown = path[:200]
    if not path or not os.path.isabs(path) or "\0" in path:
        raise ParacellError(f"network namespace {shown!r}: not an absolute path")
    try:
        seen = os.lstat(path)
    except OSError as err:
        raise ParacellError(f"network namespace {shown}: {err.strerror}") from None
    if stat.S_ISLNK(seen.st_mode):
        raise ParacellError(f"network namespace {shown}: a symbolic link; give the "
                            "namespace file itself")
    if not stat.S_ISREG(seen.st_mode):
        raise ParacellError(f"network namespace {shown}: not a namespace file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as err:
        raise ParacellError(f"network namespace {shown}: {err.strerror}") from None
    try:
        opened = os.fstat(fd)
        try:
            kind = fcntl.ioctl(fd, NS_GET_NSTYPE)
        except OSError:
            kind = -1
    finally:
        os.close(fd)
    if _identity(opened) != _identity(seen):
        raise ParacellError(f"network namespace {shown}: it changed while it was checked")
    if kind != CLONE_NEWNET:
        raise ParacellError(f"network namespace {shown}: not a network namespace")
    if _identity(opened) == identity_of("/proc/self/ns/net"):
        raise ParacellError(f"network namespace {shown}: the runtime's own (the host's "
                            "network), which a VM cannot be given")
    return _identity(opened)


def unshare() -> None:
    """A new network namespace holding only a down `lo`, for the calling thread."""
    if libc().unshare(CLONE_NEWNET) != 0:
        raise ParacellError(
            f"new network namespace: {os.strerror(ctypes.get_errno())}")


_left: list[int] = []


def enter(network: NetworkPlan) -> None:
    """The shim's one step into the container's network namespace. The one
    it leaves stays open (`left_fd`): a libvirt domain's TAPs are lent to it."""
    if network.mode in (JOIN, NEW) and not _left:
        _left.append(os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC))
    if network.mode in (JOIN, POD):
        join(network.path, network.identity)
    elif network.mode == NEW:
        unshare()


def left_fd() -> int:
    """The network namespace the shim was started in (the caller's), or -1."""
    return _left[0] if _left else -1


def run_inside(path: str, body: Callable[[], T],
               identity: tuple[int, int] | None = None) -> T | None:
    """Runs body in a thread of its own that joined the namespace at path,
    leaving the caller's namespace alone; None when the namespace is gone,
    or (with `identity`) when the path names another namespace by now.
    For cleanup from a process outside it (delete, tests)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    if identity is not None and _identity(os.fstat(fd)) != identity:
        os.close(fd)
        return None
    result: list[T] = []
    failure: list[BaseException] = []

    def worker() -> None:
        try:
            if libc().setns(fd, CLONE_NEWNET) != 0:
                raise ParacellError(f"joining network namespace {path}: "
                                    f"{os.strerror(ctypes.get_errno())}")
            result.append(body())
        except BaseException as err:  # handed to the caller's thread
            failure.append(err)

    try:
        thread = threading.Thread(target=worker, name="netns")
        thread.start()
        thread.join()
    finally:
        os.close(fd)
    if failure:
        raise failure[0]
    return result[0]
