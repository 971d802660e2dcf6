"""XGates in real guests (TCG): the kernel domain, the gates, the PKRU policy,
vetting, application domains, and glibc programs, with XGates on and off.

The rootfs (paracell.bench.xgaterootfs) is busybox plus the host's own Debian 12
binaries and libraries copied in unmodified: glibc and its loader, python3,
bash and coreutils, with the programs of guest/xgate/ built against them
(xgate-test is static and runs one named check, printing `ok NAME ...`;
xgate-glibc is dynamic and uses Debian's libc.so.6 with its pkey_set WRPKRU).
The rootfs holds an offending file on purpose (xgate-stray), so containers
here vet in warn mode: the guest kernel is what is under test."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from paracell.bench.xgaterootfs import SOURCES, xgate_rootfs
from paracell.xgate import vet
from tests.conftest import REPO

pytestmark = pytest.mark.integration

ON = {"io.paracell.xgates": "on", "io.paracell.xgates.vet": "warn"}
OFF = {"io.paracell.xgates": "off"}
SIGKILL_STATUS = 137


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = xgate_rootfs(tmp_path_factory.mktemp("xgate") / "rootfs", python=True)
    libc = Path("/lib/x86_64-linux-gnu/libc.so.6").resolve()
    assert (root / "lib/x86_64-linux-gnu/libc.so.6").read_bytes() == libc.read_bytes()
    example = REPO / "oci" / "examples" / "xgate-domain" / "agent-secret.c"
    subprocess.run(["gcc", "-static", "-O2", "-Wall", "-Werror", f"-I{SOURCES}", "-o",
                    str(root / "bin" / "agent-secret"), str(example), str(SOURCES / "libxgate.c")],
                   check=True)
    return root


@pytest.fixture
def xbundle(tmp_path: Path, rootfs: Path):
    """xbundle(args, annotations, env=..., caps=...) -> a bundle on the shared rootfs."""
    counter = iter(range(100))

    def make(args: list[str], annotations: dict[str, str], env: list[str] | None = None,
             caps: list[str] | None = None) -> Path:
        from paracell.runtime.bundle import defaultspec

        bundle = tmp_path / f"b{next(counter)}"
        bundle.mkdir()
        config = defaultspec.default_config(args)
        config["root"] = {"path": str(rootfs), "readonly": True}
        config["annotations"] = annotations
        if env:
            config["process"]["env"] += env
        if caps:
            for kind in ("bounding", "effective", "permitted"):
                config["process"]["capabilities"][kind] += caps
        (bundle / "config.json").write_text(json.dumps(config))
        return bundle

    return make


@pytest.fixture
def guest(runtime, xbundle):
    """guest(args, annotations, ...) -> CompletedProcess of `paracell run`."""
    counter = iter(range(100))

    def run(args: list[str], annotations: dict[str, str], **kw):
        return runtime("run", "--bundle", str(xbundle(args, annotations, **kw)),
                       f"xg{next(counter)}", timeout=300)

    return run


def ok(result, name: str) -> str:
    out = result.stdout.decode()
    assert result.returncode == 0, (result.returncode, out, result.stderr.decode()[-500:])
    assert f"ok {name}" in out and "FAIL" not in out, out
    return out


def test_status_busybox_and_launch_record(guest):
    out = ok(guest(["sh", "-c", "xgate-test status; echo a b c | wc -w; ls /bin | grep -c ."],
                   ON), "status")
    # bit 0: enabled for the task, bit 1: gate pages mapped in this mm
    assert "prctl=3 available=1" in out
    assert "\n3\n" in out


def test_exec_processes_inherit_xgates(runtime, xbundle):
    # Only the init's launch spec says xgates=on; the agent's container slot
    # remembers it for every exec.
    bundle = xbundle(["sleep", "60"], ON)
    assert runtime("create", "--bundle", str(bundle), "xgex").returncode == 0
    runtime("start", "xgex", check=True)
    out = ok(runtime("exec", "xgex", "xgate-test", "status"), "status")
    assert "prctl=3 available=1" in out
    runtime("delete", "--force", "xgex", check=True)


def test_xgates_off_has_no_gate_page(guest):
    out = ok(guest(["xgate-test", "status"], OFF), "status")
    assert "prctl=0 available=0" in out


def test_kernel_domain_data_faults_with_pkuerr(guest):
    out = ok(guest(["xgate-test", "data"], ON), "data")
    assert "si_code=4 (SEGV_PKUERR=4) pkey=15" in out


def test_xgates_work_in_a_vm_restored_from_a_template(runtime, xbundle, tmp_path):
    """The gates are the guest kernel's, set up per process by the agent's
    launch after SANDBOX: a VM restored from a template (saved at READY, before
    any container process) gives them as a cold boot does."""
    bundle = xbundle(["xgate-test", "data"], ON)
    ok(runtime("run", "--bundle", str(bundle), "seed", timeout=300), "data")
    log = tmp_path / "restored.log"
    result = runtime("--debug", "--log", str(log), "run", "--bundle", str(bundle), "warm",
                     timeout=300)
    assert "si_code=4 (SEGV_PKUERR=4) pkey=15" in ok(result, "data")
    assert "restored from template" in log.read_text()


@pytest.mark.parametrize("how", ["past", "onto"])
def test_mid_gate_jump_is_killed(guest, how):
    result = guest(["sh", "-c", f"xgate-test midgate {how}; echo status=$?; "
                                "dmesg | grep 'gate check failed'"], ON)
    out = result.stdout.decode()
    assert f"jumping {how}" in out and "survived" not in out, out
    assert f"status={SIGKILL_STATUS}" in out, out
    assert "xgate: xgate-test[" in out and "gate check failed at [xgate]+0x" in out, out


def test_stray_wrpkru_refused_at_execve_mmap_and_mprotect(guest):
    result = guest(["sh", "-c", "xgate-test exec-stray /bin/xgate-stray; "
                                "xgate-test mem /bin/xgate-stray; dmesg | grep 'refused'"], ON)
    out = ok(result, "exec-stray refused: Operation not permitted")
    assert "ok mem" in out
    assert "stray ran" not in out
    assert "execve refused: WRPKRU in xgate-stray at offset 0x" in out, out
    assert "mmap refused: WRPKRU in xgate-stray" in out, out
    assert "mprotect refused: WRPKRU at 0x" in out, out


def test_wrpkru_across_a_mapping_boundary_is_refused(guest):
    # Two pages, each clean alone, forming 0f 01 | ef where they touch: the second
    # to become executable is refused (mprotect and mmap, both orders); code is
    # never moved or grown by mremap. Without XGates all of it is allowed.
    ok(guest(["xgate-test", "seam"], ON), "seam 4 WRPKRUs across mapping boundaries refused")
    off = guest(["xgate-test", "seam"], OFF)
    assert off.returncode == 1 and off.stdout.decode().count("FAIL seam") == 6, off.stdout


def test_vetted_file_stays_vetted(guest):
    # A file mapped executable by an XGates process cannot be opened for writing
    # for the rest of that process's life; without XGates nothing changes.
    ok(guest(["xgate-test", "denywrite"], ON), "denywrite xgates=1 writes refused (ETXTBSY)")
    ok(guest(["xgate-test", "denywrite"], OFF), "denywrite xgates=0 writes allowed")


def test_stray_binary_as_container_process_is_refused(guest):
    result = guest(["/bin/xgate-stray"], ON)
    assert result.returncode != 0
    assert b"stray ran" not in result.stdout


def test_same_binary_runs_with_xgates_off(guest):
    result = guest(["/bin/xgate-stray"], OFF)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout == b"stray ran\n"


def test_pkru_closed_in_handlers_threads_fork_and_exec(guest):
    out = ok(guest(["xgate-test", "pkru"], ON), "pkru")
    assert "ok pkru-exec" in out


SETID = ["CAP_SETUID", "CAP_SETGID"]


def test_gate_calls_equal_syscalls(guest):
    # Also after setresuid/setresgid in a forked child, hence the capabilities.
    ok(guest(["xgate-test", "gates"], ON, caps=SETID), "gates")


def test_application_domain_data_only_through_its_gate(guest):
    ok(guest(["xgate-test", "domain"], ON), "domain")


def test_application_domain_is_sealed_single_task_and_untraceable(guest):
    # munmap, MAP_FIXED, mremap of/onto, mprotect, pkey_mprotect, shmat: EPERM;
    # brk: the old break stays; madvise/process_madvise/userfaultfd: ENOSYS;
    # no thread, vfork allowed; ptrace, /proc/PID/mem, process_vm_*: refused;
    # the domains survive fork, sealed; gone after exec.
    out = ok(guest(["xgate-test", "seal"], ON), "seal")
    assert "ok seal 16 layout changes refused; pthread_create=" in out, out
    assert "ok domain-gone: a call of domain 0 is killed, the next domain is 0" in out, out


def test_application_domain_needs_a_lone_task(guest):
    ok(guest(["xgate-test", "domain-busy"], ON), "domain-busy with a second thread: "
       "Device or resource busy")


def test_forged_sigreturn_frame_cannot_open_the_key(guest):
    ok(guest(["xgate-test", "sigreturn"], ON), "sigreturn")


def test_xrstor_cannot_load_pkru(guest):
    out = ok(guest(["xgate-test", "xrstor"], ON), "xrstor")
    assert "pkru-offset=" in out


def test_pkey_alloc_never_gives_the_reserved_key(guest):
    ok(guest(["xgate-test", "pkey"], ON), "pkey")


def test_pkru_survives_signal_handlers_without_xgates(guest):
    # PKRU left XCR0 for everyone: a pkey user's rights still come back after a handler.
    ok(guest(["xgate-test", "pkru-preserved"], OFF), "pkru-preserved")


# With the preload, os.getpid() and time.monotonic() come from the gates: the
# kernel's own answers (/proc) must agree.
PY = ("import os, time; pid = int(open('/proc/self/stat').read().split()[0]); "
      "up = float(open('/proc/uptime').read().split()[0]); "
      "print('py', os.getpid() == pid, abs(time.monotonic() - up) < 1, os.getuid(), os.getgid(), "
      "sum(range(10)))")


def test_debian_python3_runs_with_xgates_on(guest):
    result = guest(["sh", "-c", f"python3 -c \"{PY}\" && "
                                f"LD_PRELOAD=/lib/libxgate-preload.so python3 -c \"{PY}\""], ON)
    assert result.returncode == 0, result.stderr.decode()[-500:]
    assert result.stdout.decode().count("py True True 0 0 45") == 2, result.stdout


def test_ld_preload_routes_glibc_calls_through_gates(guest):
    # gettid() is the gate's answer here, getpid() the kernel's: equal only if both are right.
    script = ("LD_PRELOAD=/lib/libxgate-preload.so xgate-bench idloop 1000 && "
              "xgate-test gates")
    out = ok(guest(["sh", "-c", script], ON, caps=SETID), "gates")
    assert "idloop" in out


# --- Debian's glibc, unmodified: its pkey_set WRPKRU is trapped and emulated ----------


def test_stock_libc_pkey_set_site_is_trapped(guest):
    assert "ok site trapped (cc 01 ef 31 c0 c3)" in ok(guest(["xgate-glibc", "site"], ON), "site")
    assert "ok site plain (0f 01 ef 31 c0 c3)" in ok(guest(["xgate-glibc", "site"], OFF), "site")


def test_pkeys_1_to_14_behave_the_same_with_xgates_on_and_off(guest):
    on = ok(guest(["xgate-glibc", "pkeys"], ON), "pkeys")
    off = ok(guest(["xgate-glibc", "pkeys"], OFF), "pkeys")
    assert on == off
    assert "allocated 14 keys: 1 2 3 4 5 6 7 8 9 10 11 12 13 14\n" in on
    # PKEY_DISABLE_WRITE: reads work, writes fault with SEGV_PKUERR (4); 0 opens again.
    assert "key 14: pkey_mprotect=0 | set(2)=0 get=2 read=0 write=4 | set(1)=0 get=1 read=4 " \
           "write=4 | set(3)=0 get=3 read=4 write=4 | set(0)=0 get=0 read=0 write=0\n" in on
    assert "pkey_set(16, 0)=-1 errno=22\npkey_set(1, 4)=-1 errno=22\n" in on


def test_pkey_set_cannot_open_key_15_or_a_domain_key(guest):
    out = ok(guest(["xgate-glibc", "protected"], ON), "protected")
    # pkey_set(15, 0) "succeeds" as glibc returns 0, but key 15 stays AD|WD
    assert "pkey_set(15,0)=0 -> 0x" in out and "read si_code=4" in out


def test_pkey_set_site_with_ecx_set_faults_as_wrpkru_does(guest):
    on = ok(guest(["xgate-glibc", "gp"], ON), "gp")
    assert on == ok(guest(["xgate-glibc", "gp"], OFF), "gp")
    assert "signal 11 si_code 0x80" in on  # SI_KERNEL, the #GP of WRPKRU with ECX != 0


def test_pkey_set_site_mapped_by_hand(guest):
    out = ok(guest(["xgate-glibc", "maps"], ON), "maps xgates=1")
    assert "near miss -1/Operation not permitted" in out
    assert "MREMAP_DONTUNMAP Operation not permitted" in out
    off = ok(guest(["xgate-glibc", "maps"], OFF), "maps xgates=0")
    assert "MREMAP_DONTUNMAP Success" in off  # the refusal is XGates', not the kernel's


BASH = ("for i in 3 1 2; do echo $((i * i)); done | /usr/bin/sort -n | /usr/bin/tr '\\n' ' '; "
        "/usr/bin/seq 1 100 | /usr/bin/wc -l; /usr/bin/ls /usr/bin | /usr/bin/head -1; "
        "/usr/bin/sha256sum /etc/passwd | /usr/bin/wc -c; /usr/bin/cat /etc/group; "
        "/usr/bin/id -u; /usr/bin/stat -c %s /etc/passwd; echo bash=$BASH_VERSION")


def test_split_wrpkru_is_trapped_and_runs_as_written(guest, rootfs):
    # xgate-split carries libnettle's pattern: rol $0xf,%r15d; add %ebp,%edi, whose
    # bytes read 0f 01 ef across the two. The host's vetting calls it a split site.
    findings = vet.vet_paths([str(rootfs / "bin" / "xgate-split")]).findings
    assert [f.instruction for f in findings if f.instruction.startswith("wrpkru")] == \
        ["wrpkru-split"]
    ok(guest(["xgate-split", "bytes"], ON), "bytes trapped (0f cc ef)")
    ok(guest(["xgate-split", "bytes"], OFF), "bytes plain (0f 01 ef)")
    on = ok(guest(["xgate-split", "run"], ON), "run")
    assert on == ok(guest(["xgate-split", "run"], OFF), "run")
    out = ok(guest(["xgate-split", "mprotect"], ON), "mprotect xgates=1")
    assert ("split 0/Success byte 0xcc sum 42, alu form 0/Success byte 0xcc sum 43, "
            "memory form -1/Operation not permitted") in out, out
    ok(guest(["xgate-split", "mprotect"], OFF), "mprotect xgates=0")


def test_jump_into_a_split_wrpkru_never_opens_a_key(guest):
    # Without XGates the jump to the 0f is a WRPKRU with EAX = 0: every key opens.
    # With XGates the bytes there are 0f cc ef (bswap esp; out): killed by SIGSEGV.
    off = ok(guest(["xgate-split", "mid"], OFF), "mid")
    assert "mid: returned, pkru 0\n" in off and "mid: exited 0" in off, off
    on = ok(guest(["xgate-split", "mid"], ON), "mid")
    assert "mid: killed by signal 11" in on and "returned" not in on, on


def test_debian_bash_and_coreutils_run_unmodified_with_xgates_on(guest):
    on = guest(["/bin/bash", "-c", BASH], ON)
    off = guest(["/bin/bash", "-c", BASH], OFF)
    assert on.returncode == 0, on.stdout.decode() + on.stderr.decode()[-500:]
    assert on.stdout == off.stdout
    assert on.stdout.decode().startswith("1 4 9 100\n"), on.stdout
    assert "bash=5." in on.stdout.decode()


def test_ld_preload_in_debian_userland_after_fork_setuid_and_threads(guest):
    out = ok(guest(["sh", "-c", "LD_PRELOAD=/lib/libxgate-preload.so xgate-glibc preload"],
                   ON, caps=SETID), "preload")
    assert "getpid from libxgate-preload.so xgates=1" in out
    out = ok(guest(["xgate-glibc", "preload"], ON, caps=SETID), "preload")
    assert "getpid from libc.so.6 xgates=1" in out


def test_domain_example(guest):
    # oci/examples/xgate-domain: the tool code faults on the key, the agent keeps signing.
    result = guest(["/bin/agent-secret"], ON)
    out = result.stdout.decode()
    assert result.returncode == 0, out + result.stderr.decode()
    lines = out.splitlines()
    assert lines[0].startswith("agent: request 42 signed: ")
    assert lines[1] == "tool: reading the key faulted (si_code 4, SEGV_PKUERR is 4)"
    assert lines[2].split(": ")[-1] == lines[0].split(": ")[-1]


# --- the PKU pitfalls (Connor et al. 2020, Jenny 2022), docs/xgates.md -----------------

# (case, outcome for the kernel key, outcome for a domain key); None: not tried there.
PITFALLS = [
    ("direct-read", None, "SEGV_PKUERR"),
    ("proc-self-mem-read", "EIO", "EIO"),
    ("proc-self-mem-write", "EIO", "EIO"),
    ("proc-pid-mem-read", "EIO", "EACCES"),
    ("proc-pid-mem-write", "EIO", "EACCES"),
    # this guest has no CROSS_MEMORY_ATTACH (tinyconfig): the syscalls do not exist
    ("process_vm_readv", "ENOSYS", "ENOSYS"),
    ("process_vm_writev", "ENOSYS", "ENOSYS"),
    ("ptrace-attach", "ATTACHED", "EPERM"),
    ("ptrace-traceme", "TRACED", "EPERM"),
    ("ptrace-peek", "EIO", None),
    ("ptrace-poke", "EIO", None),
    ("ptrace-setregset-pkru", "EINVAL", None),
    ("ptrace-tracee-after", "closed", None),
    ("write-from", "EFAULT", "EFAULT"),
    ("sendmsg-from", "EFAULT", "EFAULT"),
    ("vmsplice-from", "EFAULT", "EFAULT"),
    ("io_uring", "ENOSYS", "ENOSYS"),
    ("read-into", "EFAULT", "EFAULT"),
    ("sigreturn-sw-reserved", "closed", "closed"),
    ("sigreturn-xsave-area", "killed by 11", "killed by 11"),
    ("signal-in-gate", "closed", "closed"),
    ("munmap", "EPERM", "EPERM"),
    ("mmap-fixed-over", "EPERM", "EPERM"),
    ("mremap-of", "EPERM", "EPERM"),
    ("mremap-onto", "EPERM", "EPERM"),
    ("mprotect", "EPERM", "EPERM"),
    ("pkey_mprotect", "EPERM", "EPERM"),
    ("shmat-remap-over", "EPERM", "EPERM"),
    ("madvise-dontneed", "ENOSYS", "ENOSYS"),
    ("process_madvise", "ENOSYS", "ENOSYS"),
    ("userfaultfd", "ENOSYS", "ENOSYS"),
    ("fork-child", "closed", "closed"),
    ("clone-thread", "closed", "EPERM"),
    ("exec", "closed", "closed"),
]


def test_pku_pitfalls_table(guest):
    out = ok(guest(["xgate-pitfalls"], ON), "pitfalls")
    seen: dict[tuple[str, str], str] = {}
    for line in out.splitlines():
        if line.startswith("pit "):
            head, outcome = line[4:].split(": ", 1)
            case, target = head.rsplit(" ", 1)
            seen[(case, target)] = outcome
    expected = {(case, target): outcome for case, k15, dom in PITFALLS
                for target, outcome in (("k15", k15), ("dom", dom)) if outcome is not None}
    assert seen == expected, out
