"""Starting and stopping one QEMU process, with nothing left behind."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from paracell.vmm.qemu import VmSpec, command_line


def _die_with_parent() -> None:
    # If the shim is killed (even with SIGKILL), its VM must not outlive it.
    from paracell._native import lib

    lib.pc_set_pdeathsig(signal.SIGKILL)


def launch(spec: VmSpec, log_path: Path) -> subprocess.Popen[bytes]:
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        return subprocess.Popen(
            command_line(spec),
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            pass_fds=(spec.agent_fd, spec.qmp_fd),
            # Its own session: a ^C meant for the container must not kill the VM.
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    finally:
        os.close(log_fd)


def stop(proc: subprocess.Popen[bytes], grace_s: float) -> int:
    """Waits for a VM that was asked to power off, then makes sure it is gone."""
    try:
        return proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def kill_pid(pid: int, start_time: int) -> None:
    """Kills a QEMU we started, if that pid is still the same process."""
    from paracell.runtime.state import process_start_time

    if pid > 0 and process_start_time(pid) == start_time:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
