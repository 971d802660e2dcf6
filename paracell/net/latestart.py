"""`python -m paracell.net.latestart RECORD`: START's payload for a VM whose
shim is paracell-vmshim (csrc/vmshimexec.c), run by it when interfaces other
than its own are in its network namespace at `start` (paracell/net/late.py).

It runs in the shim's namespaces and prints the payload on stdout. On failure
it prints one line there and exits 1: the shim refuses the `start` with that
line, as the Python shim's relay would."""

from __future__ import annotations

import sys
from pathlib import Path

from paracell.errors import ParacellError


def main(argv: list[str]) -> int:
    from paracell.net import late

    if len(argv) != 2:
        sys.stdout.write("usage: python -m paracell.net.latestart RECORD")
        return 1
    try:
        payload = late.payload_for(Path(argv[1]))
    except (ParacellError, OSError) as err:  # one line for the refused start, never a traceback
        sys.stdout.write(str(err).replace("\n", " "))
        return 1
    sys.stdout.buffer.write(payload)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
