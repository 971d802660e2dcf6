"""The operator settings as the documentation states them, read from the
docs themselves, so that code and docs cannot drift apart."""

from __future__ import annotations

import json
import re

from tests.conftest import REPO

TABLE_ROW = re.compile(r'^\| `"([a-z_]+)"` \|.*\| `([^`]+)` \|$')
QUOTED_KEY = re.compile(r'`"([a-z_]+)"')


def documented_settings() -> dict[str, object]:
    """Key -> example value, from the table in docs/runtime.md."""
    rows = [TABLE_ROW.match(line) for line in
            (REPO / "docs" / "runtime.md").read_text().splitlines()]
    return {m.group(1): json.loads(m.group(2)) for m in rows if m}


def keys_named_in_prose() -> set[str]:
    """Every `"key"` on a line of the README or docs/ that speaks of the file."""
    found = set()
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for line in doc.read_text().splitlines():
            if "paracell/config.json" in line or "PARACELL_CONFIG" in line or \
                    line.startswith("That file also takes"):
                found |= set(QUOTED_KEY.findall(line))
    return found
