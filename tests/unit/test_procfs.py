"""procfs.wait_gone: a process named by pid and start time, waited for by pidfd."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from paracell import procfs


@pytest.fixture
def sleeper() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        start = procfs.process_start_time(proc.pid)
        assert start is not None
        yield proc, start
    finally:
        proc.kill()
        proc.wait()


def test_it_wakes_when_the_process_exits_not_at_its_timeout(sleeper):
    proc, start = sleeper
    threading.Timer(0.2, proc.kill).start()
    began = time.monotonic()
    assert procfs.wait_gone(proc.pid, start, 30.0)
    # Unreaped, the child is a zombie: gone, as far as delete is concerned.
    assert time.monotonic() - began < 15.0


def test_a_live_process_is_still_there_at_the_timeout(sleeper):
    proc, start = sleeper
    assert not procfs.wait_gone(proc.pid, start, 0.1)
    assert procfs.same_process(proc.pid, start)


def test_another_process_on_the_pid_is_not_waited_for(sleeper):
    proc, start = sleeper
    # Another start time: the recorded process is gone, whoever has its pid now.
    assert procfs.wait_gone(proc.pid, start + 1, 30.0)
    assert procfs.same_process(proc.pid, start)


def test_a_reaped_process_is_gone_at_once():
    proc = subprocess.Popen(["true"])
    proc.wait()
    began = time.monotonic()
    assert procfs.wait_gone(proc.pid, 1, 30.0)
    assert time.monotonic() - began < 15.0
