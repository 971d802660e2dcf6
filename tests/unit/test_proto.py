"""proto/ is the one definition of every host<->guest format: Python sees it
through cffi, C includes it, and nothing else may carry its own copy."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from paracell._native import ffi, lib

from paracell.errors import ParacellError
from paracell.runtime.agent import channel

REPO = Path(__file__).resolve().parents[2]
PROTO = REPO / "proto"


def _c_view(tmp_path: Path, names: list[str]) -> dict[str, str]:
    """What a C program compiled against proto/ today sees for each name."""
    prints = "\n".join(
        f'    printf("{n}=%s\\n", _Generic(({n}), char *: (const char *)({n}), '
        f'const char *: (const char *)({n}), default: "")); '
        f'if (!_Generic(({n}), char *: 1, const char *: 1, default: 0)) '
        f'printf("{n}=%lld\\n", (long long)_Generic(({n}), char *: 0, const char *: 0, '
        f'default: ({n})));'
        for n in names
    )
    src = tmp_path / "view.c"
    src.write_text(
        '#include <stdio.h>\n#include "agent_proto.h"\n#include "vm_proto.h"\n'
        f"int main(void) {{\n{prints}\n    return 0;\n}}\n"
    )
    exe = tmp_path / "view"
    subprocess.run(["gcc", "-std=c11", f"-I{PROTO}", "-o", str(exe), str(src)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    seen: dict[str, str] = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if value:
            seen[key] = value
    return seen


def _header_names() -> list[str]:
    names = []
    for header in ("agent_proto.h", "vm_proto.h"):
        text = (PROTO / header).read_text()
        names += re.findall(r"#define\s+(PC_\w+)\s+\S", text)
        names += re.findall(r"^\s+(PC_[A-Z_]+)\s*=", text, re.M)
    return names


def test_python_sees_what_c_compiles_against(tmp_path):
    names = _header_names()
    assert {"PC_SPEC", "PC_HOST_ACK", "PC_MAX_PAYLOAD", "PC_AGENT_PORT_NAME"} <= set(names)
    c_view = _c_view(tmp_path, names)
    for name in names:
        value = getattr(lib, name)
        ours = ffi.string(value).decode() if isinstance(value, ffi.CData) else str(value)
        assert ours == c_view[name], f"{name}: Python has {ours}, C has {c_view[name]}"


def test_python_payload_layouts_match_the_header_structs():
    assert channel.SIGNAL_MSG.size == ffi.sizeof("struct pc_signal_msg")
    assert channel.CREATED_MSG.size == ffi.sizeof("struct pc_created_msg")
    assert channel.READY_MSG.size == ffi.sizeof("struct pc_ready_msg") == 8
    assert ffi.sizeof("struct pc_hdr") == lib.PC_HDR_LEN
    assert channel.encode_signal(9, True) == b"\x09\0\0\0\x01\0\0\0"
    assert channel.decode_created(b"\x2a\0\0\0") == 42


def test_no_copy_of_a_wire_name_outside_proto():
    """The literals of proto/vm_proto.h appear nowhere else in code."""
    literals = re.findall(r'#define\s+PC_\w+\s+"([^"]+)"', (PROTO / "vm_proto.h").read_text())
    # "rootfs" is also the bundle directory's usual name, which is not wiring.
    literals = [lit for lit in literals if lit != "rootfs"]
    assert "paracell.agent" in literals
    code = [p for d in ("paracell", "csrc", "guest") for p in (REPO / d).rglob("*")
            if p.suffix in (".py", ".c", ".h")]
    for path in code:
        text = path.read_text(errors="replace")
        for literal in literals:
            assert f'"{literal}"' not in text, f"{path} retypes {literal!r}"


def _c_output(tmp_path: Path, name: str, source: str) -> str:
    """What a small C program built against proto/ prints."""
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    exe = tmp_path / name
    subprocess.run(["gcc", "-std=c11", "-Wall", "-Werror", f"-I{PROTO}", "-o", str(exe), str(src)],
                   check=True)
    return subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout


def test_port_forward_messages_are_laid_out_as_the_tests_write_them(tmp_path):
    """The port-forward payloads as C encodes them (proto/agent_codec.h) are
    the little-endian layouts the tests send (tests/unit/test_portfwd.py)."""
    import struct

    assert ffi.sizeof("struct pc_fwd_open_msg") == 4
    assert ffi.sizeof("struct pc_fwd_credit_msg") == 4
    out = _c_output(tmp_path, "fwd",
        '#include <stdio.h>\n#include "agent_codec.h"\n'
        "static void hex(const unsigned char *p, int n) {\n"
        '    for (int i = 0; i < n; i++) printf("%02x", p[i]);\n    printf("\\n");\n}\n'
        "int main(void) {\n"
        "    unsigned char b[4];\n"
        "    struct pc_fwd_open_msg o = {.port = 0x1f90, .family = PC_FWD_INET6}, back;\n"
        "    pc_fwd_open_encode(b, &o); hex(b, 4);\n"
        "    if (pc_fwd_open_decode(b, 4, &back) || back.port != o.port || "
        "pc_fwd_open_decode(b, 3, &back) == 0) return 1;\n"
        "    struct pc_fwd_credit_msg c = {.bytes = 0x40001}, cb;\n"
        "    pc_fwd_credit_encode(b, &c); hex(b, 4);\n"
        "    return pc_fwd_credit_decode(b, 4, &cb) || cb.bytes != c.bytes || "
        "pc_fwd_credit_decode(b, 5, &cb) == 0;\n}\n").split()
    assert out == [struct.pack("<HH", 0x1F90, lib.PC_FWD_INET6).hex(),
                   struct.pack("<I", 0x40001).hex()]


def test_port_forward_bounds_fit_the_frame():
    # A stream id rides in the header's chan, which every reader bounds by PC_MAX_CHAN.
    assert 1 <= lib.PC_FWD_MAX_STREAMS <= lib.PC_MAX_CHAN
    # A full DATA frame must fit in one window, or a sender could stall forever.
    assert lib.PC_FWD_WINDOW >= lib.PC_MAX_PAYLOAD
    # No two frame types share a number.
    header = (PROTO / "agent_proto.h").read_text()
    body = header[header.index("enum pc_type {"):]
    body = body[:body.index("};")]
    types = re.findall(r"^\s+(PC_[A-Z_]+)\s*=", body, re.M)
    assert {"PC_FWD_OPEN", "PC_FWD_CLOSE", "PC_SPEC"} <= set(types)
    values = [getattr(lib, name) for name in types]
    assert len(values) == len(set(values)), sorted(values)


def test_stats_reply_is_decoded_as_the_agent_encodes_it(tmp_path):
    """STATS_REPLY: C puts each figure at its enum pc_stat index, Python
    reads it back under that enum's name; a reply of another size is a
    protocol violation."""
    payload = bytes.fromhex(_c_output(
        tmp_path, "stats",
        '#include <stdio.h>\n#include "agent_codec.h"\n'
        "int main(void) {\n"
        "    uint64_t v[PC_STAT_COUNT]; unsigned char b[PC_STATS_REPLY_LEN];\n"
        "    for (int i = 0; i < PC_STAT_COUNT; i++) v[i] = (uint64_t)i << 40 | 7;\n"
        "    v[PC_STAT_MEMORY_CURRENT] = 64ull << 20;\n"
        "    pc_stats_reply_encode(b, v);\n"
        '    for (int i = 0; i < PC_STATS_REPLY_LEN; i++) printf("%02x", b[i]);\n'
        "    return 0;\n}\n"))
    figures = channel.decode_stats_reply(payload)
    assert list(figures) == channel.stat_names() and len(figures) == lib.PC_STAT_COUNT
    assert figures["memory_current"] == 64 << 20
    assert figures["usage_usec"] == 7 and figures["pids_max"] == lib.PC_STAT_PIDS_MAX << 40 | 7
    for bad in (payload[:-1], payload + b"\0", b""):
        with pytest.raises(ParacellError, match="STATS_REPLY with"):
            channel.decode_stats_reply(bad)


SPEC_KEY = re.compile(r'#define (PC_KEY_\w+) "([^"]*)"')
AGENT = REPO / "guest" / "agent"


def test_the_launch_spec_keys_are_defined_once_and_used_on_both_sides():
    """proto/launch_spec.h is the one list of record keys: Python sees it
    through cffi, the agent compares against its macros, neither types a key
    of its own, and no key is defined that one side never uses."""
    from paracell import speckeys

    defined = dict(SPEC_KEY.findall((PROTO / "launch_spec.h").read_text()))
    assert len(set(defined.values())) == len(defined), "two macros name one key"
    assert speckeys.SEP == "\x1f"  # the only escaped one
    for macro, text in defined.items():
        if macro != "PC_KEY_SEP":
            assert getattr(speckeys, macro.removeprefix("PC_KEY_")) == text
    agent = "\n".join(p.read_text() for p in sorted(AGENT.glob("*.c")))
    # The agent never compares a key against a string literal of its own.
    assert re.findall(r'str(?:n)?cmp\(key, "', agent) == []
    host = "\n".join(p.read_text() for p in sorted((REPO / "paracell").rglob("*.py")))
    for macro, text in defined.items():
        if macro == "PC_KEY_SEP":
            continue
        assert macro in agent, f"the agent never reads {macro}"
        # The host writes the whole cap.SET and ns.TYPE keys; the agent
        # dispatches on their prefixes.
        if not macro.endswith("_PREFIX"):
            assert f"K.{macro.removeprefix('PC_KEY_')}" in host, f"the host never writes {macro}"
        # ... and the host never types the key itself as a record's key: a
        # ("key", value) tuple, not a call such as get("key", default).
        typed = re.findall(r'(?<![\w.])\("' + re.escape(text) + r'", ', host)
        assert typed == [], f"{text!r} typed outside proto/launch_spec.h"
