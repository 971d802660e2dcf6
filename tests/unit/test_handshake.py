"""The host's half of READY -> SANDBOX against a hostile or outdated guest:
the test plays the guest on a socketpair, the real framing code reads it."""

from __future__ import annotations

import socket
import struct

import pytest
from paracell._native import lib

from paracell.errors import ParacellError
from paracell.runtime.agent import channel, sandboxspec


def frame(ftype: int, payload: bytes = b"") -> bytes:
    return struct.pack("<IHH", len(payload), ftype, 0) + payload


def ready(version: int, caps: int) -> bytes:
    return frame(lib.PC_READY, struct.pack("<II", version, caps))


def host_sees(guest_bytes: bytes) -> socket.socket:
    ours, guest = socket.socketpair()
    guest.sendall(guest_bytes)
    guest.close()
    return ours


def test_a_guest_of_this_protocol_is_taken():
    ours = host_sees(ready(lib.PC_PROTO_VERSION, lib.PC_AGENT_CAPS | 0x100))
    assert channel.expect_ready(ours.fileno(), 5) == lib.PC_AGENT_CAPS | 0x100


@pytest.mark.parametrize("guest, message", [
    (ready(lib.PC_PROTO_VERSION + 1, lib.PC_AGENT_CAPS),
     f"the guest agent speaks protocol {lib.PC_PROTO_VERSION + 1}, this runtime "
     f"{lib.PC_PROTO_VERSION}: rebuild the guest (paracell guest build)"),
    # Protocol 1's READY: a version text.
    (frame(lib.PC_READY, b"paracell-agent 1"),
     "the guest agent speaks an older protocol than this runtime"),
    (ready(lib.PC_PROTO_VERSION, 0), "the guest agent lacks capabilities"),
    (frame(lib.PC_CREATED, struct.pack("<I", 1)), "expected READY, got type"),
    (b"", "booting the micro-VM: the channel closed"),
])
def test_a_mismatch_is_refused_in_one_line(guest, message):
    ours = host_sees(guest)
    with pytest.raises(ParacellError) as refused:
        channel.expect_ready(ours.fileno(), 5)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_attach_waits_for_attached_or_names_the_guests_error():
    ours, guest = socket.socketpair()
    guest.sendall(frame(lib.PC_ATTACHED))
    channel.attach_sandbox(ours.fileno(), b"share=rootfs\0", 5)
    sent = guest.recv(65536)
    length, ftype, _ = struct.unpack("<IHH", sent[:8])
    assert (ftype, sent[8:8 + length]) == (lib.PC_SANDBOX, b"share=rootfs\0")
    ours, guest = socket.socketpair()
    guest.sendall(frame(lib.PC_ERROR, b"sandbox: mount rootfs: No such device"))
    with pytest.raises(ParacellError, match="^sandbox: mount rootfs: No such device$"):
        channel.attach_sandbox(ours.fileno(), b"", 5)
    ours, guest = socket.socketpair()
    guest.sendall(frame(lib.PC_ATTACHED, b"x"))
    with pytest.raises(ParacellError, match="expected ATTACHED"):
        channel.attach_sandbox(ours.fileno(), b"", 5)


def test_the_clock_record_keeps_nanoseconds_exact():
    assert sandboxspec.clock_record(1_764_576_000_000_000_123) == ("clock",
                                                                  "1764576000.000000123")
    assert sandboxspec.clock_record(5) == ("clock", "0.000000005")
