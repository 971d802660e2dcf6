"""linux.seccomp: compiled on the host with libseccomp, installed in the guest.

runc hands the profile to libseccomp and loads what it builds.  ParaCell does
the same build here (paracell._seccomp, csrc/build_seccomp.py), exports the
classic-BPF program with seccomp_export_bpf and sends it to the agent in one
PC_SECCOMP frame (proto/agent_proto.h) ahead of the init's SPEC; the agent
installs it in the container's init and in every exec, as runc does.  So the
semantics (architectures, argument comparisons, how rules merge) are
libseccomp's own.  The profile is hostile input: every field is type-checked
and bounded, and so is the program that comes out.
"""

from __future__ import annotations

import os
import struct
from typing import Any

from paracell._native import lib
from paracell.errors import ParacellError
from paracell.runtime import configcheck

# Bounds on the profile itself, so that a hostile one cannot make libseccomp
# work for long; the real limit is the program's size, checked after export.
MAX_SYSCALL_RULES = 4096
MAX_NAMES = 8192
MAX_ARGS_PER_RULE = 64
MAX_NAME_LEN = 64
ERRNO_MAX = 0xFFFF  # SECCOMP_RET_DATA is 16 bits
EPERM = 1
SYSCALL_ARGS = 6
# runc asks libseccomp for its binary-tree layout from this many rules on.
OPTIMIZE_FROM_RULES = 9

# struct pc_seccomp_hdr, little-endian; the sock_filter array follows as
# libseccomp exports it (the guest is x86-64, little-endian like this host).
SECCOMP_HDR = struct.Struct("<II")
SOCK_FILTER_LEN = 8

COMPARE_OPS = ("SCMP_CMP_NE", "SCMP_CMP_LT", "SCMP_CMP_LE", "SCMP_CMP_EQ",
               "SCMP_CMP_GE", "SCMP_CMP_GT", "SCMP_CMP_MASKED_EQ")
NOTIFY_REFUSED = (
    "seccomp: SCMP_ACT_NOTIFY is not supported: the notification fd would belong to the "
    "guest kernel, and a listener on the host cannot serve it")


# `where` below is relative to linux.seccomp.
def _fail(msg: str) -> ParacellError:
    return configcheck.fail(f"linux.seccomp{msg}")


def _expect(value: Any, kind: type, where: str) -> Any:
    return configcheck.expect(value, kind, f"linux.seccomp{where}")


def _uint(value: Any, where: str, limit: int) -> int:
    return configcheck.uint(value, f"linux.seccomp{where}", limit)


def _flags(seccomp: dict[str, Any]) -> int:
    """The kernel's SECCOMP_FILTER_FLAG_* bits for the spec's flags, as runc
    maps them: TSYNC is a no-op there (one thread execs), the rest fail."""
    names = _expect(seccomp.get("flags") or [], list, ".flags")
    if len(names) > 16:
        raise _fail(".flags has more than 16 entries")
    bits = 0
    known = {"SECCOMP_FILTER_FLAG_LOG": lib.PC_SECCOMP_FLAG_LOG,
             "SECCOMP_FILTER_FLAG_SPEC_ALLOW": lib.PC_SECCOMP_FLAG_SPEC_ALLOW,
             "SECCOMP_FILTER_FLAG_TSYNC": 0}
    for i, name in enumerate(names):
        _expect(name, str, f".flags[{i}]")
        if name not in known:
            raise ParacellError(f"seccomp flags {name[:64]!r} not yet supported by paracell")
        bits |= known[name]
    return bits


def _action(sc: Any, name: Any, errno_ret: Any, where: str) -> int:
    """runc's getAction: ERRNO and TRACE take errnoRet, EPERM when absent."""
    _expect(name, str, where)
    data = EPERM if errno_ret is None else _uint(errno_ret, f"{where} errnoRet", ERRNO_MAX)
    simple = {"SCMP_ACT_KILL": sc.SCMP_ACT_KILL_THREAD,
              "SCMP_ACT_KILL_THREAD": sc.SCMP_ACT_KILL_THREAD,
              "SCMP_ACT_KILL_PROCESS": sc.SCMP_ACT_KILL_PROCESS,
              "SCMP_ACT_TRAP": sc.SCMP_ACT_TRAP, "SCMP_ACT_ALLOW": sc.SCMP_ACT_ALLOW,
              "SCMP_ACT_LOG": sc.SCMP_ACT_LOG}
    if name in simple:
        return int(simple[name])
    if name == "SCMP_ACT_ERRNO":
        return int(sc.pc_scmp_act_errno(data))
    if name == "SCMP_ACT_TRACE":
        return int(sc.pc_scmp_act_trace(data))
    if name == "SCMP_ACT_NOTIFY":
        raise ParacellError(NOTIFY_REFUSED)
    raise _fail(f"{where} {name[:64]!r} is not a seccomp action")


def _conditions(ffi: Any, sc: Any, args: Any, where: str) -> list[Any]:
    out = []
    for at, arg in configcheck.entries(args, f"linux.seccomp{where}", MAX_ARGS_PER_RULE):
        at = at.removeprefix("linux.seccomp")
        index = _uint(arg.get("index"), f"{at}.index", SYSCALL_ARGS - 1)
        op = _expect(arg.get("op"), str, f"{at}.op")
        if op not in COMPARE_OPS:
            raise _fail(f"{at}.op {op[:64]!r} is not a seccomp comparison")
        value = _uint(arg.get("value", 0), f"{at}.value", 2**64 - 1)
        value_two = _uint(arg.get("valueTwo", 0), f"{at}.valueTwo", 2**64 - 1)
        out.append((index, getattr(sc, op), value, value_two))
    return out


def _add_rule(ffi: Any, sc: Any, ctx: Any, nr: int, action: int, conds: list[Any],
              name: str) -> None:
    """As runc's matchCall: all conditions in one rule, unless one argument
    is compared twice, which libseccomp cannot AND; then one rule each."""
    indexes = [c[0] for c in conds]
    groups = [conds] if len(set(indexes)) == len(indexes) else [[c] for c in conds]
    for group in groups:
        array = ffi.new("struct scmp_arg_cmp[]", max(1, len(group)))
        for j, (index, op, value, value_two) in enumerate(group):
            array[j].arg, array[j].op = index, op
            array[j].datum_a, array[j].datum_b = value, value_two
        rc = sc.seccomp_rule_add_array(ctx, action, nr, len(group), array)
        if rc < 0:
            raise ParacellError(f"seccomp: add rule for syscall {name}: {os.strerror(-rc)}")


def _architectures(sc: Any, ctx: Any, seccomp: dict[str, Any]) -> None:
    archs = _expect(seccomp.get("architectures") or [], list, ".architectures")
    if len(archs) > 32:
        raise _fail(".architectures has more than 32 entries")
    for i, arch in enumerate(archs):
        _expect(arch, str, f".architectures[{i}]")
        token = 0
        if arch.startswith("SCMP_ARCH_") and len(arch) < 40:
            token = sc.seccomp_arch_resolve_name(arch[len("SCMP_ARCH_"):].lower().encode())
        if not token:
            raise ParacellError(f"string {arch[:64]} is not a valid arch for seccomp")
        if sc.seccomp_arch_exist(ctx, token) == 0:
            continue
        rc = sc.seccomp_arch_add(ctx, token)
        if rc < 0:
            raise ParacellError(f"seccomp: add architecture {arch}: {os.strerror(-rc)}")


def _rules(ffi: Any, sc: Any, ctx: Any, seccomp: dict[str, Any], default: int) -> None:
    syscalls = _expect(seccomp.get("syscalls") or [], list, ".syscalls")
    if len(syscalls) > MAX_SYSCALL_RULES:
        raise _fail(f".syscalls has more than {MAX_SYSCALL_RULES} entries")
    # runc counts one rule per name (its config has one entry per syscall).
    names = sum(len(r["names"]) for r in syscalls
                if isinstance(r, dict) and isinstance(r.get("names"), list))
    if names >= OPTIMIZE_FROM_RULES:
        sc.seccomp_attr_set(ctx, sc.SCMP_FLTATR_CTL_OPTIMIZE, 2)
    total = 0
    for i, rule in enumerate(syscalls):
        where = f".syscalls[{i}]"
        _expect(rule, dict, where)
        names = _expect(rule.get("names"), list, f"{where}.names")
        total += len(names)
        if not names or total > MAX_NAMES:
            raise _fail(f"{where}.names must have 1 to {MAX_NAMES} names in all")
        action = _action(sc, rule.get("action"), rule.get("errnoRet"), f"{where}.action")
        conds = _conditions(ffi, sc, rule.get("args") or [], f"{where}.args")
        for j, name in enumerate(names):
            _expect(name, str, f"{where}.names[{j}]")
            if action == default:
                continue  # runc skips these; libseccomp would refuse them
            nr = -1
            if 0 < len(name) <= MAX_NAME_LEN and name.isprintable():
                nr = sc.seccomp_syscall_resolve_name(name.encode())
            if nr == sc.__NR_SCMP_ERROR:
                continue  # runc: a syscall libseccomp does not know is ignored
            _add_rule(ffi, sc, ctx, nr, action, conds, name)


def _export(sc: Any, ctx: Any) -> bytes:
    fd = os.memfd_create("paracell-seccomp", os.MFD_CLOEXEC)
    try:
        rc = sc.seccomp_export_bpf(ctx, fd)
        if rc < 0:
            raise ParacellError(f"seccomp: export the filter: {os.strerror(-rc)}")
        size = os.lseek(fd, 0, os.SEEK_END)
        limit = lib.PC_SECCOMP_MAX_INSNS * SOCK_FILTER_LEN
        if size > limit or size % SOCK_FILTER_LEN or not size:
            raise ParacellError(
                f"seccomp: the profile compiles to {size // SOCK_FILTER_LEN} BPF instructions; "
                f"the kernel takes at most {lib.PC_SECCOMP_MAX_INSNS}")
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)


ACTIONS = ("SCMP_ACT_ALLOW", "SCMP_ACT_ERRNO", "SCMP_ACT_KILL", "SCMP_ACT_KILL_PROCESS",
           "SCMP_ACT_KILL_THREAD", "SCMP_ACT_LOG", "SCMP_ACT_TRACE", "SCMP_ACT_TRAP")
# The guest is x86-64; these are what its kernel can run (x86-64, and the
# 32-bit ABIs a filter must name to cover them, as podman's profile does).
ARCHES = ("SCMP_ARCH_X86", "SCMP_ARCH_X86_64", "SCMP_ARCH_X32")


def features() -> dict[str, Any]:
    """`paracell features`' seccomp part, in runc's shape."""
    return {"enabled": True, "actions": list(ACTIONS), "operators": sorted(COMPARE_OPS),
            "archs": list(ARCHES),
            "knownFlags": ["SECCOMP_FILTER_FLAG_TSYNC", "SECCOMP_FILTER_FLAG_LOG",
                           "SECCOMP_FILTER_FLAG_SPEC_ALLOW"],
            "supportedFlags": ["SECCOMP_FILTER_FLAG_TSYNC", "SECCOMP_FILTER_FLAG_LOG",
                               "SECCOMP_FILTER_FLAG_SPEC_ALLOW"]}


def compile_profile(seccomp: Any) -> bytes | None:
    """The PC_SECCOMP payload for linux.seccomp, or None when there is none.
    Raises ParacellError with one line on anything runc would refuse, or
    that cannot apply in a VM."""
    if seccomp is None:
        return None
    _expect(seccomp, dict, "")
    for key in ("listenerPath", "listenerMetadata"):
        if seccomp.get(key):
            raise ParacellError(NOTIFY_REFUSED)
    from paracell._seccomp import ffi
    from paracell._seccomp import lib as sc

    flags = _flags(seccomp)
    default = _action(sc, seccomp.get("defaultAction"), seccomp.get("defaultErrnoRet"),
                      ".defaultAction")
    ctx = sc.seccomp_init(default)
    if ctx == ffi.NULL:
        raise ParacellError("seccomp: libseccomp refused the default action")
    try:
        _architectures(sc, ctx, seccomp)
        _rules(ffi, sc, ctx, seccomp, default)
        program = _export(sc, ctx)
    finally:
        sc.seccomp_release(ctx)
    return SECCOMP_HDR.pack(flags, len(program) // SOCK_FILTER_LEN) + program
