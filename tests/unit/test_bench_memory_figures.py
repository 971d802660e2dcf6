"""bench memory's reading of a trace run: reclaim, split into the guest's own
free and how far the host lagged behind it."""

from paracell.bench.memory import MIB, Event, Run, trace_figures


def _run(free_s: float, reclaimed_after_s: float | None) -> Run:
    run = Run("pager")
    kib_free = 400 * 1024
    run.events = [Event(0.5, ["allocated", "256", "1.0", str(kib_free - 256 * 1024)]),
                  Event(1.0, ["freeing", "256"]),
                  Event(1.0 + free_s, ["freed", "256", str(kib_free)])]
    held = 300 * MIB
    run.samples = [(0.9, held), (1.0 + free_s / 2, held - 100 * MIB)]
    if reclaimed_after_s is not None:
        run.samples.append((1.0 + free_s + reclaimed_after_s, held - 250 * MIB))
    run.samples.append((5.0, held - 250 * MIB if reclaimed_after_s is not None else held))
    return run


def test_reclaim_is_split_into_the_guests_free_and_the_hosts_lag():
    got = trace_figures(_run(0.080, 0.012))
    assert round(got["reclaim_ms"]) == 92
    assert round(got["guest_free_ms"]) == 80
    assert round(got["reclaim_after_free_ms"]) == 12


def test_a_reclaim_that_never_happens_has_no_lag_figure():
    got = trace_figures(_run(0.080, None))
    assert got["reclaim_ms"] is None
    assert round(got["guest_free_ms"]) == 80
    assert got["reclaim_after_free_ms"] is None
