"""qemu.conf as libvirt reads it (paracell/vmm/libvirt/virconf.py), and which
daemon socket a URI names (daemon.socket_of): the pieces of the daemon's
setup checks that need no daemon. The checks themselves run against private
daemons in tests/integration/test_libvirt_setup.py."""

from __future__ import annotations

import os

import pytest

from paracell.errors import ParacellError
from paracell.vmm.libvirt import daemon, virconf
from tests.libvirtd import QEMU_CONF


def test_the_fixtures_qemu_conf_reads_as_libvirt_reads_it():
    assert virconf.parse(QEMU_CONF) == {"clear_emulator_capabilities": 0,
                                        "stdio_handler": "file", "user": "root",
                                        "group": "root"}


@pytest.mark.skipif(not os.path.exists("/etc/libvirt/qemu.conf"), reason="no libvirt here")
def test_debians_qemu_conf_sets_nothing():
    # Every setting of the file libvirt-daemon-system installs is a comment:
    # a stock daemon runs with libvirt's defaults.
    with open("/etc/libvirt/qemu.conf") as f:
        assert virconf.parse(f.read()) == {}


def test_values_lists_strings_and_separators():
    text = ('a = 1 # why\nb = "x"; c = [ "p",\n\n  \'q\' , ]\n'
            'd = """two\nlines"""\na = 2\ne = -5\nf = []\n')
    assert virconf.parse(text) == {"a": 1, "b": "x", "c": ["p", "q"], "d": "two\nlines",
                                   "e": -5, "f": []}


@pytest.mark.parametrize("text, error", [
    ("a = ", "line 1: expecting a value"),
    ("a 1", "line 1: expecting an assignment"),
    ('a = "x\n', "line 1: unterminated string"),
    ("a = 1\n\n1 = 2", "line 3: expecting a name"),
    ("a = 1 2", "line 1: expecting a separator"),
    # libvirt takes no comment inside a list either
    ("a = [ 1,\n# no\n 2 ]", "line 2: expecting a value"),
])
def test_what_libvirt_would_not_parse_is_an_error(text: str, error: str):
    with pytest.raises(ParacellError, match=error):
        virconf.parse(text)


@pytest.mark.parametrize("uri, path, name", [
    ("qemu:///system?socket=/tmp/x/libvirt-sock", "/tmp/x/libvirt-sock", "libvirtd"),
    ("qemu:///system?socket=%2Ftmp%2Fy", "/tmp/y", "libvirtd"),
    ("qemu:///system?mode=direct", "/run/libvirt/virtqemud-sock", "virtqemud"),
    ("qemu:///system?mode=legacy", "/run/libvirt/libvirt-sock", "libvirtd"),
    ("qemu:///session?socket=/run/user/0/libvirt/virtqemud-sock",
     "/run/user/0/libvirt/virtqemud-sock", "virtqemud"),
])
def test_the_socket_a_uri_names(uri: str, path: str, name: str):
    assert daemon.socket_of(uri) == (path, name)


def test_a_session_daemon_without_a_socket_cannot_be_told():
    with pytest.raises(ParacellError, match=r"\?socket=PATH"):
        daemon.socket_of("qemu:///session")
