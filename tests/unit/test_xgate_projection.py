"""`paracell bench xgate`'s PVM projection: labelled, sourced, validated."""

from __future__ import annotations

import math
import subprocess

import pytest

from paracell.bench.xgate import PvmCost, pvm_projection
from paracell.errors import ParacellError
from tests.conftest import PARACELL

PROGRAMS = {"python3": {"gate_calls_per_run": 6420}, "xgate-bench idloop (C)":
            {"gate_calls_per_run": 35002}}


def test_no_cost_no_projection():
    assert pvm_projection(PROGRAMS, None) is None


def test_projection_is_labelled_and_carries_its_source():
    got = pvm_projection(PROGRAMS, PvmCost(1000.0, "a paper, table 3"))
    assert got is not None
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
