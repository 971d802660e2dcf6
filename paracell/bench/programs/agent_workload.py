"""An agent's tool calls in miniature, run by Debian's python3 inside a
container for `paracell bench memory`: parse a large JSON document, build and
drop big structures, pipe data through gzip and sort, then idle. One line per
event, with the guest's MemFree, like pagerload.c."""

import gc
import json
import subprocess
import sys
import time


def free_kb() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemFree:"):
                return int(line.split()[1])
    return -1


def say(*words: object) -> None:
    print(*words, flush=True)


def tool_call(items: int) -> None:
    doc = json.dumps([{"id": i, "name": f"item-{i:07d}", "tags": ["alpha", "beta", str(i % 97)],
                       "score": i * 0.5} for i in range(items)])
    data = json.loads(doc)
    index = {d["name"]: d for d in data}
    text = "\n".join(sorted(index, reverse=True)).encode()
    subprocess.run(["gzip", "-c"], input=text, stdout=subprocess.DEVNULL, check=True)
    ordered = subprocess.run(["sort"], input=text, capture_output=True, check=True).stdout
    assert ordered.count(b"\n") == items
    say("allocated", items, free_kb())


def main() -> None:
    rounds, items = int(sys.argv[1]), int(sys.argv[2])
    say("idle", free_kb())
    began = time.monotonic()
    for _ in range(rounds):
        tool_call(items)
        gc.collect()
        say("freed", items, free_kb())
        time.sleep(1.0)
    say("workload", f"{time.monotonic() - began:.3f}")
    say("done")


main()
