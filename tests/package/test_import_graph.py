"""The package's import graph (read with `ast`, nothing imported): no circle, and no library
module reaches the entry point (`manager.fastpath`, `manager.cli`)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import REPO_ROOT

PKG = REPO_ROOT / "manager"
ENTRY = ("manager.fastpath", "manager.cli", "manager.__main__")  # entry points


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _targets(mod: str, path: Path, node: ast.Import | ast.ImportFrom, mods: dict[str, Path]) -> list[str]:
    """The modules an import statement executes (lazy imports inside functions included)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        if node.level > 1:
            base = base[: len(base) - (node.level - 1)]
        prefix = ".".join((base if node.level else []) + ([node.module] if node.module else []))
        names = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in mods else prefix for a in node.names]
    out = []
    for name in names:
        while name not in mods and "." in name:
            name = name.rsplit(".", 1)[0]
        if name not in mods:
            continue  # not ours
        parts = name.split(".")
        # importing a.b.c runs a/__init__ and a/b/__init__ first (those above the importer are already running)
        out += [".".join(parts[:k]) for k in range(1, len(parts) + 1)
                if not (mod == ".".join(parts[:k]) or mod.startswith(".".join(parts[:k]) + "."))]
    return out


def _type_only(tree: ast.AST) -> set[int]:
    """ids of the imports under `if TYPE_CHECKING:` (annotations only: never executed)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return out


def _own_submodule_imports(tree: ast.AST) -> set[int]:
    """ids of `from .sub import name` statements (a package __init__ naming its own submodules)."""
    return {id(n) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module}


def import_graph(type_only: bool = False) -> dict[str, set[str]]:
    """module -> the modules of the package it imports (at module level or inside functions);
    `type_only`: the imports under `if TYPE_CHECKING:` count too (a layering circle hidden from the interpreter)."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        deps = graph.setdefault(mod, set())
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_only(tree)
        if type_only:  # count them, except a package's mirror of its lazy `__getattr__` exports (its own submodules)
            skip = {i for i in skip if path.name == "__init__.py"} & _own_submodule_imports(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skip:
                deps.update(t for t in _targets(mod, path, node, mods) if t != mod)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_has_no_circle():
    assert _cycles(import_graph()) == []


def test_the_import_graph_has_no_circle_counting_type_checking_imports():
    """fits and inspect once imported each other, one way under TYPE_CHECKING: layering holds for annotations too."""
    assert _cycles(import_graph(type_only=True)) == []


def test_type_checking_imports_are_edges_of_the_full_graph():
    full, runtime = import_graph(type_only=True), import_graph()
    assert all(runtime[m] <= full[m] for m in runtime)
    assert any(full[m] - runtime[m] for m in runtime)  # the package has TYPE_CHECKING imports: the switch matters


def test_a_circle_would_be_found():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


def test_no_library_module_imports_the_entry_point():
    graph = import_graph()
    below = {m: deps & set(ENTRY) for m, deps in graph.items()
             if not m.startswith(ENTRY) and m != "manager"}
    assert {m: sorted(d) for m, d in below.items() if d} == {}


def test_no_package_module_imports_the_test_support():
    """testing/ and tests/ are not in the wheel: a package module importing them would break every installed copy."""
    bad = []
    for mod, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bad += [f"{mod}: {n}" for n in names if n.split(".")[0] in {"testing", "tests"}]
    assert bad == []


def test_the_leaf_imports_nothing_of_the_package_at_module_level():
    tree = ast.parse((PKG / "state.py").read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not [n for n in top if isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").startswith("manager"))]


def test_no_module_over_400_lines_without_a_written_reason():
    """A module over ~400 lines says why in its docstring (a paragraph starting `Size:`)."""
    long = []
    for mod, path in _modules().items():
        if len(path.read_text().splitlines()) > 400:
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            if "\nSize:" not in "\n" + doc:
                long.append(mod)
    assert long == []


def test_no_shipped_file_cites_the_developers_fact_sheets_or_a_machine_path():
    """Users cannot open ../shared/ or this machine's paths: sources name release files, public addresses or
    documents and tests that ship with the project."""
    root = Path(__file__).resolve().parents[2]
    bad = []
    for top in ("manager", "overlays", "profiles", "compose", "docs", "benchmarks", "README.md"):
        for path in ([root / top] if (root / top).is_file() else (root / top).rglob("*")):
            if not path.is_file() or path.suffix not in {".py", ".yaml", ".yml", ".md", ".sh", ".cu", ".cuh", ".txt", ""}:
                continue
            if "__pycache__" in path.parts or "_catalog" in path.parts:
                continue
            text = path.read_text(errors="replace")
            for needle in ("shared/facts", "/work/shared", "/work/main", "/work/wt"):
                if needle in text:
                    bad.append(f"{path.relative_to(root)}: {needle}")
    assert bad == []
