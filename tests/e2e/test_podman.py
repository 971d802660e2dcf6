"""podman 4.3 (Debian) with conmon drives paracell via --runtime, unmodified."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import IMAGE

pytestmark = pytest.mark.e2e


def test_run_rm_echo(podman):
    result = podman("run", "--rm", IMAGE, "echo", "hello from podman")
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"hello from podman\n"


def test_exit_code(podman):
    result = podman("run", "--rm", IMAGE, "sh", "-c", "exit 4")
    assert result.returncode == 4, result.stderr


def test_detached_exec_stop_rm(podman):
    started = podman("run", "-d", "--name", "pd", IMAGE, "sleep", "300")
    assert started.returncode == 0, started.stderr
    try:
        ex = podman("exec", "pd", "sh", "-c", "cat /etc/hostname >/dev/null; echo in-exec")
        assert ex.returncode == 0, ex.stderr
        assert ex.stdout == b"in-exec\n"
        stopped = podman("stop", "-t", "2", "pd")
        assert stopped.returncode == 0, stopped.stderr
    finally:
        removed = podman("rm", "-f", "pd")
    assert removed.returncode == 0, removed.stderr
    assert b"pd" not in podman("ps", "-a", "--format", "{{.Names}}").stdout


def test_interactive_tty(podman):
    result = podman("run", "-it", "--rm", IMAGE, "sh", "-c", "tty", tty=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert b"/dev/pts/" in result.stdout


def test_memory_and_cpus_size_the_vm(podman):
    # podman writes linux.resources and its own cgroupsPath (cgroupfs):
    # guest RAM follows --memory, vCPUs follow --cpus.
    result = podman("run", "--rm", "--memory", "300m", "--cpus", "2", IMAGE, "sh", "-c",
                    "grep MemTotal /proc/meminfo; nproc")
    assert result.returncode == 0, result.stderr
    meminfo, nproc = result.stdout.decode().splitlines()
    assert 250 << 10 < int(meminfo.split()[1]) <= 300 << 10
    assert nproc == "2"
