"""Benchmarks write into bench-results/, which a fresh checkout lacks."""

from __future__ import annotations

from pathlib import Path

from paracell.bench import plot

BENCH = Path(plot.__file__).parent


def test_a_chart_makes_its_directory(tmp_path):
    out = tmp_path / "bench-results" / "nested" / "start.png"
    stats = {"a": {"median_s": 1.0, "min_s": 0.5, "max_s": 2.0}}
    assert plot.bar_chart(stats, "t", 1.0, "s", out) == out
    assert out.read_bytes().startswith(b"\x89PNG")


def test_every_benchmark_saves_its_figures_through_save_figure():
    """The mkdir lives in one place; a module that calls savefig itself
    would fail again on a fresh checkout."""
    callers = sorted(p.name for p in BENCH.rglob("*.py") if "savefig(" in p.read_text())
    assert callers == ["plot.py"], callers
