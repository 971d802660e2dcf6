"""`paracell bench agent`'s search (paracell/bench/agent.py) without VMs: a
baseline that fails on the way is dropped with its reason and the others go
on; ParaCell's own failure ends the run. The methods here only count what
they are asked: the real ones run in tests/integration/test_bench_agent.py."""

from __future__ import annotations

from typing import Any

import pytest

from paracell.bench import agent
from paracell.errors import ParacellError


class Counting(agent.Method):
    def __init__(self, name: str, fail_at: str = "") -> None:
        self.name, self.fail_at, self.saved, self.closed = name, fail_at, [], False

    def start(self) -> None:
        pass

    def run(self, script: str) -> tuple[int, str]:
        return 0, "Ran 108 tests\nOK"

    def checkpoint(self, node: agent.Node) -> dict[str, Any]:
        if node.name == self.fail_at:
            raise ParacellError("runc checkpoint: criu failed")
        self.saved.append(node.name)
        return {}

    def rollback(self, node: agent.Node) -> dict[str, Any]:
        return {}

    def host_bytes(self) -> int:
        return 0

    def saved_bytes(self) -> int:
        return 0

    def close(self) -> None:
        self.closed = True


def test_a_baseline_that_fails_is_dropped_with_its_reason_and_the_rest_go_on():
    ours, criu = Counting("paracell"), Counting("runc+criu", fail_at="n0-1")
    tallies, failed = agent.search([ours, criu], agent.tree(2, 2))
    assert failed == {"runc+criu": "runc checkpoint: criu failed"}
    assert list(tallies) == ["paracell"] and len(tallies["paracell"].node_ms) == 6
    assert ours.saved == ["root", "n0", "n0-0", "n0-1", "n1", "n1-0", "n1-1"]
    assert criu.saved == ["root", "n0", "n0-0"]


def test_paracells_own_failure_ends_the_run():
    with pytest.raises(ParacellError, match="criu failed"):
        agent.search([Counting("paracell", fail_at="n1"), Counting("whole-vm")],
                     agent.tree(2, 1))
