"""The suite's workloads: real programs from Debian's packages, in the image
paracell.images builds, each with what it puts in the container's /bench
(read-only), its command, and how its result is read.

Every workload's script prints `ready` first (the container's process runs:
its cold start ends there), servers then serve until they are killed, batch
workloads print `begin` and `end` around their work and `result KEY VALUE...`
lines. The agent workloads also print `mem KB` (the guest's MemFree) four
times a second, for guest-used over time. Host-side clients and parsers are
here too; every client is bounded by a count or a duration and a timeout.
"""

from __future__ import annotations

import csv
import difflib
import io
import re
import socket
import statistics
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from paracell.errors import ParacellError

# What the image holds: every workload's programs.
PACKAGES = ("nginx", "redis-server", "memcached", "sqlite3", "make", "gcc", "libc6-dev",
            "python3", "git")
# The binaries a test checks the image for.
BINARIES = ("usr/sbin/nginx", "usr/bin/redis-server", "usr/bin/memcached", "usr/bin/sqlite3",
            "usr/bin/make", "usr/bin/gcc", "usr/bin/python3", "usr/bin/git")
CLIENT_TIMEOUT_S = 180
READY_TIMEOUT_S = 120
SAMPLER = r"""
sample() {
    while [ ! -e /tmp/.stop ]; do
        while read k v u; do
            if [ "$k" = MemFree: ]; then echo "mem $v"; break; fi
        done < /proc/meminfo
        sleep 0.25
    done
}
"""


@dataclass(frozen=True)
class Size:
    """How much work one run of a workload does (--quick or the full run)."""
    http_s: int
    redis_n: int
    memcached_n: int
    sqlite_tx: int
    build_files: int
    swe_scale: int
    skills_rounds: int
    skills_items: int
    # A server's load under several runtimes is cut into this many turns
    # (paracell/bench/suite/run.py). On this shared host a load's figures
    # move from second to second by more than the Pager's cost, and each
    # turn is close to a fresh draw of that: 16 turns of a second or less
    # made redis's and nginx's rounds about 1.5 times less spread than 4
    # turns of 2 s (docs/benchmarks.md, "Why 16 turns").
    turns: int


QUICK = Size(http_s=4, redis_n=2000, memcached_n=500, sqlite_tx=200, build_files=4,
             swe_scale=1, skills_rounds=3, skills_items=30000, turns=4)
FULL = Size(http_s=16, redis_n=20000, memcached_n=6000, sqlite_tx=1000, build_files=10,
            swe_scale=3, skills_rounds=6, skills_items=60000, turns=16)


def load_turn(size: Size) -> Size:
    """One of `size.turns` turns of a server's load: servers loaded side by
    side take turns (paracell/bench/suite/run.py), so that a host that slows
    for a few seconds slows every runtime's load alike. wrk runs whole
    seconds."""
    turns = size.turns
    return replace(size, http_s=max(1, round(size.http_s / turns)),
                   redis_n=max(100, size.redis_n // turns),
                   memcached_n=max(50, size.memcached_n // turns))


# Client figures that count rather than rate: a load's total is their sum.
COUNTS = frozenset({"requests", "errors"})


def merge_turns(turns: list[dict[str, Any]]) -> dict[str, Any]:
    """One load's metrics from its turns' (the same shape each): counts
    summed, rates and percentiles the median over the turns."""
    out: dict[str, Any] = {}
    for key, first in turns[0].items():
        values = [t[key] for t in turns if key in t]
        if isinstance(first, dict):
            out[key] = merge_turns([v for v in values if isinstance(v, dict)])
        elif key in COUNTS:
            out[key] = sum(values)
        else:
            out[key] = statistics.median(values)
    return out


class Workload(ABC):
    name = ""
    title = ""
    agent = False  # host memory over time is sampled

    def files(self, size: Size) -> dict[str, str | bytes]:
        """Paths under /bench and their contents."""
        return {}

    @abstractmethod
    def args(self, size: Size) -> list[str]:
        """The container's command."""

    def parse(self, results: dict[str, list[str]]) -> dict[str, Any]:
        """Batch: checks the `result` lines (KEY -> words) and returns metrics."""
        return {}


class ServerWorkload(Workload):
    """A server in the container, loaded from the host over the suite's bridge."""

    port = 0

    @abstractmethod
    def client(self, address: str, size: Size) -> dict[str, Any]:
        """The load from the host; returns the metrics."""


def _sh(script: str) -> list[str]:
    return ["/bin/sh", "-c", script]


# --- HTTP: nginx -------------------------------------------------------------

NGINX_CONF = """\
daemon off;
master_process off;
user root root;
worker_processes 1;
pid /tmp/nginx.pid;
error_log stderr warn;
events { worker_connections 256; }
http {
    access_log off;
    sendfile on;
    keepalive_requests 100000;
    client_body_temp_path /tmp/nginx-body;
    proxy_temp_path /tmp/nginx-proxy;
    fastcgi_temp_path /tmp/nginx-fastcgi;
    uwsgi_temp_path /tmp/nginx-uwsgi;
    scgi_temp_path /tmp/nginx-scgi;
    types { text/html html; application/octet-stream bin; }
    server {
        listen 80;
        root /tmp/www;
    }
}
"""
INDEX_HTML = ("<html><body><h1>ParaCell bench suite</h1>" + "<p>static page</p>" * 40
              + "</body></html>\n")
WRK_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)(us|ms|s|m)\s*$")
UNIT_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def _seconds(text: str) -> float:
    m = WRK_DURATION.match(text)
    if not m:
        raise ParacellError(f"wrk: not a duration: {text!r}")
    return float(m.group(1)) * UNIT_S[m.group(2)]


def parse_wrk(out: str) -> dict[str, Any]:
    """wrk --latency's report: p50/p99 in ms, requests/s, errors."""
    pct = dict(re.findall(r"^\s+(50|75|90|99)%\s+(\S+)\s*$", out, re.M))
    rps = re.search(r"^Requests/sec:\s+([\d.]+)", out, re.M)
    done = re.search(r"^\s+(\d+) requests in ", out, re.M)
    if "50" not in pct or "99" not in pct or not rps or not done:
        raise ParacellError(f"wrk: unexpected output {out[-300:]!r}")
    errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    return {"p50_ms": _seconds(pct["50"]) * 1e3, "p99_ms": _seconds(pct["99"]) * 1e3,
            "rps": float(rps.group(1)), "requests": int(done.group(1)),
            "errors": errors + (int(non2xx.group(1)) if non2xx else 0)}


class Http(ServerWorkload):
    name, title, port = "http", "nginx: static page and 1 MiB file (wrk)", 80

    def files(self, size: Size) -> dict[str, str | bytes]:
        return {"nginx.conf": NGINX_CONF, "index.html": INDEX_HTML}

    def args(self, size: Size) -> list[str]:
        return _sh("echo ready; mkdir -p /tmp/www && cp /bench/index.html /tmp/www/ && "
                   "head -c 1048576 /dev/zero > /tmp/www/1m.bin && "
                   "exec nginx -e stderr -c /bench/nginx.conf")

    def client(self, address: str, size: Size) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for label, path in (("page", "index.html"), ("1mib", "1m.bin")):
            res = _run_client(["wrk", "-t1", "-c4", f"-d{size.http_s}s", "--latency",
                               "--timeout", "10s", f"http://{address}/{path}"])
            parsed = parse_wrk(res)
            if parsed["requests"] == 0:
                raise ParacellError(f"wrk {path}: no request completed")
            out[label] = parsed
        return out


# --- Key-value: redis, memcached -------------------------------------------


def parse_redis_csv(out: str) -> dict[str, dict[str, float]]:
    """redis-benchmark --csv (7.x): per test, rps and latency percentiles in ms."""
    rows = list(csv.DictReader(io.StringIO(out)))
    tests: dict[str, dict[str, float]] = {}
    for row in rows:
        try:
            tests[row["test"].split()[0].lower()] = {
                "rps": float(row["rps"]), "p50_ms": float(row["p50_latency_ms"]),
                "p99_ms": float(row["p99_latency_ms"]), "avg_ms": float(row["avg_latency_ms"])}
        except (KeyError, ValueError, AttributeError) as err:
            raise ParacellError(f"redis-benchmark: unexpected row {row}") from err
    if not {"set", "get"} <= set(tests):
        raise ParacellError(f"redis-benchmark: no SET/GET rows in {out[-300:]!r}")
    return tests


class Redis(ServerWorkload):
    name, title, port = "redis", "redis-server (redis-benchmark GET/SET)", 6379

    def args(self, size: Size) -> list[str]:
        return _sh("echo ready; exec redis-server --port 6379 --bind 0.0.0.0 "
                   "--protected-mode no --save '' --appendonly no --dir /tmp "
                   "--daemonize no --loglevel warning")

    def client(self, address: str, size: Size) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for label, pipeline, n in (("plain", 1, size.redis_n), ("pipelined", 16, size.redis_n * 5)):
            res = _run_client(["redis-benchmark", "-h", address, "-p", "6379", "-t", "set,get",
                               "-n", str(n), "-c", "4", "-P", str(pipeline), "-r", "1000",
                               "--csv"])
            for test, figures in parse_redis_csv(res).items():
                out[f"{test}_{label}"] = figures
        return out


def memcached_ops(address: str, port: int, count: int, value_size: int = 512,
                  timeout_s: float = 10.0) -> dict[str, Any]:
    """A small memcached text-protocol client: `count` SETs then `count` GETs,
    one at a time on one connection; each checked, each timed."""
    import numpy as np

    value = b"v" * value_size
    lat = {"set": np.empty(count), "get": np.empty(count)}
    with socket.create_connection((address, port), timeout=timeout_s) as sock:
        reader = sock.makefile("rb")
        began = time.perf_counter()
        for i in range(count):
            t0 = time.perf_counter_ns()
            sock.sendall(b"set k%d 0 0 %d\r\n%s\r\n" % (i % 1000, value_size, value))
            if reader.readline() != b"STORED\r\n":
                raise ParacellError("memcached: a SET was not STORED")
            lat["set"][i] = time.perf_counter_ns() - t0
        set_s = time.perf_counter() - began
        began = time.perf_counter()
        for i in range(count):
            t0 = time.perf_counter_ns()
            sock.sendall(b"get k%d\r\n" % (i % 1000))
            header = reader.readline()
            if not header.startswith(b"VALUE "):
                raise ParacellError(f"memcached: GET answered {header[:40]!r}")
            body = reader.read(value_size + 2)
            if reader.readline() != b"END\r\n" or body[:value_size] != value:
                raise ParacellError("memcached: a GET returned the wrong value")
            lat["get"][i] = time.perf_counter_ns() - t0
        get_s = time.perf_counter() - began
    out: dict[str, Any] = {}
    for op, took in (("set", set_s), ("get", get_s)):
        p50, p99 = np.percentile(lat[op], [50, 99]) / 1e6
        out[op] = {"p50_ms": float(p50), "p99_ms": float(p99), "rps": count / took}
    return out


class Memcached(ServerWorkload):
    name, title, port = "memcached", "memcached (SET/GET client)", 11211

    def args(self, size: Size) -> list[str]:
        return _sh("echo ready; exec memcached -u root -l 0.0.0.0 -p 11211 -U 0 -m 64 -t 1")

    def client(self, address: str, size: Size) -> dict[str, Any]:
        return memcached_ops(address, self.port, size.memcached_n)


# --- Database: sqlite3 -------------------------------------------------------

ACCOUNTS, START_BALANCE = 1000, 1000


def sqlite_script(transactions: int) -> str:
    """A fixed transactional script: transfers between accounts, each its own
    transaction, then checks; the total balance must not move."""
    lines = ["PRAGMA journal_mode=DELETE;", "PRAGMA synchronous=FULL;",
             "CREATE TABLE acct(id INTEGER PRIMARY KEY, bal INTEGER NOT NULL);",
             "CREATE TABLE ledger(id INTEGER PRIMARY KEY, src INT, dst INT, amt INT);",
             f"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<{ACCOUNTS}) "
             f"INSERT INTO acct SELECT x, {START_BALANCE} FROM c;"]
    seed = 12345
    for _ in range(transactions):
        seed = (seed * 1103515245 + 12345) % (1 << 31)
        src, dst, amt = seed % ACCOUNTS + 1, (seed // ACCOUNTS) % ACCOUNTS + 1, seed % 50 + 1
        lines.append(f"BEGIN; UPDATE acct SET bal=bal-{amt} WHERE id={src}; "
                     f"UPDATE acct SET bal=bal+{amt} WHERE id={dst}; "
                     f"INSERT INTO ledger(src,dst,amt) VALUES({src},{dst},{amt}); COMMIT;")
    lines += ["CREATE INDEX ledger_src ON ledger(src);",
              "SELECT 'total', sum(bal) FROM acct;",
              "SELECT 'ledger', count(*) FROM ledger;",
              "SELECT 'top', src FROM ledger GROUP BY src ORDER BY sum(amt) DESC, src LIMIT 1;"]
    return "\n".join(lines) + "\n"


class Sqlite(Workload):
    name, title = "sqlite", "sqlite3: fixed transactional script"

    def files(self, size: Size) -> dict[str, str | bytes]:
        return {"tx.sql": sqlite_script(size.sqlite_tx), "tx.count": f"{size.sqlite_tx}\n"}

    def args(self, size: Size) -> list[str]:
        return _sh("set -e; echo ready; cd /tmp; echo begin; "
                   "sqlite3 -separator ' ' /tmp/bench.db < /bench/tx.sql > /tmp/out; "
                   "echo end; sed 's/^/result /' /tmp/out; "
                   "echo \"result expect $(cat /bench/tx.count)\"")

    def parse(self, results: dict[str, list[str]]) -> dict[str, Any]:
        try:
            total, ledger, expect = (int(results[k][0]) for k in ("total", "ledger", "expect"))
        except (KeyError, IndexError, ValueError) as err:
            raise ParacellError(f"sqlite: missing results in {results}") from err
        if total != ACCOUNTS * START_BALANCE or ledger != expect:
            raise ParacellError(f"sqlite: wrong result (total {total}, ledger {ledger})")
        return {"transactions": ledger}


# --- Syscall- and fork-heavy: make + gcc ------------------------------------


def c_project(files: int) -> tuple[dict[str, str], int]:
    """A small C project: `files` units and a main; what it prints."""
    out: dict[str, str] = {}
    expect = 0
    for i in range(files):
        out[f"cproj/u{i}.c"] = (
            f"#include \"u.h\"\nstatic int helper{i}(int x) {{ return x * {i + 3} % 1009; }}\n"
            f"int unit{i}(void) {{ int s = 0; for (int j = 0; j < 100; j++) "
            f"s += helper{i}(j); return s; }}\n")
        expect += sum(j * (i + 3) % 1009 for j in range(100))
    out["cproj/u.h"] = "".join(f"int unit{i}(void);\n" for i in range(files))
    calls = " + ".join(f"unit{i}()" for i in range(files))
    out["cproj/main.c"] = ("#include <stdio.h>\n#include \"u.h\"\n"
                           f"int main(void) {{ printf(\"%d\\n\", {calls}); return 0; }}\n")
    objs = " ".join(f"u{i}.o" for i in range(files))
    out["cproj/Makefile"] = (f"app: main.o {objs}\n\tgcc -o $@ $^\n"
                             "%.o: %.c u.h\n\tgcc -O2 -c -o $@ $<\n")
    return out, expect


class Build(Workload):
    name, title = "build", "make + gcc: a small C project"

    def files(self, size: Size) -> dict[str, str | bytes]:
        files, expect = c_project(size.build_files)
        return {**files, "cproj.expect": f"{expect}\n"}

    def args(self, size: Size) -> list[str]:
        return _sh("set -e; echo ready; cp -r /bench/cproj /tmp/c; echo begin; "
                   "make -s -C /tmp/c -j1; out=$(/tmp/c/app); "
                   "tar -C /tmp -cf - c | gzip -1 > /tmp/c.tgz; echo end; "
                   "echo \"result sum $out\"; echo \"result expect $(cat /bench/cproj.expect)\"")

    def parse(self, results: dict[str, list[str]]) -> dict[str, Any]:
        if results.get("sum") != results.get("expect") or "sum" not in results:
            raise ParacellError(f"build: the program printed {results.get('sum')}, "
                                f"not {results.get('expect')}")
        return {}


# --- Agent workloads ---------------------------------------------------------

CALC = '''\
"""A small inventory library: the project the SWE-bench-like task fixes."""


def total(items):
    return sum(qty * price for _, qty, price in items)


def restock(stock, name, qty):
    if qty <= 0:
        raise ValueError("qty must be positive")
    stock[name] = stock.get(name, 0) + qty
    return stock[name]


def take(stock, name, qty):
    have = stock.get(name, 0)
    if qty > have:
        raise KeyError(name)
    stock[name] = have - qty
    return stock[name]


def top(items, n):
    return sorted(items, key=lambda it: it[1] * it[2])[:n]


def index(items):
    table = {}
    for name, qty, price in items:
        table.setdefault(name[0], []).append((name, qty, price))
    return table
'''
SCALE_TESTS = '''\
import unittest

import calc


def items(n):
    return [(f"item-{{i:06d}}", i % 17 + 1, (i * 7919) % 1000 / 10) for i in range(n)]


class Inventory(unittest.TestCase):
    N = {n}

    def test_total(self):
        self.assertAlmostEqual(calc.total([("a", 2, 1.5), ("b", 1, 3.0)]), 6.0)

    def test_restock_take(self):
        stock = {{}}
        calc.restock(stock, "a", 5)
        self.assertEqual(calc.take(stock, "a", 3), 2)
        with self.assertRaises(KeyError):
            calc.take(stock, "a", 9)
        with self.assertRaises(ValueError):
            calc.restock(stock, "a", 0)

    def test_top_is_largest_first(self):
        data = items(self.N)
        best = calc.top(data, 5)
        values = [q * p for _, q, p in best]
        self.assertEqual(values, sorted(values, reverse=True))
        self.assertEqual(values[0], max(q * p for _, q, p in data))

    def test_index_big(self):
        table = calc.index(items(self.N))
        self.assertEqual(sum(len(v) for v in table.values()), self.N)

    def test_total_big(self):
        data = items(self.N)
        self.assertGreater(calc.total(data), 0)
'''


def swe_project(scale: int) -> dict[str, str]:
    """The project, its tests (one fails: top() sorts the wrong way), and the fix as a patch."""
    fixed = CALC.replace("key=lambda it: it[1] * it[2])[:n]",
                         "key=lambda it: it[1] * it[2], reverse=True)[:n]")
    patch = "".join(difflib.unified_diff(CALC.splitlines(True), fixed.splitlines(True),
                                         "a/calc.py", "b/calc.py"))
    return {"proj/calc.py": CALC, "proj/test_calc.py": SCALE_TESTS.format(n=40000 * scale),
            "fix.patch": patch}


class Swe(Workload):
    name, title, agent = "swe", "SWE-bench-like: tests, patch, tests, git diff", True

    def files(self, size: Size) -> dict[str, str | bytes]:
        return swe_project(size.swe_scale)

    def args(self, size: Size) -> list[str]:
        git = "git -c user.email=bench@paracell.invalid -c user.name=bench"
        return _sh(SAMPLER + f"""
set -e; echo ready; export HOME=/tmp
sample & sampler=$!
cp -r /bench/proj /tmp/proj; cd /tmp/proj
echo begin
git init -q; {git} add -A; {git} commit -qm base
if python3 -B -m unittest -q 2>/tmp/t1
then echo result before pass; else echo result before fail; fi
git apply /bench/fix.patch
if python3 -B -m unittest -q 2>/tmp/t2
then echo result after pass; else echo result after fail; fi
echo "result diff $(git diff --numstat | tr '\\t' ' ')"
echo end
touch /tmp/.stop; wait $sampler
""")

    def parse(self, results: dict[str, list[str]]) -> dict[str, Any]:
        if results.get("before") != ["fail"] or results.get("after") != ["pass"]:
            raise ParacellError(f"swe: tests before/after the patch: {results.get('before')}, "
                                f"{results.get('after')} (want fail, pass)")
        if results.get("diff", [""])[-1:] != ["calc.py"]:
            raise ParacellError(f"swe: git diff shows {results.get('diff')}")
        return {}


AGENT_SCRIPT = Path(__file__).resolve().parents[1] / "programs" / "agent_workload.py"


class Skills(Workload):
    name, agent = "skills", True
    title = "SkillsBench-like tool-call trace (Python bursts, idle gaps)"

    def files(self, size: Size) -> dict[str, str | bytes]:
        return {"agent_workload.py": AGENT_SCRIPT.read_text()}

    def args(self, size: Size) -> list[str]:
        return _sh(SAMPLER + f"""
set -e; echo ready
sample & sampler=$!
echo begin
python3 -B /bench/agent_workload.py {size.skills_rounds} {size.skills_items} > /tmp/trace
echo end
echo "result events $(grep -c -e '^allocated' /tmp/trace)"
echo "result expect {size.skills_rounds}"
touch /tmp/.stop; wait $sampler
""")

    def parse(self, results: dict[str, list[str]]) -> dict[str, Any]:
        if "events" not in results or results.get("events") != results.get("expect"):
            raise ParacellError(f"skills: {results.get('events')} tool calls, "
                                f"not {results.get('expect')}")
        return {}


WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    Http(), Redis(), Memcached(), Sqlite(), Build(), Swe(), Skills())}


def _run_client(cmd: list[str]) -> str:
    try:
        res = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=CLIENT_TIMEOUT_S)
    except subprocess.TimeoutExpired as err:
        raise ParacellError(f"{cmd[0]} ran past {CLIENT_TIMEOUT_S} s") from err
    if res.returncode != 0:
        raise ParacellError(f"{cmd[0]} failed: {res.stderr.strip()[-300:]}")
    return res.stdout


def wait_listening(address: str, port: int, deadline_s: float,
                   alive: Callable[[], bool] = lambda: True) -> float:
    """Until a TCP connect succeeds (bounded by deadline_s and by alive());
    returns when it did, time.monotonic()."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if not alive():
            raise ParacellError(f"the server exited before it listened on {address}:{port}")
        try:
            with socket.create_connection((address, port), timeout=1.0):
                return time.monotonic()
        except OSError:
            time.sleep(0.05)
    raise ParacellError(f"nothing listened on {address}:{port} within {deadline_s:.0f} s")


def write_files(directory: Path, files: dict[str, str | bytes]) -> None:
    for rel, content in files.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
