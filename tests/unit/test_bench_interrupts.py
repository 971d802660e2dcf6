"""A benchmark's spawn of a sandbox cannot be split by Ctrl-C: the child
either has a Popen object that the cleanup waits on, or was never made."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

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


def test_an_interrupt_right_after_the_fork_still_waits_for_the_child(tmp_path, monkeypatch):
    """The child is the `paracell run --detach` that creates a VM. Ctrl-C
    that lands as Popen returns, before its result is assigned, must not
    leave that child running unwaited (it would start a VM after the
    cleanup): the interrupt arrives once run_detached has waited for it."""
    made = tmp_path / "made"
    child = f"import time; time.sleep(0.5); open({str(made)!r}, 'w').close()"
    real_popen = subprocess.Popen

    def popen_then_interrupt(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)  # the window between fork and assignment
        return proc

    monkeypatch.setattr(subprocess, "Popen", popen_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        common.run_detached([sys.executable, "-c", child])
    assert made.exists()
