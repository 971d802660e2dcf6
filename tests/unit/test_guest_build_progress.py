"""The guest build's progress: a real make, printing Kbuild's quiet lines
while it compiles real objects, run through paracell/guest/buildprogress.py
to a terminal (a pty) and to a pipe; and a kernel build that fails keeps its
output and shows the end of it."""

from __future__ import annotations

import json
import os
import re
import shutil
import termios
import threading
from pathlib import Path

import pytest

from paracell.errors import ParacellError
from paracell.guest import artifacts, buildprogress
from paracell.guest.buildprogress import Estimate, ObjectCounts, Progress

OBJECTS = 12
# Kbuild's echo-cmd, as scripts/Makefile.build says `quiet_cmd_cc_o_c`.
MAKEFILE = """\
SRCS := $(wildcard src/*.c)
OBJS := $(SRCS:.c=.o)
all: $(OBJS)
\t@echo 'paracell: linking nothing'
\t@echo '  LD      vmlinux.o'
src/%.o: src/%.c
\t@echo '  CC      $@'
\t@$(CC) -c -o $@ $<
scripts/fixdep:
\t@echo '  HOSTCC  $@'
"""


def _project(root: Path, broken: str | None = None) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "Makefile").write_text(MAKEFILE)
    for i in range(OBJECTS):
        (root / "src" / f"f{i:02d}.c").write_text(f"int f{i}(int x) {{ return x + {i}; }}\n")
    if broken:
        (root / "src" / "f05.c").write_text(broken)
    return root


@pytest.fixture(autouse=True)
def _make_of_its_own(monkeypatch):
    """The tests' make is not a sub-make of whatever make runs pytest (`make
    test` exports MAKEFLAGS and MAKELEVEL, which would add "make[1]:" and
    directory lines to what the tests read)."""
    for name in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS"):
        monkeypatch.delenv(name, raising=False)


def _needs_make() -> None:
    if not (shutil.which("make") and shutil.which("cc")):
        pytest.skip("make and cc are not installed")


def _status_counts(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"paracell: test: (\d+)/~10 objects", text)]


def test_the_lines_that_count_are_kbuilds_objects():
    count = [buildprogress.OBJECT_LINE.match(line) is not None for line in [
        b"  CC      kernel/fork.o", b"  AS      arch/x86/entry/entry_64.o",
        b"  CC [M]  drivers/misc/x.o", b"  HOSTCC  scripts/basic/fixdep",
        b"  CC      arch/x86/kernel/asm-offsets.s", b"  LD      vmlinux.o",
        b"  AR      kernel/built-in.a", b"kernel/fork.c:12: warning: CC x.o"]]
    assert count == [True, True, True, False, False, False, False, False]


def test_to_a_pipe_a_line_now_and_then_and_the_output_in_the_log(tmp_path):
    _needs_make()
    project = _project(tmp_path / "p")
    read_end, write_end = os.pipe()
    log = tmp_path / "build.log"
    with os.fdopen(write_end, "w") as out:
        # Every object due a line: the mode's logic without waiting 30 s.
        progress = Progress("test", out, Estimate(10, "a test"), interval_s=0)
        assert progress.tty is False
        code = buildprogress.run_logged(["make", "-j2"], log, progress, cwd=project)
    with os.fdopen(read_end) as pipe:
        text = pipe.read()
    assert code == 0
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert lines[0] == "paracell: test: about 10 objects to build (an estimate: a test)"
    counts = _status_counts(text)
    # A line for each object (and, as elapsed time goes on, maybe more); past
    # the estimate, the percentage stops at 99 until the build is done.
    assert counts == sorted(counts) and set(counts) == set(range(1, OBJECTS + 1)), text
    assert "12/~10 objects (99%)" in text
    assert "paracell: linking nothing" in lines
    assert re.fullmatch(r"paracell: test: 12 objects built in \d+s", lines[-1]), lines[-1]
    # The build's own output, all of it, is in the log.
    logged = log.read_text().splitlines()
    assert sorted(ln for ln in logged if " CC " in ln) == \
        [f"  CC      src/f{i:02d}.o" for i in range(OBJECTS)]
    assert "  LD      vmlinux.o" in logged
    assert progress.objects == OBJECTS


def test_to_a_pipe_at_the_default_interval_far_fewer_lines_than_objects(tmp_path):
    _needs_make()
    project = _project(tmp_path / "p")
    read_end, write_end = os.pipe()
    with os.fdopen(write_end, "w") as out:
        progress = Progress("test", out, Estimate(10, "a test"))
        assert progress.interval_s == buildprogress.LINE_INTERVAL_S
        buildprogress.run_logged(["make", "-j2"], tmp_path / "log", progress, cwd=project)
    with os.fdopen(read_end) as pipe:
        text = pipe.read()
    counts = _status_counts(text)
    # The first object's line, then one every 30 s: none in a build this short.
    assert counts[0] == 1 and len(counts) < OBJECTS, text
    assert text.splitlines()[-1].startswith("paracell: test: 12 objects built in ")


def _read_all(fd: int, into: list[bytes]) -> None:
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the terminal's other end is closed
            return
        if not chunk:
            return
        into.append(chunk)


def _on_a_terminal(tmp_path, columns: int, make: list[str]) -> tuple[int, str]:
    """A build of the test project with its progress on a pty of that width:
    its exit status, and what the terminal got (the tty's own onlcr undone)."""
    project = _project(tmp_path / "p")
    master, slave = os.openpty()
    termios.tcsetwinsize(slave, (24, columns))
    seen: list[bytes] = []
    reader = threading.Thread(target=_read_all, args=(master, seen))
    reader.start()
    try:
        with os.fdopen(slave, "w") as out:
            progress = Progress("test", out, Estimate(10, "a test"), interval_s=0)
            assert progress.tty is True
            code = buildprogress.run_logged(make, tmp_path / "log", progress, cwd=project)
    finally:
        reader.join(timeout=30)
        os.close(master)
    return code, b"".join(seen).decode().replace("\r\n", "\n")


def test_on_a_terminal_one_line_rewritten_in_place(tmp_path):
    _needs_make()
    code, text = _on_a_terminal(tmp_path, 200, ["make", "-j2"])
    assert code == 0
    # Lines of their own: the estimate, the script's words.
    own = text.split("\n")
    assert own[0] == "paracell: test: about 10 objects to build (an estimate: a test)"
    # The summary takes the progress line's place.
    assert re.search(r"\r\x1b\[Kparacell: test: 12 objects built in \d+s$", own[-2]), own
    assert own[-1] == ""
    # Everything else is the progress line, each state rewritten over the last:
    # carriage return, the line, erase to its end; never a newline between.
    draws = [d for line in own[1:] for d in line.split("\r") if "/~10" in d]
    assert all(d.endswith("\x1b[K") and len(d) < 60 for d in draws), draws
    counts = [int(n) for d in draws for n in re.findall(r"^paracell: test: (\d+)/~10", d)]
    assert len(counts) == len(draws) >= OBJECTS, draws
    assert counts == sorted(counts) and counts[0] == 1 and counts[-1] == OBJECTS, draws
    # The script's own line interrupts it: erased, said, then drawn again.
    said = next(i for i, line in enumerate(own) if "linking nothing" in line)
    assert own[said].endswith("\r\x1b[Kparacell: linking nothing")
    assert own[said + 1].startswith("\rparacell: test: 12/~10 objects")


def test_on_a_narrow_terminal_the_line_is_cut_rather_than_wrapped(tmp_path):
    _needs_make()
    _, text = _on_a_terminal(tmp_path, 30, ["make"])
    draws = [d for line in text.split("\n") for d in line.split("\r")
             if d.startswith("paracell: test: ") and d.endswith("\x1b[K")]
    assert draws and all(len(d.removesuffix("\x1b[K")) == 29 for d in draws), draws


def test_a_failed_build_keeps_its_output_for_the_tail(tmp_path):
    _needs_make()
    project = _project(tmp_path / "p", broken="int f5(int x) { return x + ; }\n")
    read_end, write_end = os.pipe()
    log = tmp_path / "build.log"
    with os.fdopen(write_end, "w") as out:
        progress = Progress("test", out, Estimate(10, "a test"))
        code = buildprogress.run_logged(["make"], log, progress, cwd=project)
    with os.fdopen(read_end) as pipe:
        text = pipe.read()
    assert code != 0
    assert "objects built" not in text
    # The count it got to is the last line.
    assert re.fullmatch(r"paracell: test: \d+/~10 objects \(\d+%\), \d+s",
                        text.splitlines()[-1]), text
    tail = buildprogress.tail(log)
    assert any("f05.c" in ln and "error" in ln for ln in tail), tail
    assert tail[-1].startswith("make: ***"), tail


def test_a_kernel_build_that_fails_shows_its_output_and_keeps_the_log(
        tmp_path, monkeypatch, capsys):
    """The real build script, on a tarball that is no tarball."""
    monkeypatch.setenv("PARACELL_CACHE", str(tmp_path / "cache"))
    tarball = tmp_path / "linux-source-6.1.tar.xz"
    tarball.write_bytes(b"not a tarball\n" * 100)
    with pytest.raises(ParacellError) as failed:
        artifacts.build_kernel("k1", tarball)
    log = tmp_path / "cache" / "kernel" / "k1.log"
    assert str(failed.value).endswith(f"its output is in {log}")
    logged = log.read_text()
    assert "paracell: unpacking" in logged and "tar" in logged
    shown = capsys.readouterr().err
    assert "paracell: unpacking" in shown  # the script's own words, as it said them
    assert logged.splitlines()[-1] in shown  # and the end of its output
    assert not (tmp_path / "cache" / "kernel" / "k1").exists()


def test_the_estimate_is_the_last_build_of_the_same_configuration(tmp_path):
    counts = ObjectCounts(tmp_path / "objects.json")
    assert counts.estimate("a") == Estimate(buildprogress.DEFAULT_OBJECTS,
                                            "a past build of ParaCell's configuration")
    counts.record("a", 1500)
    counts.record("b", 1700)
    assert counts.estimate("a") == Estimate(1500, "the last build of this configuration")
    assert counts.estimate("c") == Estimate(1700, "the last build of another configuration")
    counts.record("a", 1510)
    assert json.loads((tmp_path / "objects.json").read_text()) == [["b", 1700], ["a", 1510]]
    for i in range(buildprogress.MAX_RECORDS + 5):
        counts.record(f"k{i}", i + 1)
    assert len(json.loads((tmp_path / "objects.json").read_text())) == \
        buildprogress.MAX_RECORDS


@pytest.mark.parametrize("content", [b"\x00garbage", b"{}", b'[["a", "many"], ["b"]]',
                                     b"[" * 100_000])
def test_a_damaged_record_of_counts_is_no_estimate_and_no_error(tmp_path, content):
    path = tmp_path / "objects.json"
    path.write_bytes(content)
    assert ObjectCounts(path).estimate("a").total == buildprogress.DEFAULT_OBJECTS
    ObjectCounts(path).record("a", 7)
    assert ObjectCounts(path).estimate("a").total == 7
