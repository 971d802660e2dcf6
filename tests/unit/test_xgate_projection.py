"""`paracell bench xgate`'s PVM projection: labelled, sourced, validated."""

from __future__ import annotations

import math
import subprocess

import pytest

from paracell.bench.xgate import PUBLISHED_PVM, PvmCost, pvm_projection
from paracell.errors import ParacellError
from tests.conftest import PARACELL

PROGRAMS = {"python3": {"gate_calls_per_run": 6420}, "xgate-bench idloop (C)":
            {"gate_calls_per_run": 35002}}


def test_the_default_cost_is_the_pvm_papers_nested_syscall_with_its_citation():
    """Table 2 of the SOSP 2023 paper: get_pid under pvm (NST), direct switch."""
    assert PUBLISHED_PVM.switch_ns == 300.0
    for part in ("SOSP 2023", "doi:10.1145/3600006.3613158", "Table 2", "pvm (NST)",
                 "72e364ae1f0f52e4e3297903603e78e61f9f76cf"):
        assert part in PUBLISHED_PVM.source
    got = pvm_projection(PROGRAMS, PUBLISHED_PVM)
    assert got["saved_ms_per_run"]["python3"] == pytest.approx(6420 * 300 / 1e6)


def test_projection_is_labelled_and_carries_its_source():
    got = pvm_projection(PROGRAMS, PvmCost(1000.0, "a paper, table 3"))
    assert got["label"].startswith("PROJECTION, not a measurement")
    assert got["source"] == "a paper, table 3" and got["switch_ns"] == 1000.0
    assert got["saved_ms_per_run"] == {"python3": 6.42, "xgate-bench idloop (C)": 35.002}


@pytest.mark.parametrize("ns", [0.0, -5.0, math.nan, math.inf, 1e12])
def test_a_switch_cost_must_be_a_positive_finite_number(ns):
    with pytest.raises(ParacellError, match="--pvm-switch-ns"):
        PvmCost(ns, "somewhere")


def test_a_switch_cost_needs_a_source():
    with pytest.raises(ParacellError, match="--pvm-source"):
        PvmCost(100.0, "  ")
    res = subprocess.run([PARACELL, "bench", "xgate", "--pvm-switch-ns", "100"],
                         capture_output=True, timeout=60)
    assert res.returncode == 2 and b"go together" in res.stderr, res.stderr
