"""cffi builder for paracell._native: the relay, frame I/O, port forwarding and Pager server
in csrc/, plus every constant, enum and struct of the host<->guest formats in proto/.

The headers are the one definition: their declarations are handed to cffi's
cdef as they are, so Python sees exactly what the C code compiles against.
"""

from __future__ import annotations

import re
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
PROTO = HERE.parent / "proto"
# Read by Python through cffi, in this order (later headers may use earlier types).
CDEF_HEADERS = (PROTO / "agent_proto.h", PROTO / "vm_proto.h", PROTO / "launch_spec.h",
                PROTO / "pager_proto.h",
                HERE / "portfwd.h", HERE / "relay.h", HERE / "pager.h", HERE / "hostclock.h",
                HERE / "checkpoint.h", HERE / "ramcopy.h", HERE / "dirtylog.h")

_DEFINE = re.compile(r"#\s*define\s+(\w+)(?:\s+(.*?))?\s*(?:/\*.*)?$")


def cdef_of(header: Path) -> str:
    """The header as cffi's cdef wants it: integer #defines become `...`
    (cffi asks the compiler for the value), string #defines become constants,
    and the include guard and #includes go."""
    out = []
    for line in header.read_text().splitlines():
        if not line.lstrip().startswith("#"):
            out.append(line)
            continue
        match = _DEFINE.match(line.strip())
        if not match or not match.group(2):
            continue  # include guards, #include, #endif
        name, value = match.groups()
        if value.startswith('"'):
            out.append(f"static const char *const {name};")
        else:
            out.append(f"#define {name} ...")
    return "\n".join(out)


ffibuilder = FFI()
ffibuilder.cdef("\n".join(cdef_of(h) for h in CDEF_HEADERS))
ffibuilder.set_source(
    "paracell._native",
    "\n".join(f'#include "{h.name}"' for h in CDEF_HEADERS),
    sources=[str(HERE / n) for n in ("relay.c", "sink.c", "streams.c", "portfwd.c", "pager.c",
                                     "hostclock.c", "checkpoint.c", "ramcopy.c", "dirtylog.c")],
    include_dirs=[str(PROTO), str(HERE)],
    extra_compile_args=["-O2", "-Wall", "-Wextra", "-Werror"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=False)
