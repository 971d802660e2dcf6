"""Process identity from /proc: a pid plus its start time names one process,
even after the pid has been reused. Light on imports: `state` and `kill` use it."""

from __future__ import annotations

import os


def _stat_fields(pid: int) -> list[bytes] | None:
    """/proc/PID/stat from the state field on (field 3 is index 0)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses; fields resume after the last ')'.
    return stat[stat.rindex(b")") + 2 :].split()


def process_start_time(pid: int) -> int | None:
    """The start time (clock ticks since boot) of a live, non-zombie process."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] == b"Z":
        return None
    return int(fields[19])


def page_faults(pid: int) -> int | None:
    """Minor plus major page faults the process has taken so far."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[7]) + int(fields[9])


def cpu_ticks(pid: int) -> int | None:
    """User plus system time the process has used so far, in clock ticks
    (SC_CLK_TCK), all its threads together."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[11]) + int(fields[12])


def cpu_ns(pid: int) -> int | None:
    """CPU time the process's live threads have run so far, in ns (schedstat):
    fine enough to time a fraction of a second, where cpu_ticks is not."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    total = 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that ended meanwhile
    return total


def same_process(pid: int, start_time: int) -> bool:
    return pid > 0 and process_start_time(pid) == start_time


def kill_same(pid: int, start_time: int, sig: int) -> None:
    """Signals pid only if it is still the process recorded with that start time."""
    if same_process(pid, start_time):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def wait_gone(pid: int, start_time: int, timeout_s: float) -> bool:
    """Waits up to timeout_s for the process recorded with that start time to
    exit (a zombie counts as gone); True once it has. A pidfd wakes at the
    exit itself, where polling /proc sleeps past it: `delete` waits for each
    shim it kills, two for a container in a pooled VM."""
    import select
    import time

    if not same_process(pid, start_time):
        return True
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except OSError:  # a kernel without pidfds: poll /proc instead
        deadline = time.monotonic() + timeout_s
        while same_process(pid, start_time) and time.monotonic() < deadline:
            time.sleep(0.01)
        return not same_process(pid, start_time)
    try:
        # The pid may have been reused between the check and the open.
        if same_process(pid, start_time):
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            poller.poll(max(0, int(timeout_s * 1000)))
        return not same_process(pid, start_time)
    finally:
        os.close(fd)
