"""`bench snapshot`'s container process: touches MIB of memory, then on each
SIGUSR1 rewrites CHANGE MiB of it (a different slice each time) and writes
the generation to /gen, which the host reads to know the change is done."""

import os
import signal
import sys
from typing import Any

mib, change = int(sys.argv[1]), int(sys.argv[2]) << 20
buf = bytearray(b"\x01") * (mib << 20)
state = {"gen": 0, "at": 0}


def put_gen() -> None:
    with open("/gen.tmp", "w") as f:
        f.write(str(state["gen"]))
    os.rename("/gen.tmp", "/gen")


def bump(signum: int, frame: Any) -> None:
    state["gen"] += 1
    at = state["at"]
    buf[at:at + change] = bytes([state["gen"] & 0xFF or 1]) * change
    state["at"] = (at + change) % max(len(buf) - change, 1)
    put_gen()


signal.signal(signal.SIGUSR1, bump)
put_gen()
while True:
    signal.pause()
