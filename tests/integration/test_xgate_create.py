"""`create` with XGates on: the rootfs is vetted on the host before anything
exists, a refusal is one line that leaves nothing behind, and warn mode boots."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from tests.xgate_elf import PF_R, PF_X, WRPKRU, make_elf

pytestmark = pytest.mark.integration

XGATES_ON = {"io.paracell.xgates": "on"}


def _evil_rootfs(rootfs: Path) -> Path:
    """The busybox rootfs with /bin/evil: an ELF with WRPKRU at offset 0x1234."""
    make_elf(rootfs / "bin" / "evil", [(PF_R | PF_X, 0x1000, 0x401000, 0x1000)], 0x2000,
             {0x1234: WRPKRU})
    os.chmod(rootfs / "bin" / "evil", 0o755)
    shutil.rmtree(rootfs / "tmp")  # a mount point create would make: it must not
    return rootfs


def _annotate(annotations: dict[str, str]):
    def mutate(config):
        config["annotations"] = annotations
    return mutate


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_create_refuses_an_offending_rootfs_in_one_line_leaving_nothing(
        runtime, make_bundle, writable_rootfs):
    rootfs = _evil_rootfs(writable_rootfs)
    before = _tree(rootfs)
    bundle = make_bundle(["true"], rootfs=rootfs, mutate=_annotate(XGATES_ON))
    result = runtime("create", "--bundle", str(bundle), "xg-refused")
    assert result.returncode != 0
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert "/bin/evil" in lines[0] and "0x1234" in lines[0] and "wrpkru" in lines[0]
    assert _tree(rootfs) == before  # not even a mount point was made
    runtime.assert_no_leaks()


def test_the_config_file_turns_vetting_on_and_the_annotation_off(
        runtime, make_bundle, writable_rootfs, tmp_path):
    rootfs = _evil_rootfs(writable_rootfs)
    config = tmp_path / "paracell-config.json"
    config.write_text(json.dumps({"xgates": True}))
    runtime.env["PARACELL_CONFIG"] = str(config)
    bundle = make_bundle(["true"], rootfs=rootfs)
    refused = runtime("create", "--bundle", str(bundle), "xg-config")
    assert refused.returncode != 0 and b"/bin/evil" in refused.stderr
    runtime.assert_no_leaks()
    # XGates off: no vetting, and the guest boots as it always did.
    bundle = make_bundle(["echo", "booted"], rootfs=rootfs,
                         mutate=_annotate({"io.paracell.xgates": "off"}))
    ran = runtime("run", "--bundle", str(bundle), "xg-off")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == b"booted\n"
    runtime.assert_no_leaks()


def test_a_bad_annotation_is_refused_in_one_line(runtime, make_bundle):
    bundle = make_bundle(["true"], mutate=_annotate({"io.paracell.xgates": "maybe"}))
    result = runtime("create", "--bundle", str(bundle), "xg-bad")
    assert result.returncode != 0
    assert result.stderr.decode().count("\n") == 1 and b"io.paracell.xgates" in result.stderr
    runtime.assert_no_leaks()


def test_warn_mode_logs_the_offence_and_boots(runtime, make_bundle, writable_rootfs, tmp_path):
    rootfs = _evil_rootfs(writable_rootfs)
    log = tmp_path / "runtime.log"
    bundle = make_bundle(["sh", "-c", "echo booted; /bin/evil; echo evil=$?"], rootfs=rootfs,
                         mutate=_annotate({**XGATES_ON, "io.paracell.xgates.vet": "warn"}))
    result = runtime("--log", str(log), "run", "--bundle", str(bundle), "xg-warn")
    assert result.returncode == 0, result.stderr
    out = result.stdout.decode().splitlines()
    assert out[0] == "booted"
    # The guest kernel refuses to map the offending binary: execve fails (126), never runs.
    assert out[-1] == "evil=126", out
    warned = [ln for ln in log.read_text().splitlines() if "xgates vet (warn)" in ln]
    assert len(warned) == 1 and "/bin/evil" in warned[0] and "0x1234" in warned[0]
    runtime.assert_no_leaks()


def _vet_lines(log: Path) -> list[str]:
    return [ln for ln in log.read_text().splitlines() if "xgates vet of" in ln]


def test_a_rootfs_vetted_once_is_not_scanned_again_but_a_changed_binary_is(
        runtime, make_bundle, writable_rootfs, tmp_path):
    """The vet cache (paracell/xgate/vetcache.py) across real creates: the
    second create takes both ELF files' verdicts from the cache, and a binary
    changed after it, size and mtime kept, is refused at the next."""
    from paracell.xgate import vetcache

    tool = make_elf(writable_rootfs / "bin" / "tool", [(PF_R | PF_X, 0x1000, 0x401000, 0x1000)],
                    0x2000)
    os.chmod(tool, 0o755)
    # Verdicts are kept only for files older than the timestamps' granularity.
    time.sleep(vetcache.RACY_S + 0.5)
    log = tmp_path / "runtime.log"
    bundle = make_bundle(["echo", "booted"], rootfs=writable_rootfs, mutate=_annotate(XGATES_ON))
    for n in (1, 2):
        ran = runtime("--debug", "--log", str(log), "run", "--bundle", str(bundle), f"xg-twice{n}")
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout == b"booted\n"
    first, second = _vet_lines(log)
    assert "2 ELF files (0 known clean from the cache)" in first, first
    assert "2 ELF files (2 known clean from the cache)" in second, second
    runtime.assert_no_leaks()

    st = tool.stat()
    data = bytearray(tool.read_bytes())
    data[0x1234:0x1237] = WRPKRU
    tool.write_bytes(bytes(data))
    os.utime(tool, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (tool.stat().st_size, tool.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    refused = runtime("create", "--bundle", str(bundle), "xg-changed")
    assert refused.returncode != 0
    lines = refused.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "/bin/tool" in lines[0] and "0x1234" in lines[0], lines
    runtime.assert_no_leaks()
