"""The shim's relay (csrc/relay.c) with STATS and LIMITS requests
(docs/agent-protocol.md, "Stats"): the real C relay runs in a thread, the
test plays the guest and the clients that ask for a container's figures or
set its limits."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pytest
from paracell._native import lib

from tests.unit.test_relay_quiesce import Shim, frame, nothing_comes, read_frame

REPLY = struct.pack(f"<{lib.PC_STAT_COUNT}Q", *range(lib.PC_STAT_COUNT))


@pytest.fixture
def shim(tmp_path) -> Iterator[Shim]:
    side = Shim(tmp_path)
    yield side
    side.end()


def test_a_stats_request_gets_a_channel_and_its_answer(shim):
    asker = shim.client()
    asker.sendall(frame(lib.PC_STATS, 0, b"member-1"))
    got, chan, payload = read_frame(shim.guest)
    assert (got, payload) == (lib.PC_STATS, b"member-1") and chan > 0
    shim.guest.sendall(frame(lib.PC_STATS_REPLY, chan, REPLY))
    assert read_frame(asker) == (lib.PC_STATS_REPLY, 0, REPLY)
    assert asker.recv(1) == b""  # one request per connection
    # The channel is free again: the next request gets the same one.
    again = shim.client()
    again.sendall(frame(lib.PC_STATS, 0, b"member-2"))
    assert read_frame(shim.guest) == (lib.PC_STATS, chan, b"member-2")
    shim.guest.sendall(frame(lib.PC_ERROR, chan, b"container member-2 is not running"))
    assert read_frame(again) == (lib.PC_ERROR, 0, b"container member-2 is not running")


def test_limits_go_the_way_stats_do_and_are_answered_attached(shim):
    asker = shim.client()
    records = b"container=m\0memory.max=33554432\0"
    asker.sendall(frame(lib.PC_LIMITS, 0, records))
    got, chan, payload = read_frame(shim.guest)
    assert (got, payload) == (lib.PC_LIMITS, records) and chan > 0
    shim.guest.sendall(frame(lib.PC_ATTACHED, chan))
    assert read_frame(asker) == (lib.PC_ATTACHED, 0, b"")
    assert asker.recv(1) == b""


def test_an_asker_that_leaves_kills_nothing_and_its_channel_comes_back(shim):
    asker = shim.client()
    asker.sendall(frame(lib.PC_STATS, 0, b"m"))
    _, chan, _ = read_frame(shim.guest)
    asker.close()
    # Unlike an exec proxy's, its channel has no process to SIGKILL.
    assert nothing_comes(shim.guest)
    shim.guest.sendall(frame(lib.PC_STATS_REPLY, chan, REPLY))
    later = shim.client()
    later.sendall(frame(lib.PC_STATS, 0, b"m"))
    assert read_frame(shim.guest) == (lib.PC_STATS, chan, b"m")


def test_a_stats_connection_cannot_become_a_process(shim):
    asker = shim.client()
    asker.sendall(frame(lib.PC_STATS, 0, b"m") + frame(lib.PC_SPEC, 0, b"container=m\0arg=sh\0"))
    _, chan, _ = read_frame(shim.guest)
    assert asker.recv(1) == b""  # hung up on at the SPEC
    assert nothing_comes(shim.guest)  # which never reached the guest
    shim.guest.sendall(frame(lib.PC_STATS_REPLY, chan, REPLY))


def test_stats_wait_while_the_guest_is_quiesced(shim):
    asker, seq = shim.quiesce()
    reader = shim.client()
    reader.sendall(frame(lib.PC_STATS, 0, b"m"))
    assert nothing_comes(shim.guest)
    shim.guest.sendall(frame(lib.PC_QUIESCED, 0, struct.pack("<I", seq)))
    assert read_frame(asker)[0] == lib.PC_QUIESCED
    asker.sendall(frame(lib.PC_RESUME, 0, struct.pack("<I", 0)))
    assert shim.expect(lib.PC_RESUME, 0) == struct.pack("<I", 0)
    assert read_frame(shim.guest)[::2] == (lib.PC_STATS, b"m")
