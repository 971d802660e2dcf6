"""`paracell bench snapshot`'s goals: each is judged on the 64 MiB sandbox,
and a run whose --sizes left it out says so instead of "not met"."""

from __future__ import annotations

from paracell.bench import snapshot


def figures(checkpoint_sdk_ms: float) -> dict:
    return {"checkpoint_paused_ms": {"median": 11.0}, "rollback_api_ms": {"median": 12.8},
            "checkpoint_api_ms": {"median": checkpoint_sdk_ms},
            "fork_10_shared_api_ms": {"median": 882.0}, "forks_10_shared_vs_one": 1.66}


def test_each_goal_is_judged_on_the_64_mib_sandbox():
    met = dict(snapshot.goals({16: figures(99.0), 64: figures(16.2)}))
    assert all(met.values()) and len(met) == 6
    missed = dict(snapshot.goals({64: figures(20.5)}))
    assert [name for name, ok in missed.items() if not ok] == [
        "checkpoint <= 20 ms (p50, SDK), 64 MiB touched, 4 MiB changed"]


def test_a_run_without_64_mib_measures_no_goal():
    assert {ok for _, ok in snapshot.goals({16: figures(16.2), 256: figures(16.2)})} == {None}
