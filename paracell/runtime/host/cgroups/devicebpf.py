"""linux.resources.devices on cgroup v2: a BPF_PROG_TYPE_CGROUP_DEVICE program.

v2 has no devices.allow/deny files; the kernel asks a BPF program attached to
the cgroup instead, as runc's devicefilter does. The rules are first reduced
the way v1's devices cgroup applies them in order (an "a" rule sets the
default and clears the list; a rule against the default is an exception; a
rule agreeing with it removes the same exception), then compiled to a short
program: for each exception, a match returns its verdict; the end returns the
default. The VMM's own nodes (files.VMM_DEVICES) are allowed after the spec's
rules, as on v1.
"""

from __future__ import annotations

import ctypes
import os
import struct

from paracell.errors import ParacellError
from paracell.linux import (
    BPF_CGROUP_DEVICE,
    BPF_DEVCG_ACC_MKNOD,
    BPF_DEVCG_ACC_READ,
    BPF_DEVCG_ACC_WRITE,
    BPF_DEVCG_DEV_BLOCK,
    BPF_DEVCG_DEV_CHAR,
    BPF_F_ALLOW_MULTI,
    BPF_PROG_ATTACH,
    BPF_PROG_LOAD,
    BPF_PROG_TYPE_CGROUP_DEVICE,
    bpf,
)
from paracell.runtime.bundle.resources import Device

# struct bpf_cgroup_dev_ctx: access_type (type | access << 16), major, minor.
DEV_TYPE = {"b": BPF_DEVCG_DEV_BLOCK, "c": BPF_DEVCG_DEV_CHAR}
ACCESS = {"m": BPF_DEVCG_ACC_MKNOD, "r": BPF_DEVCG_ACC_READ, "w": BPF_DEVCG_ACC_WRITE}
LOG_SIZE = 65536


def reduce(rules: list[Device]) -> tuple[bool, list[Device]]:
    """v1's semantics of rules applied in order: (default allow, exceptions)."""
    default, exceptions = True, []  # a new v1 cgroup allows everything
    for rule in rules:
        if rule.kind == "a" and rule.major < 0 and rule.minor < 0:
            default, exceptions = rule.allow, []
        elif rule.allow != default:
            exceptions.append(rule)
        else:
            exceptions = [e for e in exceptions if (e.kind, e.major, e.minor, e.access)
                          != (rule.kind, rule.major, rule.minor, rule.access)]
    return default, exceptions


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


LDXW, AND32_K, RSH32_K, MOV32_X, MOV64_K, JNE_K, EXIT = (
    0x61, 0x54, 0x74, 0xBC, 0xB7, 0x55, 0x95)


def compile_rules(default: bool, exceptions: list[Device]) -> bytes:
    """r2 = type, r3 = access, r4 = major, r5 = minor; r0 = 1 allows."""
    prog = [_insn(LDXW, 2, 1, 0), _insn(AND32_K, 2, imm=0xFFFF),
            _insn(LDXW, 3, 1, 0), _insn(RSH32_K, 3, imm=16),
            _insn(LDXW, 4, 1, 4), _insn(LDXW, 5, 1, 8)]
    for rule in exceptions:
        if max(rule.major, rule.minor) > 0x7FFFFFFF:
            continue  # no device has such a number (12-bit majors, 20-bit minors)
        checks: list[list[bytes]] = []
        if rule.kind != "a":
            checks.append([_insn(JNE_K, 2, imm=DEV_TYPE[rule.kind])])
        mask = sum(ACCESS[c] for c in rule.access)
        if mask != 7:
            # Asked access must be within the rule's: (asked & ~mask) == 0.
            checks.append([_insn(MOV32_X, 1, 3), _insn(AND32_K, 1, imm=~mask & 7),
                           _insn(JNE_K, 1, imm=0)])
        if rule.major >= 0:
            checks.append([_insn(JNE_K, 4, imm=rule.major)])
        if rule.minor >= 0:
            checks.append([_insn(JNE_K, 5, imm=rule.minor)])
        tail = [_insn(MOV64_K, 0, imm=int(rule.allow)), _insn(EXIT)]
        block: list[bytes] = []
        remaining = sum(len(c) for c in checks) + len(tail)
        for check in checks:
            remaining -= len(check)
            # Each check's last insn jumps past the rest of this rule's block.
            *head, jump = check
            code, regs, _, imm = struct.unpack("<BBhi", jump)
            block += head + [struct.pack("<BBhi", code, regs, remaining, imm)]
        prog += block + tail
    prog += [_insn(MOV64_K, 0, imm=int(default)), _insn(EXIT)]
    return b"".join(prog)


def attach(cgroup_dir: str, rules: list[Device]) -> None:
    """Loads the program and attaches it to the cgroup, where it stays until
    the cgroup is removed."""
    code = compile_rules(*reduce(rules))
    insns = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"Apache-2.0")
    log = ctypes.create_string_buffer(LOG_SIZE)
    attr = ctypes.create_string_buffer(128)
    struct.pack_into("<IIQQIIQ", attr, 0, BPF_PROG_TYPE_CGROUP_DEVICE, len(code) // 8,
                     ctypes.addressof(insns), ctypes.addressof(license_), 1, LOG_SIZE,
                     ctypes.addressof(log))
    prog_fd = bpf(BPF_PROG_LOAD, attr)
    if prog_fd < 0:
        err = ctypes.get_errno()
        detail = log.value.decode(errors="replace").strip().splitlines()
        raise ParacellError(f"loading the devices BPF program: {os.strerror(err)}"
                            + (f" ({detail[-1]})" if detail else ""))
    try:
        dir_fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            attr = ctypes.create_string_buffer(128)
            struct.pack_into("<IIII", attr, 0, dir_fd, prog_fd, BPF_CGROUP_DEVICE,
                             BPF_F_ALLOW_MULTI)
            if bpf(BPF_PROG_ATTACH, attr) < 0:
                err = ctypes.get_errno()
                raise ParacellError(f"attaching the devices BPF program to {cgroup_dir}: "
                                    f"{os.strerror(err)}")
        finally:
            os.close(dir_fd)
    finally:
        os.close(prog_fd)
