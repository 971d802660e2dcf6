"""What SANDBOX attaches after READY, seen from inside a real VM: the
guest's wall clock is set from the host's, not left as the boot read it."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.integration


def test_the_guest_clock_is_the_hosts(runtime, make_bundle):
    before = time.time()
    ran = runtime("run", "--bundle", str(make_bundle(["date", "+%s"])), "clock")
    after = time.time()
    assert ran.returncode == 0, ran.stderr
    assert before - 1 <= int(ran.stdout) <= after + 1, (before, ran.stdout, after)
