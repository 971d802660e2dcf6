"""The XGates vet cache: a clean verdict is reused only for the very file it
was given to (device, inode, size, mtime, ctime, scanner), a changed file is
vetted again, and a cache anyone else could have written is never believed."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from paracell.xgate import vet, vetcache
from tests.xgate_elf import PF_R, PF_X, WRPKRU, make_elf

XRSTOR = b"\x0f\xae\x2f"  # information only: a clean file may have findings


def _tree(root: Path) -> Path:
    """A rootfs of two clean ELF files and one that is no ELF file."""
    (root / "bin").mkdir(parents=True)
    for name in ("tool", "other"):
        make_elf(root / "bin" / name, [(PF_R | PF_X, 0x1000, 0x401000, 0x1000)], 0x2000,
                 {0x1100: XRSTOR})
    (root / "etc").mkdir()
    (root / "etc" / "passwd").write_text("root:x:0:0::/:/bin/sh\n")
    return root


class Warnings(list):
    def __call__(self, line: str) -> None:
        assert "\n" not in line
        self.append(line)


def _vet(root: Path, cache_dir: Path, racy_s: float = 0.0) -> tuple[vet.VetReport, Warnings]:
    """One create's vet: open the cache, vet with it, save it."""
    warned = Warnings()
    with vetcache.opened(cache_dir, warned, racy_s) as cache:
        report = vet.vet_rootfs(root, cache)
        assert cache.save() is None
    return report, warned


def _offending_paths(report: vet.VetReport) -> list[str]:
    return sorted({f.inside for f in report.offences})


def _plant_keeping_size_and_mtime(path: Path) -> os.stat_result:
    """Puts a WRPKRU into the clean file's code: same size, mtime put back.
    Only the ctime, which no caller can set, still says the file changed."""
    before = path.stat()
    data = bytearray(path.read_bytes())
    data[0x1200:0x1203] = WRPKRU
    while True:
        path.write_bytes(bytes(data))
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        after = path.stat()
        if after.st_ctime_ns != before.st_ctime_ns:  # else within one clock tick: again
            break
        time.sleep(0.01)
    assert (after.st_dev, after.st_ino, after.st_size, after.st_mtime_ns) == \
        (before.st_dev, before.st_ino, before.st_size, before.st_mtime_ns)
    return after


def test_a_second_vet_scans_nothing_it_knows_clean(tmp_path):
    root, cache_dir = _tree(tmp_path / "rootfs"), tmp_path / "cache"
    first, warned = _vet(root, cache_dir)
    assert (first.elf_files, first.cached, first.offences, warned) == (2, 0, [], [])
    second, warned = _vet(root, cache_dir)
    assert (second.elf_files, second.cached, second.offences, warned) == (2, 2, [], [])
    # Made private: only the caller may write what lets files in unscanned.
    assert cache_dir.stat().st_mode & 0o777 == 0o700
    assert (cache_dir / vetcache.FILE_NAME).stat().st_mode & 0o777 == 0o600


def test_a_planted_wrpkru_after_a_clean_verdict_is_caught(tmp_path):
    root, cache_dir = _tree(tmp_path / "rootfs"), tmp_path / "cache"
    _vet(root, cache_dir)
    tool = root / "bin" / "tool"
    data = bytearray(tool.read_bytes())
    data[0x1200:0x1203] = WRPKRU
    tool.write_bytes(bytes(data))
    report, _ = _vet(root, cache_dir)
    assert _offending_paths(report) == ["/bin/tool"]
    assert report.cached == 1  # the other file is still known clean


def test_content_changed_with_size_and_mtime_kept_is_caught_by_the_ctime(tmp_path):
    root, cache_dir = _tree(tmp_path / "rootfs"), tmp_path / "cache"
    _vet(root, cache_dir)
    _plant_keeping_size_and_mtime(root / "bin" / "tool")
    report, _ = _vet(root, cache_dir)
    assert _offending_paths(report) == ["/bin/tool"]
    # An offence is never remembered: the next create refuses it again.
    again, _ = _vet(root, cache_dir)
    assert _offending_paths(again) == ["/bin/tool"]


def test_a_file_replaced_by_another_inode_is_vetted_again(tmp_path):
    root, cache_dir = _tree(tmp_path / "rootfs"), tmp_path / "cache"
    _vet(root, cache_dir)
    tool = root / "bin" / "tool"
    evil = make_elf(root / "bin" / ".new", [(PF_R | PF_X, 0x1000, 0x401000, 0x1000)], 0x2000,
                    {0x1200: WRPKRU})
    st = tool.stat()
    os.utime(evil, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.rename(evil, tool)
    assert _offending_paths(_vet(root, cache_dir)[0]) == ["/bin/tool"]


def test_a_file_younger_than_the_timestamps_granularity_is_not_remembered(tmp_path):
    """Racily clean, as git says: written in the tick its scan started, it could
    be written again with the same identity."""
    root, cache_dir = _tree(tmp_path / "rootfs"), tmp_path / "cache"
    _vet(root, cache_dir, racy_s=vetcache.RACY_S)
    report, _ = _vet(root, cache_dir, racy_s=vetcache.RACY_S)
    assert report.cached == 0


def _forged_cache(cache_dir: Path, claims: list[Path], scanner: str | None = None) -> Path:
    """A verdict file that says the given files are clean ELF files."""
    cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    data = {"format": vetcache.FORMAT, "scanner": scanner or vetcache.scanner_version(),
            "verdicts": {vetcache.identity(p.stat()): 1 for p in claims}}
    path = cache_dir / vetcache.FILE_NAME
    path.write_text(json.dumps(data))
    path.chmod(0o600)
    return path


def _evil_tree(tmp_path: Path) -> Path:
    root = _tree(tmp_path / "rootfs")
    make_elf(root / "bin" / "evil", [(PF_R | PF_X, 0x1000, 0x401000, 0x1000)], 0x2000,
             {0x1234: WRPKRU})
    return root


def test_a_forged_verdict_is_believed_only_in_the_callers_own_cache(tmp_path):
    """The premise of every refusal below: a cache that is the caller's is
    believed, so a cache another user could write must never be."""
    root = _evil_tree(tmp_path)
    _forged_cache(tmp_path / "cache", [root / "bin" / "evil"])
    report, warned = _vet(root, tmp_path / "cache")
    assert report.offences == [] and report.cached == 1 and warned == []


@pytest.mark.parametrize("make_hostile, says", [
    (lambda d, f: d.chmod(0o770), "writable by others (mode 770)"),
    (lambda d, f: d.chmod(0o707), "writable by others (mode 707)"),
    (lambda d, f: f.chmod(0o620), "writable by others (mode 620)"),
    (lambda d, f: os.chown(f, 65534, 65534), "owned by uid 65534"),
    (lambda d, f: os.chown(d, 65534, 65534), "owned by uid 65534"),
])
def test_a_cache_others_could_write_is_refused_and_left_alone(tmp_path, make_hostile, says):
    if os.geteuid() != 0 and "owned by" in says:
        pytest.skip("chown to another user needs root")
    root = _evil_tree(tmp_path)
    cache_dir = tmp_path / "cache"
    forged = _forged_cache(cache_dir, [root / "bin" / "evil"])
    make_hostile(cache_dir, forged)
    before = forged.read_bytes()
    report, warned = _vet(root, cache_dir)
    assert _offending_paths(report) == ["/bin/evil"] and report.cached == 0
    assert len(warned) == 1 and says in warned[0] and "refused" in warned[0], warned
    assert forged.read_bytes() == before  # never written either
    assert sorted(os.listdir(cache_dir)) == [vetcache.FILE_NAME]


def test_a_symlinked_cache_file_is_refused(tmp_path):
    root = _evil_tree(tmp_path)
    forged = _forged_cache(tmp_path / "elsewhere", [root / "bin" / "evil"])
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir(mode=0o700)
    (cache_dir / vetcache.FILE_NAME).symlink_to(forged)
    report, warned = _vet(root, cache_dir)
    assert _offending_paths(report) == ["/bin/evil"] and report.cached == 0
    assert len(warned) == 1 and "symlink" in warned[0], warned
    assert (cache_dir / vetcache.FILE_NAME).is_symlink()  # not replaced through


def test_a_symlinked_cache_directory_is_refused(tmp_path):
    root = _evil_tree(tmp_path)
    forged_dir = tmp_path / "elsewhere"
    _forged_cache(forged_dir, [root / "bin" / "evil"])
    (tmp_path / "cache").symlink_to(forged_dir)
    report, warned = _vet(root, tmp_path / "cache")
    assert _offending_paths(report) == ["/bin/evil"] and report.cached == 0
    assert len(warned) == 1 and "symlink is never followed" in warned[0], warned


def test_a_verdict_of_another_scanner_is_not_believed(tmp_path):
    """A change to the rule or the scan (their sources, pyelftools) re-vets everything."""
    root = _evil_tree(tmp_path)
    _forged_cache(tmp_path / "cache", [root / "bin" / "evil"], scanner="0" * 32)
    report, warned = _vet(root, tmp_path / "cache")
    assert _offending_paths(report) == ["/bin/evil"] and report.cached == 0 and warned == []
    saved = json.loads((tmp_path / "cache" / vetcache.FILE_NAME).read_text())
    assert saved["scanner"] == vetcache.scanner_version()


def _damage_garbage(path: Path) -> None:
    path.write_bytes(os.urandom(4096))


def _damage_huge(path: Path) -> None:
    with path.open("wb") as f:
        f.truncate(vetcache.MAX_BYTES + 1)  # sparse: nothing is written


def _damage_shape(path: Path) -> None:
    data = json.loads(path.read_text())
    data["verdicts"] = {k: "clean" for k in data["verdicts"]}
    path.write_text(json.dumps(data))


def _damage_nesting(path: Path) -> None:
    path.write_text("[" * 100_000 + "]" * 100_000)


@pytest.mark.parametrize("damage, says", [
    (_damage_garbage, "not JSON"),
    (_damage_huge, "larger than"),
    (_damage_shape, "wrong shape"),
    (_damage_nesting, "not JSON"),
])
def test_a_damaged_cache_file_is_ignored_then_replaced(tmp_path, damage, says):
    root, cache_dir = _tree(tmp_path / "rootfs"), tmp_path / "cache"
    _vet(root, cache_dir)
    damage(cache_dir / vetcache.FILE_NAME)
    report, warned = _vet(root, cache_dir)
    assert report.cached == 0 and report.elf_files == 2
    assert len(warned) == 1 and says in warned[0] and "ignored" in warned[0], warned
    healed, warned = _vet(root, cache_dir)
    assert healed.cached == 2 and warned == []


def test_too_many_verdicts_in_the_file_is_damage(tmp_path, monkeypatch):
    root, cache_dir = _tree(tmp_path / "rootfs"), tmp_path / "cache"
    _vet(root, cache_dir)
    monkeypatch.setattr(vetcache, "MAX_ENTRIES", 1)
    _, warned = _vet(root, cache_dir)
    assert len(warned) == 1 and "more than 1 verdicts" in warned[0]


def test_the_cache_keeps_the_verdicts_used_last_within_its_bounds(tmp_path, monkeypatch):
    old, new = _tree(tmp_path / "old"), _tree(tmp_path / "new")
    cache_dir = tmp_path / "cache"
    _vet(old, cache_dir)
    monkeypatch.setattr(vetcache, "MAX_ENTRIES", 3)
    _vet(new, cache_dir)
    saved = json.loads((cache_dir / vetcache.FILE_NAME).read_text())["verdicts"]
    assert len(saved) == 3
    assert (_vet(new, cache_dir)[0].cached, _vet(old, cache_dir)[0].cached) == (2, 0)
    # And in bytes: a file that would pass the bound keeps only what fits.
    monkeypatch.setattr(vetcache, "MAX_ENTRIES", 1000)
    monkeypatch.setattr(vetcache, "MAX_BYTES", 512)
    _vet(old, cache_dir)
    assert (cache_dir / vetcache.FILE_NAME).stat().st_size <= 512


def _save_repeatedly(root: str, cache_dir: str, rounds: int) -> None:
    """One create after another, each learning its rootfs's verdicts afresh."""
    for _ in range(rounds):
        with vetcache.opened(Path(cache_dir), lambda line: None, 0.0) as cache:
            cache.entries.clear()  # forget, so that every round saves
            vet.vet_rootfs(Path(root), cache)
            assert cache.save() is None


def test_concurrent_saves_never_leave_a_damaged_file(tmp_path):
    cache_dir = tmp_path / "cache"
    roots = [_tree(tmp_path / f"rootfs{i}") for i in range(3)]
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_save_repeatedly, args=(str(r), str(cache_dir), 150))
               for r in roots]
    for writer in writers:
        writer.start()
    reads = 0
    while any(w.is_alive() for w in writers) or reads == 0:
        warned = Warnings()
        with vetcache.opened(cache_dir, warned, 0.0):
            pass
        assert warned == []
        reads += 1
    for writer in writers:
        writer.join()
        assert writer.exitcode == 0
    assert [n for n in os.listdir(cache_dir) if n != vetcache.FILE_NAME] == []
