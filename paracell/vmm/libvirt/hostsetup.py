"""What the libvirt backend needs of how the daemon is set up, beyond the
features of its QEMU (features.py): two qemu.conf settings, a log manager,
and a mount namespace that ParaCell's RAM directory reaches
(docs/libvirt.md, "Pointing ParaCell at a system libvirtd").

QEMU's user comes from the daemon's own capabilities (its DAC base label).
The rest cannot be asked of libvirt's API, so it is read from the daemon's
process (daemon.py). Each check gives a Feature: present, missing (with the
one line that `create` fails with), or unverified (present None) with the
reason, which `create` lets pass and `paracell check` shows.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from typing import Any

from paracell.errors import ParacellError
from paracell.vmm.libvirt import connection, daemon
from paracell.vmm.libvirt.features import Feature

CONF = daemon.QEMU_CONF
DOC = "see docs/libvirt.md"


class _Daemon:
    """The daemon found once per check, or why it could not be."""

    def __init__(self, uri: str) -> None:
        self.found: daemon.Daemon | None = None
        self.why = ""
        self.conf: dict[str, Any] | None = None
        self.conf_why = ""
        try:
            self.found = daemon.find(uri)
        except ParacellError as err:
            self.why = self.conf_why = f"cannot tell which process serves {uri}: {err}"
            return
        try:
            self.conf = daemon.qemu_conf(self.found)
        except ParacellError as err:
            self.conf_why = str(err)

    @property
    def restart(self) -> str:
        return f"restart {self.found.name if self.found else 'libvirtd'}"


def findings(conn: Any, uri: str, engine: str, memory_dir: str) -> Iterator[Feature]:
    """One at a time, cheapest first: `create` stops at the first missing
    one, before the capabilities call that a daemon with the wrong user
    answers slowly."""
    found = _Daemon(uri)
    yield _capabilities(found)
    yield _log_manager(found)
    yield _ram_directory(found, memory_dir)
    yield _qemu_user(conn, found, engine)


def _capabilities(found: _Daemon) -> Feature:
    name = "qemu.conf clear_emulator_capabilities = 0"
    if found.conf is None:
        return Feature(name, None, found.conf_why)
    value = found.conf.get("clear_emulator_capabilities")
    if value == 0:
        return Feature(name, True, CONF)
    have = "not set (libvirt's default is 1)" if value is None else f"set to {value}"
    return Feature(name, False, f"{have} in {CONF}",
                   why=f": {CONF} lacks clear_emulator_capabilities = 0 (QEMU's 9p server keeps "
                       "the container's owners with its capabilities): set it and "
                       f"{found.restart}; {DOC}")


def _log_manager(found: _Daemon) -> Feature:
    name = "log manager for QEMU's output"
    handler = found.conf.get("stdio_handler", "logd") if found.conf is not None else None
    if handler == "file":
        return Feature(name, True, 'stdio_handler = "file": no virtlogd needed')
    if found.found is None:
        return Feature(name, None, found.why)
    refused = daemon.log_manager_refusal(found.found)
    if refused is None:
        return Feature(name, True, f"virtlogd answers at {daemon.VIRTLOGD_SOCKET}")
    if found.conf is None:
        return Feature(name, None, f"virtlogd does not answer ({refused}), and qemu.conf's "
                                   f"stdio_handler is unknown: {found.conf_why}")
    return Feature(name, False, f"virtlogd does not answer ({refused})",
                   why=f": virtlogd is not running ({refused}), and qemu.conf sends QEMU's "
                       "output to it: start virtlogd (systemctl start virtlogd.socket), or set "
                       f'stdio_handler = "file" in {CONF} and {found.restart}; {DOC}')


def _ram_directory(found: _Daemon, memory_dir: str) -> Feature:
    name = f"RAM directory {memory_dir} reaches the daemon"
    if found.found is None:
        return Feature(name, None, found.why)
    try:
        seen, detail = daemon.sees(found.found, memory_dir)
    except ParacellError as err:
        return Feature(name, None, str(err))
    if seen:
        return Feature(name, True, detail)
    return Feature(name, False, detail,
                   why=f": {found.found.name} does not see ParaCell's RAM directory {memory_dir} "
                       f"({detail}), so its QEMU could not reach ParaCell's sockets there; see "
                       "\"Mount propagation\" in docs/libvirt.md")


def _qemu_user(conn: Any, found: _Daemon, engine: str) -> Feature:
    name = "QEMU's user can open /dev/kvm"
    libvirt = connection.libvirt_module()
    virt_type = "kvm" if engine == "kvm" else "qemu"
    try:
        caps = ET.fromstring(conn.getCapabilities())
    except libvirt.libvirtError as err:
        return Feature(name, None, f"capabilities: {connection.describe(err)}")
    except ET.ParseError:
        return Feature(name, None, "capabilities: unreadable answer")
    label = next((b.text or "" for m in caps.findall("host/secmodel")
                  if m.findtext("model") == "dac"
                  for b in m.findall("baselabel") if b.get("type") == virt_type), "")
    try:
        uid, gid = (int(part.lstrip("+")) for part in label.split(":"))
    except ValueError:
        return Feature(name, None, f"no DAC base label for {virt_type} in the capabilities")
    kvm = (found.found.root if found.found else "") + "/dev/kvm"
    opens, detail = _opens(kvm, uid, gid)
    if opens:
        return Feature(name, True, detail)
    return Feature(name, False, detail,
                   why=f": QEMU's user {_user_name(uid)} (uid {uid}, qemu.conf's user) cannot "
                       "open /dev/kvm, so libvirt probes QEMU again on every call (seconds "
                       f'each): set user = "root" and group = "root" in {CONF} and '
                       f"{found.restart}; {DOC}")


def _user_name(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _opens(kvm: str, uid: int, gid: int) -> tuple[bool, str]:
    """libvirt's own test (virFileAccessibleAs, read and write) by the mode
    bits, ACLs aside: root always can, and with no /dev/kvm there is
    nothing to re-probe for."""
    if uid == 0:
        return True, f"QEMU's user is root (+{uid}:+{gid})"
    try:
        st = os.stat(kvm)
    except FileNotFoundError:
        return True, "no /dev/kvm"
    except OSError as err:
        return False, f"/dev/kvm: {err.strerror}"
    if st.st_uid == uid:
        bits = 0o600
    else:
        try:
            groups = set(os.getgrouplist(_user_name(uid), gid))
        except OSError:
            groups = {gid}
        bits = 0o060 if st.st_gid in groups else 0o006
    mode = f"{st.st_mode & 0o777:03o} {st.st_uid}:{st.st_gid}"
    if st.st_mode & bits == bits:
        return True, f"uid {uid} opens /dev/kvm ({mode})"
    return False, f"uid {uid} cannot open /dev/kvm ({mode})"
