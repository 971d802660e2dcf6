"""A benchmark's spawn of a sandbox cannot be split by Ctrl-C: the child
either has a Popen object that the cleanup waits on, or was never made."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from paracell.bench import common


def test_an_interrupt_during_a_spawn_arrives_once_the_child_is_named():
    with pytest.raises(KeyboardInterrupt), common.interrupts_deferred():
        os.kill(os.getpid(), signal.SIGINT)
        proc = subprocess.Popen([sys.executable, "-c", "pass"])
    assert proc.wait(10) == 0


def test_a_held_sigterm_reaches_the_handler_outside_the_block():
    got: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: got.append(signum))
    try:
        with common.interrupts_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            assert got == []
        assert got == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_an_interrupted_detached_run_returns_only_once_its_child_is_done(tmp_path):
    """The child is the `paracell run --detach` that creates a VM: the
    cleanup after Ctrl-C must find what it made, so it is waited for."""
    made = tmp_path / "made"
    child = f"import time; time.sleep(0.5); open({str(made)!r}, 'w').close()"
    threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        common.run_detached([sys.executable, "-c", child])
    assert made.exists()
