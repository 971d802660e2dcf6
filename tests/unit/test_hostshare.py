"""The host share's layout (paracell/vmm/hostshare.py): each bind source at
SLOT/NAME, NAME its own name made safe for the launch spec, with real bind
mounts on this host; cleanup never deletes what was bound."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from paracell.errors import ParacellError
from paracell.vmm import hostshare


@pytest.mark.parametrize("source, name", [
    ("/etc/hosts", "hosts"),
    ("/srv/with space", "with space"),
    ("/srv/tab\tand\nnewline\x1fsep", "tab_and_newline_sep"),
    (os.fsdecode(b"/srv/not-utf8-\xff"), "not-utf8-_"),
    ("/", "_"),
    ("/srv/..", "_"),
    ("/srv/" + "é" * 200, "é" * 127),  # 255 bytes at most, never half a character
])
def test_a_bind_is_at_its_slot_under_its_own_name_made_safe(source: str, name: str):
    assert hostshare.bind_entry("7", Path(source)) == f"7/{name}"


def test_binds_of_files_and_directories_of_one_name_stay_apart(tmp_path: Path):
    sources = [tmp_path / "a" / "data", tmp_path / "b" / "data", tmp_path / "c" / "data"]
    sources[0].mkdir(parents=True)
    sources[1].mkdir(parents=True)
    sources[2].parent.mkdir()
    for i, source in enumerate(sources[:2]):
        (source / "which").write_text(f"{i}\n")
    sources[2].write_text("a file\n")
    share = tmp_path / "share"
    entries = [hostshare.bind_entry(str(i), s) for i, s in enumerate(sources)]
    assert entries == ["0/data", "1/data", "2/data"]
    hostshare.mount_binds(share, list(zip(sources, entries, strict=True)))
    try:
        assert [(share / e / "which").read_text() for e in entries[:2]] == ["0\n", "1\n"]
        assert (share / entries[2]).read_text() == "a file\n"
    finally:
        hostshare.remove_tree(share)
    assert not share.exists()
    assert [(s / "which").read_text() for s in sources[:2]] == ["0\n", "1\n"]
    assert sources[2].read_text() == "a file\n"


@pytest.mark.parametrize("entry", ["../x", "0", "0/..", "0/a/b", "x/a", "\u0663/a", "0/a\x1fb", ""])
def test_an_entry_not_of_bind_entrys_shape_is_refused_and_leaves_nothing(
        tmp_path: Path, entry: str):
    source = tmp_path / "data"
    source.mkdir()
    (source / "keep").write_text("keep me")
    with pytest.raises(ParacellError, match="invalid host share entry"):
        hostshare.mount_binds(tmp_path / "share", [(source, entry)])
    assert not (tmp_path / "share").exists() and not (tmp_path / "x").exists()
    assert (source / "keep").read_text() == "keep me"
