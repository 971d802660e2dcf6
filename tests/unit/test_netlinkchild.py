"""netlinkchild: work in a forked child, its result and fds handed back."""

from __future__ import annotations

import os

import pytest

from paracell.errors import ParacellError
from paracell.net import netlinkchild


def test_the_result_and_the_fds_come_back_and_outlive_the_child():
    def work() -> tuple[dict[str, int], list[int]]:
        r, w = os.pipe()
        os.write(w, b"from the child")
        return {"pid": os.getpid()}, [r, w]

    result, (r, w) = netlinkchild.run(work)
    assert result["pid"] != os.getpid()
    assert os.read(r, 100) == b"from the child"
    os.write(w, b"ours now")
    assert os.read(r, 100) == b"ours now"
    os.close(r)
    os.close(w)


def test_its_paracell_error_is_ours_in_one_line():
    def work() -> tuple[None, list[int]]:
        raise ParacellError("setting up the VM's network: eth0 is gone")

    with pytest.raises(ParacellError, match="^setting up the VM's network: eth0 is gone$"):
        netlinkchild.run(work)


def test_any_other_failure_is_one_line_too():
    def work() -> tuple[None, list[int]]:
        raise KeyError("spare")

    with pytest.raises(ParacellError, match="^KeyError: 'spare'$"):
        netlinkchild.run(work)


def test_a_child_that_dies_says_so():
    def work() -> tuple[None, list[int]]:
        os._exit(3)

    with pytest.raises(ParacellError, match="its helper process died"):
        netlinkchild.run(work)


def test_a_child_that_hangs_is_killed(monkeypatch):
    import time

    monkeypatch.setattr(netlinkchild, "TIMEOUT_S", 0.5)

    def work() -> tuple[None, list[int]]:
        time.sleep(60)
        return None, []

    began = time.monotonic()
    with pytest.raises(ParacellError, match="did not answer in 0.5 s"):
        netlinkchild.run(work)
    assert time.monotonic() - began < 10
