"""PNG bar charts of benchmark medians, with min-max whiskers."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_figure(fig: Any, output: Path) -> Path:
    """Every benchmark's PNG: its directory is made first, since a fresh
    checkout has no bench-results/ yet."""
    import matplotlib.pyplot as plt

    output.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(output, dpi=100)
    plt.close(fig)
    return output


def bar_chart(stats: dict[str, dict[str, float]], title: str, unit_scale: float, unit: str,
              output: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(stats)
    medians = [stats[n]["median_s"] * unit_scale for n in names]
    lows = [m - stats[n]["min_s"] * unit_scale for n, m in zip(names, medians, strict=True)]
    highs = [stats[n]["max_s"] * unit_scale - m for n, m in zip(names, medians, strict=True)]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(names, medians, yerr=[lows, highs], capsize=6, color="#4c72b0")
    for i, m in enumerate(medians):
        ax.annotate(f"{m:.1f}", (i, m), ha="center", va="bottom", xytext=(0, 3),
                    textcoords="offset points")
    ax.set_ylabel(unit)
    ax.set_title(title)
    return save_figure(fig, output)
