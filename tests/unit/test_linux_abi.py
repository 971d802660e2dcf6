"""paracell.linux is the one home of Linux ABI numbers, and they come from
the build machine's headers: checked against the kernel itself, and against
any module that types one again."""

from __future__ import annotations

import ast
import ctypes
import errno
import os
import platform
import re
from pathlib import Path

import pytest

from paracell import linux

PACKAGE = Path(linux.__file__).parent
ABI_NAME = re.compile(r"^((MS|MNT|MOUNT_ATTR|CLONE|NS_GET|PR|SYS|BPF|AT|IFF|TUN)_|IFNAMSIZ$)")


def _is_number(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int)
    if isinstance(node, ast.UnaryOp):
        return _is_number(node.operand)
    return isinstance(node, ast.BinOp) and _is_number(node.left) and _is_number(node.right)


def test_no_other_module_types_a_linux_abi_number():
    typed = []
    for path in PACKAGE.rglob("*.py"):
        if path == Path(linux.__file__) or "_gen" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Assign):
                continue
            targets = [t for target in node.targets
                       for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            for target, value in zip(targets, values, strict=False):
                if isinstance(target, ast.Name) and ABI_NAME.match(target.id) \
                        and _is_number(value):
                    typed.append(f"{path.relative_to(PACKAGE)}: {target.id}")
    assert typed == []


def test_the_syscall_numbers_are_this_machines():
    # A syscall the number names, with arguments it refuses in its own way:
    # the wrong number would give ENOSYS or another call's error.
    libc = linux.libc()
    ctypes.set_errno(0)
    assert libc.syscall(linux.SYS_pivot_root, b"/nonexistent-a", b"/nonexistent-b") == -1
    assert ctypes.get_errno() == errno.ENOENT
    assert linux.make_readonly(b"/nonexistent-paracell") == -1
    assert ctypes.get_errno() == errno.ENOENT
    attr = ctypes.create_string_buffer(128)
    assert linux.bpf(0xFFFF, attr) == -1  # no such bpf command
    assert ctypes.get_errno() == errno.EINVAL


def test_namespace_flags_name_the_kernels_namespaces():
    # NS_GET_NSTYPE on /proc/self/ns/X answers X's CLONE_NEW* flag.
    import fcntl

    for name, flag in (("net", linux.CLONE_NEWNET), ("mnt", linux.CLONE_NEWNS),
                       ("pid", linux.CLONE_NEWPID), ("uts", linux.CLONE_NEWUTS),
                       ("ipc", linux.CLONE_NEWIPC), ("cgroup", linux.CLONE_NEWCGROUP)):
        fd = os.open(f"/proc/self/ns/{name}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            assert fcntl.ioctl(fd, linux.NS_GET_NSTYPE) == flag, name
        finally:
            os.close(fd)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64's own numbers")
def test_x86_64_numbers():
    assert (linux.SYS_bpf, linux.SYS_pivot_root, linux.SYS_mount_setattr) == (321, 155, 442)
