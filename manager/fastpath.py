"""The container-restart path of `overlay apply`, in the standard library only.

Every container start runs `overlay apply IDS...` before `vllm serve`. When the ledger
written by the last apply still matches (same package version, no interrupted apply, every
selected overlay directory's digest and every target file's sha256 as recorded, every
status one that apply leaves alone), there is nothing to do, and importing click, rich,
pydantic and libcst just to find that out would cost ~10x a regex patcher's no-op. This
module decides that case before the CLI is imported; anything else falls through to
`manager.cli.main`, which makes the same decision again with the full engine.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import sys
from pathlib import Path

# apply skips these: the overlay needs nothing written (when its ids were named, a
# superseded/missing-target overlay is an error, so the full CLI must report it)
_QUIET = {"applied", "upstream", "not-applicable"}
_QUIET_UNNAMED = _QUIET | {"superseded", "missing-target"}


def overlay_digest(overlay_dir: Path) -> str:
    """sha256 over an overlay directory: the manifest and every file it may read."""
    h = hashlib.sha256()
    for p in sorted(overlay_dir.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(overlay_dir)).encode() + b"\0")
            h.update(p.read_bytes() + b"\0")
    return h.hexdigest()


def _file_sha(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except (FileNotFoundError, IsADirectoryError):
        return "absent"


def _parse(argv: list[str]) -> tuple[str | None, str | None, list[str]] | None:
    """`[--catalog DIR] apply [IDS...] [--root DIR]` -> (catalog, root, ids); None otherwise."""
    catalog = root = None
    rest = list(argv)
    if rest[:1] == ["--catalog"] and len(rest) >= 2:
        catalog, rest = rest[1], rest[2:]
    elif rest and rest[0].startswith("--catalog="):
        catalog, rest = rest[0].split("=", 1)[1], rest[1:]
    if rest[:1] != ["apply"]:
        return None
    ids: list[str] = []
    it = iter(rest[1:])
    for arg in it:
        if arg == "--root":
            root = next(it, None)
            if root is None:
                return None
        elif arg.startswith("--root="):
            root = arg.split("=", 1)[1]
        elif arg.startswith("-"):
            return None  # --dry-run, --json, --help...: the full CLI
        else:
            ids.append(arg)
    return catalog, root, ids


def _catalog_dir(arg: str | None) -> Path | None:
    raw = arg or os.environ.get("OVERLAY_CATALOG")
    if raw:
        return Path(raw).expanduser().resolve()
    from .catalog import default_catalog_dir

    return default_catalog_dir()


def _root(arg: str | None) -> Path | None:
    if arg:
        return Path(arg).expanduser().resolve()
    spec = importlib.machinery.PathFinder.find_spec("vllm", sys.path)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).resolve().parent


def nothing_to_do(argv: list[str]) -> list[tuple[str, str]] | None:
    """[(overlay id, status)] when `overlay <argv>` is an apply the ledger proves is a no-op."""
    parsed = _parse(argv)
    if parsed is None:
        return None
    catalog_arg, root_arg, ids = parsed
    catalog, root = _catalog_dir(catalog_arg), _root(root_arg)
    if catalog is None or root is None:
        return None
    state = root / ".overlay-manager"
    try:
        ledger = json.loads((state / "ledger.json").read_text())
    except (OSError, ValueError):
        return None
    if (state / "journal.json").exists():
        return None
    from .overlays.root import package_version

    if ledger.get("package_version") != package_version(root):
        return None
    overlays_dir = catalog / "overlays"
    try:
        every = sorted(p.name for p in overlays_dir.iterdir() if (p / "overlay.yaml").is_file()
                       and not p.name.startswith((".", "_")))
    except OSError:
        return None
    records = ledger.get("overlays", {})
    wanted = list(ids) if ids else every
    # a named overlay brings the ones it requires (as recorded with it)
    i = 0
    while i < len(wanted):
        rec = records.get(wanted[i])
        if rec is None or wanted[i] not in every:
            return None
        wanted.extend(r for r in rec.get("requires", []) if r not in wanted)
        i += 1
    quiet = _QUIET if ids else _QUIET_UNNAMED
    observed = ledger.get("observed", {})
    out = []
    for oid in wanted:
        rec = records[oid]
        if rec.get("status") not in quiet or rec.get("digest") != overlay_digest(overlays_dir / oid):
            return None
        for t in rec.get("targets", []):
            want = observed.get(t["path"])
            if want is None or _file_sha(root / t["path"]) != want:
                return None
        out.append((oid, rec["status"]))
    return out


def main() -> None:
    argv = sys.argv[1:]
    try:
        done = nothing_to_do(argv)
    except Exception:  # noqa: BLE001 - any doubt: let the full CLI decide (and report)
        done = None
    if done is not None:
        for oid, st in done:
            sys.stderr.write(f"{st:>12}  {oid}\n")
        sys.stderr.write(f"{'identical':>12}  nothing to do (ledger hashes match)\n")
        sys.exit(0)
    from .cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
