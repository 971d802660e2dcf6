"""Connections to a libvirt daemon through libvirt-python, with every failure
turned into one line that names the URI.

Only a local QEMU driver URI is taken (qemu:///system, optionally with a
query such as ?socket=PATH): the domain's QEMU maps guest RAM from a file on
this host and connects to sockets in ParaCell's directories, so a daemon on
another machine could not run it.
"""

from __future__ import annotations

import re
from typing import Any

from paracell.errors import ParacellError

DEFAULT_URI = "qemu:///system"
MAX_URI = 1024
# Printable ASCII, no spaces or quotes: the URI goes into log lines and errors.
_URI_FORM = re.compile(r"qemu:///(system|session)(\?[!#-&(-~]*)?")
# The oldest libvirt with every element the domain uses: <cpu mode='maximum'>
# (7.1.0); the balloon's freePageReporting, <tcg><tb-cache>, 9p multidevs are older.
MIN_VERSION = (7, 1, 0)
# Where the daemon's own messages would go: libvirt prints each error to
# stderr unless a handler takes it, and the runtime reports one line itself.
_quiet: list[bool] = []


def check_uri(uri: str) -> str:
    if len(uri) > MAX_URI or not _URI_FORM.fullmatch(uri):
        raise ParacellError(f"invalid libvirt URI {uri[:64]!r}: expected a local QEMU driver "
                            "URI such as qemu:///system or qemu:///system?socket=PATH")
    return uri


def version_text(number: int) -> str:
    return f"{number // 1_000_000}.{number // 1000 % 1000}.{number % 1000}"


def libvirt_module() -> Any:
    """libvirt-python, imported on first use, with its stderr printing off."""
    try:
        import libvirt
    except ImportError:
        raise ParacellError("the libvirt backend needs libvirt-python (pip install "
                            "libvirt-python, built against Debian's libvirt-dev)") from None
    if not _quiet:
        libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
        _quiet.append(True)
    return libvirt


def describe(err: Exception) -> str:
    """libvirt's message without its prefixes, on one line."""
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:300]


def open_uri(uri: str) -> Any:
    """A read-write connection, checked for version; one line if it fails:
    the daemon is not running, the socket is not there, or access is denied."""
    libvirt = libvirt_module()
    check_uri(uri)
    try:
        conn = libvirt.open(uri)
    except libvirt.libvirtError as err:
        message = describe(err)
        if "ermission denied" in message:
            raise ParacellError(f"libvirt at {uri}: permission denied ({message})") from None
        raise ParacellError(f"libvirt at {uri} is not reachable: {message}") from None
    if conn is None:
        raise ParacellError(f"libvirt at {uri} is not reachable")
    try:
        have = conn.getLibVersion()
    except libvirt.libvirtError as err:
        conn.close()
        raise ParacellError(f"libvirt at {uri}: {describe(err)}") from None
    needed = MIN_VERSION[0] * 1_000_000 + MIN_VERSION[1] * 1000 + MIN_VERSION[2]
    if have < needed:
        conn.close()
        raise ParacellError(f"libvirt at {uri} is version {version_text(have)}: paracell needs "
                            f"{version_text(needed)} or newer")
    return conn


def error_code(err: Exception) -> int:
    get = getattr(err, "get_error_code", None)
    return int(get() or 0) if get else 0


def is_no_domain(err: Exception) -> bool:
    libvirt = libvirt_module()
    return isinstance(err, libvirt.libvirtError) and error_code(err) == libvirt.VIR_ERR_NO_DOMAIN


def is_active(conn: Any, name: str) -> bool:
    """Whether the domain runs; False for one that is gone or unreadable."""
    libvirt = libvirt_module()
    try:
        return conn.lookupByName(name).isActive() == 1
    except libvirt.libvirtError:
        return False
