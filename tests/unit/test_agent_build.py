"""The guest build: what goes into the initramfs key, and how guest folders add
programs to the initramfs. Runs on small fake trees, plus one check that the
real guest/agent/programs still names /init."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import pytest

from paracell.errors import ParacellError
from paracell.guest import artifacts

HELLO = "int main(void) { return 0; }\n"


def tree(root: Path) -> Path:
    files = {
        "proto/agent_proto.h": "#define PC_X 1\n",
        "guest/agent/agent.c": '#include "agent_proto.h"\n#include "a.h"\n' + HELLO,
        "guest/agent/a.h": "#define A 1\n",
        "guest/agent/programs": "# comment\n\ninit *.c  # trailing comment\n",
        "guest/kernel/series": "# none\n",
        "guest/kernel/paracell.config": "CONFIG_X=y\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_key_does_not_depend_on_where_the_checkout_is(tmp_path):
    a, b = tree(tmp_path / "one"), tmp_path / "elsewhere" / "two"
    shutil.copytree(a, b)
    assert artifacts.initramfs_key(a) == artifacts.initramfs_key(b)


@pytest.mark.parametrize("name, changes", [
    ("guest/agent/agent.c", True),
    ("guest/agent/a.h", True),
    ("guest/agent/programs", True),
    ("guest/agent/tests/case.c", True),
    ("guest/xgate/lib/libxgate.c", True),
    ("guest/xgate/0001-xgate.patch", True),
    ("guest/pager/0001-pager.patch", True),
    ("guest/README", True),
    ("proto/agent_proto.h", True),
    ("proto/new_proto.h", True),
    ("guest/kernel/paracell.config", False),  # the kernel key's
    ("guest/kernel/build.sh", False),
    ("guest/agent/.agent.c.swp", False),
    ("guest/agent/__pycache__/x.pyc", False),
])
def test_key_follows_every_guest_source(tmp_path, name, changes):
    root = tree(tmp_path)
    before = artifacts.initramfs_key(root)
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text((path.read_text() if path.exists() else "") + "/* edit */\n")
    assert (artifacts.initramfs_key(root) != before) is changes


def test_folders_list_their_programs(tmp_path):
    root = tree(tmp_path)
    xgate = root / "guest" / "xgate"
    (xgate / "lib").mkdir(parents=True)
    (xgate / "selftest").mkdir()
    (xgate / "lib" / "libxgate.c").write_text("int xgate(void) { return 1; }\n")
    (xgate / "selftest" / "main.c").write_text("int xgate(void);\n" + HELLO)
    (xgate / "programs").write_text("usr/bin/xgate-selftest lib/*.c selftest/main.c\n")
    (root / "guest" / "pager").mkdir()
    (root / "guest" / "pager" / "0001-pager.patch").write_text("--- a\n")
    assert artifacts.guest_programs(root) == [
        artifacts.GuestProgram("init", "guest/agent", ("guest/agent/agent.c",)),
        artifacts.GuestProgram("usr/bin/xgate-selftest", "guest/xgate",
                               ("guest/xgate/lib/libxgate.c", "guest/xgate/selftest/main.c")),
    ]


@pytest.mark.parametrize("line", [
    "/init *.c", "../init *.c", "bin/../../x *.c", ". *.c", "init", "dev *.c", "dev/console *.c",
    "x nothing-matches.c", "x ../agent/*.c", "x /etc/passwd", "init *.c",
])
def test_bad_program_lines_are_refused(tmp_path, line):
    root = tree(tmp_path)
    (root / "guest" / "xgate").mkdir()
    (root / "guest" / "xgate" / "programs").write_text(f"# first\n{line}\n")
    with pytest.raises(ParacellError, match=r"^guest/xgate/programs:2: "):
        artifacts.guest_programs(root)


def test_build_puts_each_program_at_its_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PARACELL_CACHE", str(tmp_path / "cache"))
    root = tree(tmp_path / "src")
    (root / "guest" / "xgate").mkdir()
    (root / "guest" / "xgate" / "t.c").write_text(HELLO)
    (root / "guest" / "xgate" / "programs").write_text("usr/lib/xgate/t t.c\n")
    out = artifacts.build_initramfs(artifacts.initramfs_key(root), root)
    data = out.read_bytes()
    names, modes = [], {}
    pos = 0
    while True:  # newc: 110-byte header, name, file data, each padded to 4
        head = data[pos:pos + 110]
        mode, size, namesize = (int(head[6 + 8 * i:14 + 8 * i], 16) for i in (1, 6, 11))
        name = data[pos + 110:pos + 110 + namesize - 1].decode()
        pos = (pos + 110 + namesize + 3) & ~3
        pos = (pos + size + 3) & ~3
        if name == "TRAILER!!!":
            break
        names.append(name)
        modes[name] = mode
    assert names == ["dev", "proc", "sys", "tmp", "dev/console", "init",
                     "usr", "usr/lib", "usr/lib/xgate", "usr/lib/xgate/t"]
    assert stat.S_ISREG(modes["usr/lib/xgate/t"]) and stat.S_ISDIR(modes["usr/lib"])
    assert str(tmp_path) not in data.decode("latin-1")


def test_compile_errors_name_the_folder_and_the_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PARACELL_CACHE", str(tmp_path / "cache"))
    root = tree(tmp_path / "src")
    (root / "guest" / "agent" / "agent.c").write_text("int main(void) { return undeclared; }\n")
    with pytest.raises(ParacellError, match=r"building /init from guest/agent/ failed: .*"
                                            r"undeclared"):
        artifacts.build_initramfs(artifacts.initramfs_key(root), root)


def test_the_real_agent_is_init():
    programs = artifacts.guest_programs()
    init = [p for p in programs if p.dest == "init"]
    assert len(init) == 1 and init[0].folder == "guest/agent"
    assert "guest/agent/agent.c" in init[0].sources
