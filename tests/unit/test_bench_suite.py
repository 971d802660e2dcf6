"""`paracell bench suite`'s host-side plumbing without a VM: the CLI's
validation, the interleaving, the parsers of the load generators' reports,
the workloads' own files (run for real with the host's sqlite, gcc, make,
git and python3 where those are installed), the memory figures and the report."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from paracell.bench.suite import report, workloads
from paracell.bench.suite.run import Plan, Suite, make_plan
from paracell.cli import main
from paracell.errors import ParacellError
from paracell.images import debian, image_key
from tests.conftest import PARACELL

WRK_OUT = """\
Running 3s test @ http://10.213.0.2/index.html
  1 threads and 4 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     2.10ms    1.20ms  30.00ms   90.00%
    Req/Sec     1.90k   100.00     2.00k    70.00%
  Latency Distribution
     50%  850.00us
     75%    1.20ms
     90%    2.00ms
     99%    1.02s
  5700 requests in 3.00s, 5.00MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
Requests/sec:   1900.12
Transfer/sec:      1.67MB
"""
REDIS_CSV = """\
"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
"SET","4000.00","0.900","0.200","0.800","1.500","2.100","9.000"
"GET","5000.00","0.700","0.150","0.600","1.200","1.900","8.000"
"""


def test_wrk_report_gives_percentiles_in_ms_throughput_and_errors():
    got = workloads.parse_wrk(WRK_OUT)
    assert got["p50_ms"] == pytest.approx(0.85)
    assert got["p99_ms"] == pytest.approx(1020.0)
    assert got["rps"] == pytest.approx(1900.12)
    assert got["requests"] == 5700 and got["errors"] == 3


def test_wrk_report_without_a_latency_distribution_is_refused():
    with pytest.raises(ParacellError):
        workloads.parse_wrk("unable to connect to 10.213.0.2:80 Connection refused\n")


def test_redis_benchmark_csv_gives_set_and_get():
    got = workloads.parse_redis_csv(REDIS_CSV)
    assert got["get"] == {"rps": 5000.0, "p50_ms": 0.6, "p99_ms": 1.9, "avg_ms": 0.7}
    assert got["set"]["rps"] == 4000.0
    with pytest.raises(ParacellError):
        workloads.parse_redis_csv('"test","rps"\n"PING_INLINE","1.0"\n')


def test_sqlite_script_keeps_the_total_and_logs_every_transfer():
    db = sqlite3.connect(":memory:")
    db.executescript(workloads.sqlite_script(120))
    total = db.execute("SELECT sum(bal) FROM acct").fetchone()[0]
    assert total == workloads.ACCOUNTS * workloads.START_BALANCE
    assert db.execute("SELECT count(*) FROM ledger").fetchone()[0] == 120
    parsed = workloads.Sqlite().parse({"total": [str(total)], "ledger": ["120"],
                                       "expect": ["120"]})
    assert parsed == {"transactions": 120}
    with pytest.raises(ParacellError):
        workloads.Sqlite().parse({"total": ["1"], "ledger": ["120"], "expect": ["120"]})


@pytest.mark.skipif(shutil.which("make") is None or shutil.which("gcc") is None,
                    reason="needs make and gcc")
def test_c_project_builds_and_prints_what_the_workload_expects(tmp_path):
    files, expect = workloads.c_project(3)
    workloads.write_files(tmp_path, files)
    subprocess.run(["make", "-s", "-C", str(tmp_path / "cproj")], check=True)
    out = subprocess.run([str(tmp_path / "cproj" / "app")], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == [str(expect)]
    assert workloads.Build().parse({"sum": out, "expect": [str(expect)]}) == {}
    with pytest.raises(ParacellError):
        workloads.Build().parse({"sum": ["1"], "expect": [str(expect)]})


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_swe_project_fails_before_its_patch_and_passes_after(tmp_path):
    workloads.write_files(tmp_path, workloads.swe_project(1))
    proj = tmp_path / "proj"

    def tests_pass() -> bool:
        return subprocess.run([sys.executable, "-B", "-m", "unittest", "-q"], cwd=proj,
                              capture_output=True).returncode == 0

    assert not tests_pass()
    subprocess.run(["git", "init", "-q"], cwd=proj, check=True)
    subprocess.run(["git", "apply", str(tmp_path / "fix.patch")], cwd=proj, check=True)
    assert tests_pass()
    assert workloads.Swe().parse({"before": ["fail"], "after": ["pass"],
                                  "diff": ["1", "1", "calc.py"]}) == {}
    with pytest.raises(ParacellError):
        workloads.Swe().parse({"before": ["pass"], "after": ["pass"], "diff": ["calc.py"]})


def test_plan_refuses_unknown_or_repeated_names_and_bad_rounds():
    plan = make_plan(True, ["pager", "runc"], None, None)
    assert plan.runtimes == ["runc", "pager"] and plan.rounds == 1
    assert plan.workloads == list(workloads.WORKLOADS)
    assert make_plan(False, None, ["swe"], None).rounds == 3
    # The diagnostic runtime runs only when named.
    diagnostic = {"pager_lazy", "pager_no_backoff", "pager_before", "pager_backoff",
                  "pager_small_aged", "pager_whole_binds", "pager_eager_window",
                  "pager_idle"}
    assert not diagnostic & set(make_plan(True, None, None, None).runtimes)
    assert make_plan(True, ["pager_lazy", "pager"], None, None).runtimes == ["pager", "pager_lazy"]
    for bad in (dict(runtimes=["kata"]), dict(runtimes=["pager", "pager"]),
                dict(workloads=["../etc"]), dict(rounds=0), dict(rounds=21)):
        args = {"runtimes": None, "workloads": None, "rounds": None, **bad}
        with pytest.raises(ParacellError):
            make_plan(True, args["runtimes"], args["workloads"], args["rounds"])


@pytest.mark.parametrize("args", [["--runtimes", "pager,kata"], ["--workloads", "http,,redis"],
                                  ["--rounds", "0"], ["--workloads", "x" * 300]])
def test_cli_refuses_bad_choices_before_it_starts_anything(args, tmp_path):
    res = CliRunner().invoke(main, ["bench", "suite", "-o", str(tmp_path / "out"), *args])
    assert res.exit_code != 0
    assert not (tmp_path / "out").exists()


def test_order_runs_every_pair_once_a_round_and_rotates_who_goes_first(tmp_path):
    suite = Suite.__new__(Suite)
    suite.plan = Plan(False, 2, ["runc", "none", "pager"], ["http", "sqlite"])
    order = suite.order(["runc", "none", "pager"])
    assert len(order) == 2 * 2 * 3
    for rnd in range(2):
        pairs = [(w, r) for n, w, r in order if n == rnd]
        assert sorted(pairs) == sorted((w, r) for w in ("http", "sqlite")
                                       for r in ("runc", "none", "pager"))
    firsts = [order[i][2] for i in range(0, len(order), 3)]
    assert len(set(firsts)) > 1


def _sample(runtime: str, host: list[tuple[float, int]], used: list[tuple[float, int]],
            workload: str = "skills", **kw) -> dict:
    base = {"workload": workload, "runtime": runtime, "round": 0, "cold_start_s": 1.0,
            "serving_s": None, "run_s": 4.0, "wall_s": 6.0, "metrics": {}, "host_ram": host,
            "guest_used": used, "window": (1.0, 5.0), "error": None}
    return {**base, **kw}


def test_memory_figures_compare_host_held_with_guest_used_inside_the_window():
    mib = 1 << 20
    used = [(0.5, 100 * mib), (3.0, 200 * mib)]
    host = [(0.0, 999 * mib), (2.0, 110 * mib), (4.0, 200 * mib), (4.5, 190 * mib),
            (9.0, 999 * mib)]
    got = report.memory_figures(_sample("pager", host, used))
    assert got is not None
    assert got["peak_host_mib"] == pytest.approx(200)
    assert got["mean_host_mib"] == pytest.approx((110 + 200 + 190) / 3)
    assert got["mean_used_mib"] == pytest.approx((100 + 200 + 200) / 3)
    # Only the excess counts: 10 MiB over, then none, then 10 MiB under (0).
    assert got["waste_pct"] == pytest.approx(10 / 3 / ((100 + 200 + 200) / 3) * 100)
    assert report.memory_figures(_sample("runc", [], used)) is None


def test_report_from_a_saved_result_has_every_table_and_plot(tmp_path):
    mib = 1 << 20
    samples = []
    for r, held in (("pager", 120), ("balloon", 300), ("none", 500), ("runc", 0)):
        host = [(t / 10, held * mib) for t in range(60)] if r != "runc" else []
        used = [(t / 4, 110 * mib) for t in range(24)]
        samples.append(_sample(r, host, used))
        samples.append(_sample(r, [], [], workload="redis", run_s=None, window=None,
                               metrics={"get_plain": {"p50_ms": 1.0 if r == "pager" else 2.0,
                                                      "p99_ms": 3.0, "rps": 100.0}}))
    samples.append(_sample("pager", [], [], workload="redis", error="exited 1: boom"))
    result = {"engine": "tcg", "quick": True, "rounds": 1, "guest_mib": 512,
              "started": "2026-12-01T00:00:00Z", "took_s": 60.0,
              "runtimes": {"runc": "runc", "none": "n", "pager": "p", "balloon": "b",
                           "xgates": "x"},
              "active": ["runc", "none", "pager", "balloon"],
              "skipped": {"xgates": "cannot run dynamically linked programs yet"},
              "workloads": {"redis": "redis", "skills": "skills"}, "samples": samples}
    summary_text = report.write(result, tmp_path)
    text = (tmp_path / "report.md").read_text()
    for heading in ("What the paper claims", "Application latency", "host memory over time",
                    "Start-up", "Failed runs", "Skipped: `xgates`"):
        assert heading in text
    assert "up to 35.6% less" in text and "+60.0% (skills)" in text  # 120 vs 300 MiB
    assert "+50.0% (redis)" in text  # pager's 1 ms p50 against none's 2 ms
    assert "One round: a single sample" in text
    saved = json.loads((tmp_path / "suite.json").read_text())
    assert len(saved["samples"]) == len(samples)
    assert saved["summary"]["redis"]["pager"]["errors"] == ["exited 1: boom"]
    for png in ("latency.png", "coldstart.png", "memory-skills.png"):
        assert (tmp_path / png).read_bytes().startswith(b"\x89PNG")
    assert "skipped xgates" in summary_text
    # redis: the Pager's p50 is half none's, its p99 the same: the server goal is met.
    assert saved["goals"] == [{"goal": "redis: the Pager's p50 within 5% and p99 within 10% "
                                       "of none's", "p50_ratio": 0.5, "p99_ratio": 1.0,
                               "p50_round_ratio": 0.5, "p99_round_ratio": 1.0,
                               "p50_round_interval": None, "p99_round_interval": None,
                               "met": True}]
    assert "goal redis" in summary_text and "## Goals" in text


@pytest.mark.parametrize("pager,none,met", [
    ((1.05, 1.10), (1.0, 1.0), True),
    ((1.06, 1.0), (1.0, 1.0), False),
    ((1.0, 1.11), (1.0, 1.0), False),
])
def test_server_goal_is_p50_within_5_and_p99_within_10_percent_of_none(pager, none, met):
    summary = {"memcached": {r: {"get.p50_ms": p50, "get.p99_ms": p99}
                             for r, (p50, p99) in (("pager", pager), ("none", none))},
               "sqlite": {"pager": {"run_s": 1.0}, "none": {"run_s": 2.0}}}
    goals = report.server_goals(summary, [])
    assert [g["met"] for g in goals] == [met]
    assert goals[0]["p50_round_ratio"] is None  # no samples: no rounds to pair
    assert report.server_goals({"memcached": {"pager": summary["memcached"]["pager"]}},
                               []) == []


def test_each_round_is_paired_with_its_own_none_beside_the_ratio_of_medians():
    """A machine slow in the second round slows both runtimes there: the
    rounds' own ratios are 1.0 and 1.1, while the medians' ratio is 1.6 /
    1.5."""
    samples = [_sample(r, [], [], workload="memcached", round=i,
                       metrics={"get": {"p50_ms": base * (1.1 if r == "pager" and i else 1.0),
                                        "p99_ms": base}})
               for i, base in enumerate((1.0, 2.0)) for r in ("pager", "none")]
    samples.append(_sample("pager", [], [], workload="memcached", round=2, error="boom"))
    summary = {"memcached": {"pager": {"get.p50_ms": 1.6, "get.p99_ms": 1.5},
                             "none": {"get.p50_ms": 1.5, "get.p99_ms": 1.5}}}
    (goal,) = report.server_goals(summary, samples)
    assert goal["p50_round_ratio"] == pytest.approx(1.05)
    assert goal["p99_round_ratio"] == pytest.approx(1.0)
    assert goal["p50_ratio"] == pytest.approx(1.6 / 1.5) and not goal["met"]
    assert "each round against its own none, median: 1.05x, 1.00x): not met" in \
        report.goal_lines([goal])[0]


def test_the_rounds_median_comes_with_an_interval_that_narrows_with_more_rounds():
    assert report.median_interval([1.0, 1.1]) is None  # too few rounds to say
    few = report.median_interval([0.9, 1.0, 1.2, 1.05, 1.1])
    many = report.median_interval([0.9, 1.0, 1.2, 1.05, 1.1] * 6)
    assert few is not None and many is not None
    assert few[0] <= 1.05 <= few[1] and many[0] <= 1.05 <= many[1]
    assert many[1] - many[0] < few[1] - few[0]
    # The same rounds always give the same interval (a saved run's report).
    assert report.median_interval([0.9, 1.0, 1.2, 1.05, 1.1]) == few
    line = report.goal_lines([{"goal": "redis: g", "p50_ratio": 1.0, "p99_ratio": 1.0,
                               "p50_round_ratio": 1.05, "p99_round_ratio": 1.0,
                               "p50_round_interval": few, "p99_round_interval": None,
                               "met": True}])[0]
    lo, hi = (report._fmt(x) for x in few)
    assert f"median: 1.05x [95 %: {lo}-{hi}], 1.00x): met" in line


def test_a_round_loaded_in_turns_pairs_each_turn_with_the_same_turn_of_none():
    """Turn by turn the Pager is 1.2x, 1.0x and 1.1x; a whole-round ratio
    of the merged figures would hide which turns met the same host."""
    def turns(p50s):
        return [{"get": {"p50_ms": v, "p99_ms": 1.0}} for v in p50s]

    samples = [_sample("pager", [], [], workload="memcached", metrics={},
                       turns=turns([1.2, 3.0, 1.1])),
               _sample("none", [], [], workload="memcached", metrics={},
                       turns=turns([1.0, 3.0, 1.0]))]
    summary = {"memcached": {r: {"get.p50_ms": 1.0, "get.p99_ms": 1.0}
                             for r in ("pager", "none")}}
    (goal,) = report.server_goals(summary, samples)
    assert goal["p50_round_ratio"] == pytest.approx(1.1)
    assert goal["p99_round_ratio"] == pytest.approx(1.0)


def test_a_load_in_turns_keeps_its_size_and_merges_counts_and_medians():
    full = workloads.FULL
    turn = workloads.load_turn(full)
    assert full.turns > 1
    assert (turn.http_s * full.turns, turn.redis_n * full.turns,
            turn.memcached_n * full.turns) == (full.http_s, full.redis_n, full.memcached_n)
    assert turn.sqlite_tx == full.sqlite_tx  # batch work is never cut
    tiny = workloads.load_turn(replace(workloads.QUICK, turns=20))
    assert tiny.http_s >= 1 and tiny.redis_n >= 100 and tiny.memcached_n >= 50
    merged = workloads.merge_turns([
        {"page": {"p50_ms": 1.0, "rps": 10.0, "requests": 5, "errors": 0}},
        {"page": {"p50_ms": 3.0, "rps": 30.0, "requests": 7, "errors": 1}},
        {"page": {"p50_ms": 2.0, "rps": 20.0, "requests": 9, "errors": 0}}])
    assert merged == {"page": {"p50_ms": 2.0, "rps": 20.0, "requests": 21, "errors": 1}}


def test_a_servers_round_runs_its_runtimes_together_and_a_batch_one_by_one():
    suite = Suite.__new__(Suite)
    suite.plan = Plan(False, 2, ["none", "pager"], ["redis", "sqlite"])
    steps = suite.steps(suite.order(["none", "pager"]))
    assert [(n, w, sorted(rts)) for n, w, rts in steps] == [
        (0, "redis", ["none", "pager"]), (0, "sqlite", ["pager"]), (0, "sqlite", ["none"]),
        (1, "redis", ["none", "pager"]), (1, "sqlite", ["none"]), (1, "sqlite", ["pager"])]
    # Who is loaded first still rotates from round to round.
    assert steps[0][2] != steps[3][2]


def _saved_run(path: Path, pager_p50s: list[float], first_round: int = 0) -> Path:
    samples = [_sample(r, [], [], workload="redis", round=first_round + i,
                       metrics={"get_plain": {"p50_ms": v if r == "pager" else 1.0,
                                              "p99_ms": 1.0}})
               for i, v in enumerate(pager_p50s) for r in ("pager", "none")]
    path.write_text(json.dumps({"benchmark": "paracell bench suite", "started": "t",
                                "workloads": {"redis": "redis"}, "samples": samples}))
    return path


def test_suite_pool_pairs_every_round_of_several_runs_with_its_own_none(tmp_path):
    # Round numbers are the file's own: a run's round 1000 is not another's round 0.
    a = _saved_run(tmp_path / "a.json", [1.1, 1.2, 1.0], first_round=1000)
    b = _saved_run(tmp_path / "b.json", [1.1, 1.1, 1.3, 1.1])
    out = tmp_path / "new" / "pool.json"
    res = CliRunner().invoke(main, ["bench", "suite-pool", str(a), str(b), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "2 run(s); rounds: redis 7" in res.output
    (goal,) = json.loads(out.read_text())["goals"]
    assert goal["p50_round_ratio"] == pytest.approx(1.1) and not goal["met"]
    assert goal["p50_round_interval"][0] <= 1.1 <= goal["p50_round_interval"][1]


def test_suite_pool_reads_only_the_figures_it_checked(tmp_path):
    """Memory series and timings are not pooled, so a file whose are junk still pools."""
    path = _saved_run(tmp_path / "a.json", [1.2, 1.2, 1.2])
    saved = json.loads(path.read_text())
    for s in saved["samples"]:
        s.update(host_ram="junk", guest_used=[[1]], window=[1], cold_start_s="x")
        s["metrics"]["get_plain"]["p99_ms"] = "not a number"
    path.write_text(json.dumps(saved))
    out = tmp_path / "pool.json"
    res = CliRunner().invoke(main, ["bench", "suite-pool", str(path), "-o", str(out)])
    assert res.exit_code == 0, res.output
    (goal,) = json.loads(out.read_text())["goals"]
    assert goal["p50_round_ratio"] == pytest.approx(1.2) and goal["p99_round_ratio"] is None
    assert not goal["met"]


@pytest.mark.parametrize("content", [b"not json", b'{"benchmark": "other", "samples": []}',
                                     b'{"benchmark": "paracell bench suite", "samples": [{}]}',
                                     b'{"benchmark": "paracell bench suite", "samples": '
                                     b'[{"workload": "redis", "runtime": "none", "round": "0",'
                                     b' "metrics": {}, "error": null}]}',
                                     b'{"benchmark": "paracell bench suite", "samples": '
                                     b'[{"workload": "redis", "runtime": "none", "round": 0,'
                                     b' "metrics": {}}]}',
                                     b'{"benchmark": "paracell bench suite", "samples": 7}'])
def test_suite_pool_refuses_what_is_not_a_suite_result_in_one_line(tmp_path, content):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    out = tmp_path / "pool.json"
    res = subprocess.run([PARACELL, "bench", "suite-pool", str(bad), "-o", str(out)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0
    assert "not a `paracell bench suite` result" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not out.exists()


def test_suite_pool_says_which_file_is_missing(tmp_path):
    res = subprocess.run([PARACELL, "bench", "suite-pool", str(tmp_path / "none.json"),
                          "-o", str(tmp_path / "pool.json")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "none.json: No such file" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_image_key_follows_the_package_set_and_refuses_bad_names():
    assert image_key(["git", "nginx"]) == image_key(["nginx", "git", "git"])
    assert image_key(["git"]) != image_key(["git", "nginx"])
    for bad in (["nginx; rm -rf /"], ["-o=x"], ["A"], ["../x"]):
        with pytest.raises(ParacellError):
            image_key(bad)


def test_an_image_without_its_marker_or_packages_is_not_valid(tmp_path):
    root = tmp_path / "img"
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text(
        "Package: git\nStatus: install ok installed\n\nPackage: nginx\n"
        "Status: deinstall ok config-files\n")
    assert not debian.is_valid(root, ["git"])  # no marker
    (root / debian.MARKER).write_text(json.dumps({"packages": ["git"]}))
    assert debian.is_valid(root, ["git"])
    assert not debian.is_valid(root, ["git", "nginx"])  # marker differs
    (root / debian.MARKER).write_text(json.dumps({"packages": ["git", "nginx"]}))
    assert not debian.is_valid(root, ["git", "nginx"])  # nginx not installed
    assert debian._missing(Path(tmp_path / "nowhere"), ["git"]) == ["git"]


def test_time_left_uses_the_same_run_earlier_then_the_workload_then_the_mean():
    from paracell.bench.suite.run import GUESS_RUN_S, Progress

    progress = Progress(6)
    assert progress.left_s([("http", "pager")]) == GUESS_RUN_S
    progress.finish("http", "runc", 2.0)
    progress.finish("http", "pager", 10.0)
    progress.finish("swe", "pager", 30.0)
    assert progress.left_s([("http", "pager"), ("http", "balloon"), ("sqlite", "none")]) == (
        pytest.approx(10.0 + 6.0 + 14.0))


def test_a_side_by_side_round_ends_every_run_when_one_end_fails():
    """The teardown of each container runs even when an earlier one's
    raises, and the failure still reaches the suite's cleanup."""
    ended: list[str] = []

    class Round(Suite):
        def _start(self, wl, rt, rnd):
            return SimpleNamespace(rt=rt, sample=SimpleNamespace(error=None))

        def _load(self, wl, runs):
            pass

        def _end(self, run):
            ended.append(run.rt)
            if run.rt == "first":
                raise RuntimeError("delete failed")

    suite = Round.__new__(Round)
    with pytest.raises(RuntimeError, match="delete failed"):
        suite.run_side_by_side(workloads.WORKLOADS["redis"], ["first", "second", "third"], 0)
    assert ended == ["first", "second", "third"]
