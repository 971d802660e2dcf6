"""Runs a long build with its output in a log file and its progress on stderr.

Kbuild, without `make -s`, prints one line per command it runs; the lines
`  CC      kernel/fork.o` and `  AS      arch/x86/entry/entry_64.o` each mean
one object built. The progress counts them against an estimate of the total
(`ObjectCounts`: what the last build of the same configuration built), and
says once that the total is an estimate and where it comes from.

On a terminal it is one line, rewritten in place (`\\r`) at most every
TTY_INTERVAL_S: objects built, the estimated total, the percentage and the
time so far. Anywhere else (a CI log, a pipe) that line is printed now and
then, every LINE_INTERVAL_S. Lines the build script says itself
(`paracell: ...`) pass through in both modes. All of the output, those lines
included, goes to the log file, whose last lines the caller shows when the
build fails.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

OBJECT_LINE = re.compile(rb"^\s+(?:CC|AS)\s+(?:\[M\]\s+)?\S+\.o$")
OWN_LINE = b"paracell: "  # what the build script says to the user
TTY_INTERVAL_S = 0.25
LINE_INTERVAL_S = 30.0
TAIL_BYTES = 65536  # of the log, for the lines a failed build shows
MAX_COUNTS_BYTES = 65536  # of the object counts' file: far more than MAX_RECORDS take
MAX_LINE = 65536  # bytes of a build's output line held until its newline
MAX_RECORDS = 32  # configurations whose object counts are remembered
# The estimate before any build on this machine: the objects (CC and AS .o
# lines) of the guest kernel as built here on 2026-12-02, kernel key
# 8ce01f633f13. A guess for any other configuration, which the output says.
DEFAULT_OBJECTS = 1417


@dataclass(frozen=True)
class Estimate:
    total: int
    source: str  # where the total comes from, for the one line that says so


class ObjectCounts:
    """Objects each recent configuration built, in a JSON file of the cache:
    [[config key, objects], ...], the most recent last."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _records(self) -> list[tuple[str, int]]:
        try:
            with self.path.open("rb") as f:
                raw = json.loads(f.read(MAX_COUNTS_BYTES))
        except (OSError, ValueError, RecursionError):
            return []
        if not isinstance(raw, list):
            return []
        return [(r[0], r[1]) for r in raw if isinstance(r, list) and len(r) == 2
                and isinstance(r[0], str) and type(r[1]) is int and r[1] > 0]

    def estimate(self, config: str) -> Estimate:
        records = self._records()
        same = [n for key, n in records if key == config]
        if same:
            return Estimate(same[-1], "the last build of this configuration")
        if records:
            return Estimate(records[-1][1], "the last build of another configuration")
        return Estimate(DEFAULT_OBJECTS, "a past build of ParaCell's configuration")

    def record(self, config: str, objects: int) -> None:
        records = [r for r in self._records() if r[0] != config] + [(config, objects)]
        data = json.dumps([list(r) for r in records[-MAX_RECORDS:]]).encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        temp.write_bytes(data)
        os.replace(temp, self.path)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class Progress:
    """Counts objects in a build's lines and tells `out` how far it is."""

    def __init__(self, what: str, out: TextIO, estimate: Estimate, tty: bool | None = None,
                 interval_s: float | None = None) -> None:
        self.what = what
        self.out = out
        self.estimate = estimate
        self.tty = out.isatty() if tty is None else tty
        self.interval_s = (TTY_INTERVAL_S if self.tty else LINE_INTERVAL_S) \
            if interval_s is None else interval_s
        self.started = time.monotonic()
        self.objects = 0
        self.shown_at: float | None = None  # when the progress line was last written
        self.drawn = False  # a tty line is on screen, with the cursor after it

    def status(self) -> str:
        elapsed = _duration(time.monotonic() - self.started)
        total = self.estimate.total
        percent = min(99, self.objects * 100 // max(1, total))
        return f"paracell: {self.what}: {self.objects}/~{total} objects ({percent}%), {elapsed}"

    def line(self, raw: bytes) -> None:
        """One line of the build's output, without its newline."""
        if OBJECT_LINE.match(raw):
            if self.objects == 0:
                self._say(f"paracell: {self.what}: about {self.estimate.total} objects to build "
                          f"(an estimate: {self.estimate.source})")
            self.objects += 1
            self.tick()
        elif raw.startswith(OWN_LINE):
            self._say(raw.decode(errors="replace"))

    def tick(self) -> None:
        """Shows the progress if it is due; called on every line and while the
        build is silent (a link step can take a minute)."""
        now = time.monotonic()
        if self.objects and (self.shown_at is None or now - self.shown_at >= self.interval_s):
            self._show(now)

    def finish(self, ok: bool) -> None:
        """The summary of a build that worked; where one failed, its last count."""
        if self.drawn:
            self._write("\r\x1b[K")
            self.drawn = False
        if not self.objects:
            return
        if ok:
            self._write(f"paracell: {self.what}: {self.objects} objects built in "
                        f"{_duration(time.monotonic() - self.started)}\n")
        else:
            self._write(self.status() + "\n")

    def _show(self, now: float) -> None:
        self.shown_at = now
        text = self.status()
        if self.tty:
            # A line wider than the terminal wraps, and \r then rewrites
            # only its last row.
            width = _terminal_width(self.out)
            self._write("\r" + (text[:width - 1] if width else text) + "\x1b[K")
            self.drawn = True
        else:
            self._write(text + "\n")

    def _say(self, text: str) -> None:
        """A line of its own, above the progress line on a terminal."""
        if self.drawn:
            self._write("\r\x1b[K")
        self._write(text + "\n")
        if self.drawn:
            self._show(time.monotonic())

    def _write(self, text: str) -> None:
        try:
            self.out.write(text)
            self.out.flush()
        except (OSError, ValueError):
            pass  # a closed terminal must not fail the build


def _terminal_width(out: TextIO) -> int:
    """Columns, or 0 where the terminal does not say."""
    try:
        return os.get_terminal_size(out.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return 0


def run_logged(cmd: Sequence[str], log_path: Path, progress: Progress,
               cwd: Path | None = None) -> int:
    """Runs cmd with stdout and stderr into log_path and through `progress`;
    returns its exit status. The build gets a session of its own, so that
    an interrupted caller can stop all of it (make and its compilers)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(list(cmd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True)
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        ok = False
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(fd, selectors.EVENT_READ)
                pending = b""
                while True:
                    if selector.select(timeout=max(TTY_INTERVAL_S, min(1.0, progress.interval_s))):
                        chunk = os.read(fd, 65536)
                        if not chunk:
                            break
                        log.write(chunk)
                        *lines, pending = (pending + chunk).split(b"\n")
                        if len(pending) > MAX_LINE:  # no line is that long: cut it
                            lines.append(pending)
                            pending = b""
                        for raw in lines:
                            progress.line(raw)
                    progress.tick()
            if pending:
                progress.line(pending)
            ok = proc.wait() == 0
        finally:
            if proc.poll() is None:  # interrupted: the build must not run on unowned
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait()
            proc.stdout.close()
            progress.finish(ok)
    return proc.returncode


def tail(log_path: Path, lines: int = 20) -> list[str]:
    """The last lines of a log, for the message of a failed build."""
    try:
        with log_path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - TAIL_BYTES))
            data = f.read()
    except OSError:
        return []
    return data.decode(errors="replace").splitlines()[-lines:]
