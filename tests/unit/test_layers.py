"""The layers of paracell/runtime/ (docs/architecture.md), held by the code:
a subpackage imports only those below it, and paracell/vmm no runtime at all."""

from __future__ import annotations

import ast
from pathlib import Path

import paracell

PACKAGE = Path(paracell.__file__).parent
# Lowest first. The modules directly in runtime/ (log, context, configcheck)
# are shared by every layer.
LAYERS = ["state", "inguest", "bundle", "host", "agent", "snapshots", "vm", "pod", "verbs"]


def _imports(top: Path) -> list[tuple[Path, str]]:
    found = []
    for path in top.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.append((path, node.module))
            elif isinstance(node, ast.Import):
                found += [(path, alias.name) for alias in node.names]
    return found


def test_each_runtime_layer_imports_only_the_ones_below_it():
    upward = []
    for layer in LAYERS:
        for path, module in _imports(PACKAGE / "runtime" / layer):
            parts = module.split(".")
            if parts[:2] != ["paracell", "runtime"] or len(parts) < 3:
                continue
            other = parts[2]
            if other in LAYERS and LAYERS.index(other) > LAYERS.index(layer):
                upward.append(f"{path.relative_to(PACKAGE)} imports {module}")
    assert upward == []


def test_every_runtime_subpackage_has_its_place():
    subpackages = {p.name for p in (PACKAGE / "runtime").iterdir()
                   if p.is_dir() and (p / "__init__.py").exists()}
    assert subpackages == set(LAYERS)


def test_the_vmm_never_imports_the_runtime():
    assert [f"{p.relative_to(PACKAGE)}: {m}" for p, m in _imports(PACKAGE / "vmm")
            if m.startswith("paracell.runtime")] == []
