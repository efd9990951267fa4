"""Catalogs of the shipped overlays and checks on the release trees they patch.

- `RELEASES`: the vLLM releases the overlay tests cover (issue 2), each a real sdist from PyPI.
- `shipped_catalog_dir(dest, ids, variants, copies)`: a catalog dir holding only the named shipped
  overlays (symlinks), plain copies of them (`copies`: a test may break them) or mutated copies
  (`variants`: id -> mutator); `shipped_catalog(...)`: the same, located as a Catalog.
- `bump_version(n, snippet_line)`, `set_edit_field(edit, key, value)`: mutators (sentinel
  upgrade; e.g. position: after).
- `file_hashes(root, rels)`, `tree_hashes(root, without_state)`, `targets_of(overlays)`: byte-level checks.
- `edit_one_char_after_sentinel(text, overlay_id)`: a hand edit inside our block.
- `slim_root(version, dest)`: a writable root with only the overlays' target files (fast).
"""

from __future__ import annotations

import ast
import hashlib
import os
import shutil
from pathlib import Path
from collections.abc import Callable, Iterable, Mapping

import yaml

from manager.catalog import Catalog

from . import SHIPPED_OVERLAYS

# The releases the overlay tests cover (issue 2): every one is a real sdist from PyPI. 0.19.1 (issue 24):
# the last vLLM on PyPI whose CUDA binaries carry sm_70 code, so the V100 engine's release.
RELEASES = ["0.19.0", "0.19.1", "0.20.0", "0.26.0", "0.30.0", "0.31.0", "0.33.0"]

PR40886 = "vllm-pr40886-gemma4-awq-moe-keys"
CONVERTOR = "gemma4-convertor-per-layer"
DYNAMO = "dynamo-dict-caches"
# The three Python overlays of issue 2 (the catalog may hold others, e.g. kernel overlays).
OVERLAY_IDS = (DYNAMO, CONVERTOR, PR40886)

GEMMA4 = "vllm/model_executor/models/gemma4.py"
CONVERTOR_PY = "vllm/transformers_utils/model_arch_config_convertor.py"
CUDA_PY = "vllm/platforms/cuda.py"
TARGETS = (CUDA_PY, CONVERTOR_PY, GEMMA4)

Mutator = Callable[[dict, Path], None]  # (raw manifest dict, copied overlay dir) -> None, edits in place


def shipped_catalog_dir(dest: Path, ids: Iterable[str] = OVERLAY_IDS, variants: Mapping[str, Mutator] | None = None,
                     copies: Iterable[str] = ()) -> Path:
    """A catalog directory at `dest` with only `ids`: symlinks to the shipped overlays, plain copies
    for `copies` (so a test may break them), mutated copies for `variants`."""
    variants = dict(variants or {})
    copies = set(copies)
    overlays = dest / "overlays"
    overlays.mkdir(parents=True, exist_ok=True)
    for oid in ids:
        src = SHIPPED_OVERLAYS / oid
        link = overlays / oid
        if oid in copies:
            shutil.copytree(src, link)
            continue
        if oid not in variants:
            link.symlink_to(src, target_is_directory=True)
            continue
        shutil.copytree(src, link, ignore=shutil.ignore_patterns("__pycache__"))
        manifest = link / "overlay.yaml"
        raw = yaml.safe_load(manifest.read_text())
        variants[oid](raw, link)
        manifest.write_text(yaml.safe_dump(raw, sort_keys=False))
    return dest


def shipped_catalog(dest: Path, ids: Iterable[str] = OVERLAY_IDS, variants: Mapping[str, Mutator] | None = None) -> Catalog:
    """shipped_catalog_dir(), located as a Catalog."""
    return Catalog.locate(shipped_catalog_dir(dest, ids, variants))


SNIPPET_REVISION_LINE = "_overlay_snippet_revision = 2"


def bump_version(version: int | None = None, snippet_line: str = SNIPPET_REVISION_LINE) -> Mutator:
    """Mutator: set sentinel_version (default: the shipped one + 1) and put `snippet_line`
    first in every insert snippet."""

    def mutate(raw: dict, odir: Path) -> None:
        raw["sentinel_version"] = version if version is not None else int(raw["sentinel_version"]) + 1
        for edit in raw.get("edits", []):
            if edit.get("kind") == "insert":
                snippet = odir / edit["code"]
                snippet.write_text(snippet_line + "\n" + snippet.read_text())

    return mutate


def set_edit_field(name: str, key: str, value) -> Mutator:
    """Mutator: set one field of the edit called `name` (e.g. position: after)."""

    def mutate(raw: dict, odir: Path) -> None:
        edits = [e for e in raw.get("edits", []) if e.get("name") == name]
        assert len(edits) == 1, f"edit {name!r} not found once in {odir}"
        edits[0][key] = value

    return mutate


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_hashes(root: Path, rels: Iterable[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for rel in sorted(set(rels)):
        p = Path(root) / rel
        out[rel] = sha256(p.read_bytes()) if p.exists() else None
    return out


def tree_hashes(root: Path, *, without_state: bool = False) -> dict[str, str]:
    """sha256 of every file under root (relative path -> hash), symlinks included by target;
    `without_state`: the overlay tool's state directory (.overlay-manager/) left out."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        if without_state and Path(dirpath) == Path(root) and ".overlay-manager" in dirnames:
            dirnames.remove(".overlay-manager")
        for f in filenames:
            p = Path(dirpath) / f
            out[str(p.relative_to(root))] = sha256(p.read_bytes())
    return out


def targets_of(overlays) -> list[str]:
    return sorted({t for o in overlays for t in o.manifest.targets})


def edit_one_char_after_sentinel(text: str, overlay_id: str, edit: str | None = None) -> str:
    """Swap the case of the last lowercase letter of the first code line under our first
    sentinel (of `edit`, when given). The result still parses: a hand edit, not a syntax error."""
    lines = text.splitlines(keepends=True)
    marker = f"# overlay:{overlay_id} v"
    for i, line in enumerate(lines):
        body = line.strip()
        if body.startswith(marker) and (edit is None or body.split()[3] == edit):
            break
    else:
        raise LookupError(f"no sentinel of {overlay_id} {edit or ''}")
    for j in range(i + 1, len(lines)):
        code = lines[j].strip()
        if code and not code.startswith("#"):
            break
    line = lines[j]
    k = max(idx for idx, ch in enumerate(line) if ch.islower())
    lines[j] = line[:k] + line[k].upper() + line[k + 1 :]
    new = "".join(lines)
    ast.parse(new)  # still valid Python
    return new


def slim_root(version: str, dest: Path, rels: Iterable[str] = TARGETS) -> Path:
    """A writable package root holding only `rels` (plus the dist-info) of a real release.

    The overlays read and write nothing else, so this stands in for `copy_release` where a
    test needs many fresh trees; full copies are used where the whole tree matters.
    """
    from manager.releases import pristine_tree

    src = pristine_tree(version)
    dest = Path(dest)
    for info in src.glob("vllm-*.dist-info"):
        shutil.copytree(info, dest / info.name)
    for rel in rels:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, dest / rel)
        (dest / rel).chmod(0o644)
    return dest
