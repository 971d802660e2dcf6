"""One import order for the whole package (docs/architecture.md, "Layers"),
held by the code: every module sits in a layer and imports only from its
own layer or those below it, counting imports inside functions and under
TYPE_CHECKING; and no modules import each other, however indirectly. A
planted upward import inside a function, and a planted cycle, each fail
the checker (the last two tests), so it can fail."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import paracell

PACKAGE = Path(paracell.__file__).parent

# Lowest first. A module belongs to the layer of the longest prefix that
# names it (a prefix is a module or a package and everything in it).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("paracell", "paracell.errors", "paracell.record", "paracell.wire",
              "paracell.speckeys", "paracell.linux", "paracell.procfs", "paracell.unixsock",
              "paracell.jsonfile", "paracell.safefs", "paracell.reclaim", "paracell.log")),
    ("settings", ("paracell.settings", "paracell.globalopts")),
    ("host files", ("paracell.images", "paracell.guest", "paracell.pager")),
    ("vmm", ("paracell.vmm",)),
    ("vmm backends", ("paracell.vmm.qemu", "paracell.vmm.libvirt")),
    ("vmm registry", ("paracell.vmm.backends",)),
    ("net", ("paracell.net",)),
    ("xgate", ("paracell.xgate",)),
    ("runtime base", ("paracell.runtime", "paracell.runtime.configcheck",
                      "paracell.runtime.poolwire")),
    ("runtime.state", ("paracell.runtime.state",)),
    ("runtime.context", ("paracell.runtime.context",)),
    ("runtime.inguest", ("paracell.runtime.inguest",)),
    ("runtime.bundle", ("paracell.runtime.bundle",)),
    ("runtime.host", ("paracell.runtime.host",)),
    ("runtime.agent", ("paracell.runtime.agent",)),
    ("runtime.snapshots", ("paracell.runtime.snapshots",)),
    ("runtime.vm", ("paracell.runtime.vm",)),
    ("runtime.pod", ("paracell.runtime.pod",)),
    ("runtime.verbs", ("paracell.runtime.verbs",)),
    ("runtime.pool", ("paracell.runtime.pool",)),
    ("clients", ("paracell.sandbox", "paracell.cri", "paracell.shimv2", "paracell.bench",
                 "paracell.demo", "paracell.hostcheck")),
    ("cli", ("paracell.cli",)),
    ("entry", ("paracell.fastpath", "paracell.entry")),
]


def modules(package: Path) -> dict[str, Path]:
    found = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def import_graph(package: Path) -> dict[str, set[str]]:
    """Every module's imports of the package's modules: at the top, inside
    functions, under TYPE_CHECKING, relative or absolute."""
    known = modules(package)

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        home = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = home.split(".")[:len(home.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                # `from X import y` imports module X.y where there is one, else X.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                           for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                resolved = resolve(target) if target.startswith("paracell") else None
                if resolved and resolved != name:
                    graph[name].add(resolved)
    return graph


def layer_of(module: str) -> int | None:
    best, rank = -1, None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), index
    return rank


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in graph.items():
        for target in targets:
            mine, theirs = layer_of(module), layer_of(target)
            if mine is not None and theirs is not None and theirs > mine:
                found.append(f"{module} ({LAYERS[mine][0]}) imports {target} "
                             f"({LAYERS[theirs][0]})")
    return sorted(found)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_module_has_a_layer():
    assert [m for m in modules(PACKAGE) if layer_of(m) is None] == []


def test_no_module_imports_a_layer_above_its_own():
    assert upward_imports(import_graph(PACKAGE)) == []


def test_no_modules_import_each_other():
    assert cycles(import_graph(PACKAGE)) == []


def _planted(tmp_path: Path, where: str, code: str) -> Path:
    copy = tmp_path / "paracell"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    target = copy / where
    target.write_text(target.read_text() + code)
    return copy


def test_an_upward_import_inside_a_function_is_caught(tmp_path):
    copy = _planted(tmp_path, "errors.py",
                    "\n\ndef _planted() -> None:\n    from paracell.cli import main  # noqa\n")
    assert upward_imports(import_graph(copy)) == [
        "paracell.errors (base) imports paracell.cli (cli)"]


def test_a_cycle_is_caught(tmp_path):
    copy = _planted(tmp_path, "jsonfile.py",
                    "\n\ndef _planted() -> None:\n    from paracell import safefs  # noqa\n")
    (copy / "safefs.py").write_text((copy / "safefs.py").read_text()
                                    + "\n\ndef _back() -> None:\n    import paracell.jsonfile\n")
    graph = import_graph(copy)
    assert upward_imports(graph) == []  # one layer: only the cycle check sees it
    assert cycles(graph) == [["paracell.jsonfile", "paracell.safefs"]]
