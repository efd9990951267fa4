"""vLLM's own test files, from a release's sdist: extracted once, picked by what they import, amended.

Layout (under manager.releases.cache_dir()):
    upstream-tests/trees/X/tests/...      the sdist's `tests/` and `pyproject.toml` (its pytest markers), extracted
                                          once (`.complete` last, under a file lock); read-only use
Nothing of vLLM's is committed here: the files come from the release's sdist at run time, like the catalog's
release-file edits.

`select_files(tests, targets)`: a test file is picked for an overlay when it imports one of the overlay's targets
(statically, with `ast`): `import vllm.a.b`, `from vllm.a.b import X`, `from vllm.a import b`, or a package whose
`__init__.py` imports the target at module level (`from vllm.model_executor.models import ...` runs its registry),
with function-level imports of the test file counted too.

`add_example_models(tests, entries)`: an architecture an overlay ports from a later release has no entry in the
older release's `tests/models/registry.py`; the entry is read from the later release's file (sha256-checked) and
inserted into the same dict of the older one.
"""

from __future__ import annotations

import ast
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterable, Mapping, Sequence

from ..errors import UpstreamError
from ..releases import cache_dir, sdist


def sdist_tests(version: str) -> Path:
    """The extraction root of vLLM `version`'s sdist test tree (holding `tests/` and `pyproject.toml`)."""
    import shutil
    import tarfile
    import tempfile

    from filelock import FileLock

    base = cache_dir() / "upstream-tests" / "trees"
    root = base / version
    if (root / ".complete").is_file():
        return root
    archive = sdist(version)
    base.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root) + ".lock"):
        if (root / ".complete").is_file():
            return root
        shutil.rmtree(root, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{version}.", dir=base))
        top = f"vllm-{version}/"
        with tarfile.open(archive, "r:gz") as tar:
            members = [m for m in tar.getmembers()
                       if (m.name.startswith(top + "tests/") or m.name == top + "pyproject.toml")
                       and (m.isfile() or m.isdir())]
            if not any(m.name.startswith(top + "tests/") for m in members):
                raise UpstreamError(f"{archive}: no {top}tests/ inside")
            for m in members:
                m.name = m.name[len(top):]
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tmp, members=members, filter="data")
            else:  # Python < 3.10.12 / 3.11.4
                tar.extractall(tmp, members=members)
        (tmp / ".complete").write_text(version + "\n")
        os.replace(tmp, root)
    return root


def module_name(target: str) -> str:
    """`vllm/a/b.py` -> `vllm.a.b`; `vllm/a/__init__.py` -> `vllm.a`."""
    mod = target[:-3] if target.endswith(".py") else target
    parts = mod.split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imported(tree: ast.Module, modname: str | None, is_pkg: bool, top_level: bool) -> set[str]:
    """Dotted names an import statement may load: `from a import b` gives `a` and `a.b`."""
    out: set[str] = set()
    nodes = tree.body if top_level else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if modname is None:
                    continue  # a test file's `from ..utils import`: the test tree, not vLLM
                base = modname.split(".") if is_pkg else modname.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def package_imports(engine_root: Path) -> dict[str, set[str]]:
    """vLLM package -> what its `__init__.py` imports at module level (in the engine tree under test)."""
    out: dict[str, set[str]] = {}
    for init in (engine_root / "vllm").rglob("__init__.py"):
        name = ".".join(init.relative_to(engine_root).parent.parts)
        try:
            out[name] = _imported(ast.parse(init.read_bytes()), name, True, True)
        except (SyntaxError, ValueError):
            continue
    return out


@dataclass(frozen=True)
class PickedFile:
    path: str  # relative to the test tree's root: tests/...
    overlays: tuple[str, ...]  # the overlays whose targets it imports
    sha256: str


def select_files(tests: Path, targets: Mapping[str, Sequence[str]], engine_root: Path) -> list[PickedFile]:
    """The test files under `tests/tests` importing a target; `targets`: overlay id -> its target paths."""
    by_module: dict[str, set[str]] = {}
    for oid, paths in targets.items():
        for t in paths:
            by_module.setdefault(module_name(t), set()).add(oid)
    pkgs = package_imports(engine_root)
    memo: dict[str, frozenset[str]] = {}

    def reach(mod: str, seen: frozenset[str] = frozenset()) -> frozenset[str]:
        if mod in memo:
            return memo[mod]
        hit = set(by_module.get(mod, ()))
        if mod in pkgs and mod not in seen:
            for sub in pkgs[mod]:
                if sub == "vllm" or sub.startswith("vllm."):
                    hit |= reach(sub, seen | {mod})
        memo[mod] = frozenset(hit)
        return memo[mod]

    picked = []
    for path in sorted((tests / "tests").rglob("*.py")):
        if not (path.name.startswith("test_") or path.name.endswith("_test.py")):
            continue
        data = path.read_bytes()
        try:
            tree = ast.parse(data)
        except (SyntaxError, ValueError):
            continue
        hit: set[str] = set()
        for mod in _imported(tree, None, False, False):
            if mod == "vllm" or mod.startswith("vllm."):
                hit |= reach(mod)
        if hit:
            picked.append(PickedFile(path.relative_to(tests).as_posix(), tuple(sorted(hit)),
                                     hashlib.sha256(data).hexdigest()))
    return picked


# ------------------------------------------------------------------------------------ example-model entries


@dataclass(frozen=True)
class ExampleEntry:
    architecture: str
    release: str  # the later release whose test tree has the entry
    path: str  # e.g. tests/models/registry.py
    sha256: str  # of that file in that release
    overlay: str


def _dict_entries(tree: ast.Module) -> dict[str, tuple[str, ast.Dict]]:
    """string key -> (the module-level dict's name, the dict) for every `NAME = {...}` of the file."""
    out: dict[str, tuple[str, ast.Dict]] = {}
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        names = ([t.id for t in node.targets if isinstance(t, ast.Name)] if isinstance(node, ast.Assign)
                 else [node.target.id] if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                 else [])
        if isinstance(value, ast.Dict) and names:
            for key in value.keys:
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    out.setdefault(key.value, (names[0], value))
    return out


def _segment(text: str, node: ast.AST) -> str:
    seg = ast.get_source_segment(text, node)
    if seg is None:
        raise UpstreamError("no source segment")  # pragma: no cover - ast always has positions here
    return seg


def example_entry_text(entry: ExampleEntry) -> tuple[str, str]:
    """(dict name, `"Arch": value`) of the entry in the later release's file, the file's sha256 checked."""
    src = sdist_tests(entry.release) / entry.path
    try:
        data = src.read_bytes()
    except FileNotFoundError:
        raise UpstreamError(f"vLLM {entry.release}: {entry.path}: no such file in the sdist's tests") from None
    got = hashlib.sha256(data).hexdigest()
    if got != entry.sha256:
        raise UpstreamError(f"{entry.overlay}: upstream_tests.example_models: vLLM {entry.release} {entry.path}: "
                            f"sha256 {got[:16]}... does not match the pinned {entry.sha256[:16]}...")
    text = data.decode()
    found = _dict_entries(ast.parse(text)).get(entry.architecture)
    if found is None:
        raise UpstreamError(f"{entry.overlay}: vLLM {entry.release} {entry.path} has no entry "
                            f"{entry.architecture!r}")
    name, d = found
    i = next(i for i, k in enumerate(d.keys) if isinstance(k, ast.Constant) and k.value == entry.architecture)
    return name, f"{_segment(text, d.keys[i])}: {_segment(text, d.values[i])}"  # type: ignore[arg-type]


def add_example_models(tests: Path, entries: Iterable[ExampleEntry]) -> list[str]:
    """Insert each entry into the same-named dict of `tests/<path>` (the file replaced, a new inode: the tree may
    be a hard-link copy); an architecture the file already has is left alone. Returns the architectures added."""
    added = []
    for entry in entries:
        dest = tests / entry.path
        text = dest.read_text()
        if entry.architecture in _dict_entries(ast.parse(text)):
            continue
        name, line = example_entry_text(entry)
        target = next((d for n, d in _dict_entries_by_name(ast.parse(text)).items() if n == name), None)
        if target is None:
            raise UpstreamError(f"{entry.overlay}: {dest.name} of the release under test has no dict {name}")
        lines = text.splitlines(keepends=True)
        # before the closing brace of the dict: its last line (`}` alone, as vLLM's formatter writes it)
        end = target.end_lineno - 1  # type: ignore[operator]
        if lines[end].strip() != "}":
            raise UpstreamError(f"{dest}: {name} does not end with a '}}' line")
        lines.insert(end, f"    {line},  # added by overlay-manager: {entry.overlay}, from vLLM {entry.release}\n")
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}")
        tmp.write_text("".join(lines))
        os.replace(tmp, dest)
        added.append(entry.architecture)
    return added


def _dict_entries_by_name(tree: ast.Module) -> dict[str, ast.Dict]:
    out: dict[str, ast.Dict] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Dict) and isinstance(node.target, ast.Name):
            out[node.target.id] = node.value
    return out

