"""containerd 1.6 (Debian) drives paracell through its runc v2 shim, unmodified."""

from __future__ import annotations

import glob
import time

import pytest

from tests.e2e.conftest import IMAGE

pytestmark = pytest.mark.e2e


def test_run_exit_code(containerd):
    result = containerd.ctr("run", *containerd.run_args(), "--rm", IMAGE, "ctr-exit",
                            "sh", "-c", "echo from-containerd; exit 3")
    assert result.returncode == 3, result.stderr
    assert b"from-containerd" in result.stdout


def test_detached_exec_ps_kill_delete(containerd):
    started = containerd.ctr("run", *containerd.run_args(), "-d", IMAGE, "ctr-d", "sleep", "300")
    assert started.returncode == 0, started.stderr
    try:
        ex = containerd.ctr("task", "exec", "--exec-id", "e1", "ctr-d", "sh", "-c",
                            "echo exec-out; exit 5")
        assert ex.returncode == 5, ex.stderr
        assert ex.stdout == b"exec-out\n"
        ps = containerd.ctr("task", "ps", "ctr-d")
        assert ps.returncode == 0, ps.stderr
        assert len(ps.stdout.decode().strip().splitlines()) >= 2
        # sleep is PID 1 of its namespace and ignores SIGTERM, exactly as under runc.
        assert containerd.ctr("task", "kill", "-s", "SIGKILL", "ctr-d").returncode == 0
        deadline = time.monotonic() + 60
        while b"STOPPED" not in containerd.ctr("task", "ls").stdout:
            assert time.monotonic() < deadline, "task never stopped"
            time.sleep(0.2)
        deleted = containerd.ctr("task", "delete", "ctr-d")
        assert deleted.returncode == 0, deleted.stderr
    finally:
        containerd.ctr("task", "delete", "--force", "ctr-d")
        containerd.ctr("containers", "delete", "ctr-d")
    assert containerd.ctr("task", "ls").stdout.count(b"\n") <= 1


def test_run_rm_leaves_nothing(containerd):
    result = containerd.ctr("run", *containerd.run_args(), "--rm", IMAGE, "ctr-rm", "true")
    assert result.returncode == 0, result.stderr
    assert b"ctr-rm" not in containerd.ctr("containers", "ls").stdout
    assert containerd.leftovers("ctr-rm") == []


def test_tty(containerd):
    result = containerd.ctr("run", *containerd.run_args(), "-t", "--rm", IMAGE, "ctr-tty",
                            "sh", "-c", "tty; stty size", tty=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert b"/dev/pts/" in result.stdout


def test_memory_limit_sizes_the_vm_and_cgroup_goes_with_delete(containerd):
    # containerd's cgroupsPath is /default/ID; ctr's --memory-limit and --cpus
    # go to linux.resources.
    result = containerd.ctr("run", *containerd.run_args(), "--rm", "--memory-limit",
                            str(300 << 20), "--cpus", "2", IMAGE, "ctr-size", "sh", "-c",
                            "grep MemTotal /proc/meminfo; nproc")
    assert result.returncode == 0, result.stderr
    meminfo, nproc = result.stdout.decode().splitlines()
    assert 250 << 10 < int(meminfo.split()[1]) <= 300 << 10
    assert nproc == "2"
    assert glob.glob("/sys/fs/cgroup/*/default/ctr-size") == []


def test_a_task_takes_a_vm_from_the_warm_pool(containerd):
    """`paracell pool serve` on the root containerd's shim gives paracell
    (docs/pool.md): a task takes a waiting VM, runs with its stdio and exit
    status as any, and neither it nor its VM is left after `run --rm`."""
    from tests import poolutil

    if containerd.libvirtd is not None:
        pytest.skip("the warm pool keeps VMs restored from templates, which only direct "
                    "QEMU saves (docs/pool.md)")
    root = containerd.runc_root / "default"
    with poolutil.serving(root, env=containerd.env) as pool:
        result = containerd.ctr("run", *containerd.run_args(), "--rm", IMAGE, "ctr-pool",
                                "sh", "-c", "echo from-the-pool; exit 3")
        assert result.returncode == 3, result.stderr
        assert result.stdout == b"from-the-pool\n"
        assert pool.status()["claimed"] == 1
    # Once the pool has ended the VM it made next: no QEMU, state or cgroup.
    assert containerd.leftovers("ctr-pool") == []
    assert not [p for p in root.iterdir() if p.name.startswith(("paracell-pool-", "~pool"))]
