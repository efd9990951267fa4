"""The container-restart path of `overlay apply`, in the standard library only.

Every container start runs `overlay apply IDS...` before `vllm serve`. When the ledger
written by the last apply still matches (same package version, no interrupted apply, every
selected overlay directory's digest and every target file's sha256 as recorded, every
status one that apply leaves alone), there is nothing to do, and importing click, rich,
pydantic and libcst just to find that out would cost ~10x a regex patcher's no-op. This
module decides that case before the CLI is imported. A first apply with a prepared plan is
replayed next (manager.overlays.plans, standard library only). A plain apply that needs the
engine runs it without the CLI when stderr is not a terminal (`engine_apply`: no click, rich
or other commands' modules); anything else falls through to `manager.cli.main`, which makes
the same decisions again with the full engine.
"""

from __future__ import annotations

import importlib.machinery
import os
import re
import stat
import sys

try:  # the builtin module: no OpenSSL load (~3 ms of every container start)
    from _sha256 import sha256 as _sha256  # type: ignore[import-not-found]  # Python <= 3.11
except ImportError:  # pragma: no cover - Python >= 3.12 names it _sha2
    try:
        from _sha2 import sha256 as _sha256  # type: ignore[import-not-found,no-redef]
    except ImportError:
        from hashlib import sha256 as _sha256  # type: ignore[assignment]

# compiled on first use (re's cache), not at import: the warm no-op never reads a _version.py
_VERSION_RE = r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]"""

# apply skips these: the overlay needs nothing written (when its ids were named, a
# superseded/missing-target overlay is an error, so the full CLI must report it)
_QUIET = {"applied", "upstream", "not-applicable"}
_QUIET_UNNAMED = _QUIET | {"superseded", "missing-target"}


def overlay_digest(overlay_dir: "os.PathLike[str] | str") -> str:
    """sha256 over an overlay directory: the manifest and every file it may read."""
    base = os.fspath(overlay_dir)
    files = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        files.extend(os.path.join(dirpath, f) for f in filenames)
    h = _sha256()
    for path in sorted(files, key=lambda f: os.path.relpath(f, base).split(os.sep)):
        h.update(os.path.relpath(path, base).replace(os.sep, "/").encode() + b"\0")
        with open(path, "rb") as fh:
            h.update(fh.read() + b"\0")
    return h.hexdigest()


def package_version(root: "os.PathLike[str] | str", package: str = "vllm") -> str | None:
    """The installed version, from the dist-info METADATA or `<package>/_version.py`."""
    root = os.fspath(root)
    prefix = package.replace("-", "_") + "-"
    try:
        infos = sorted(n for n in os.listdir(root) if n.startswith(prefix) and n.endswith(".dist-info"))
    except OSError:
        infos = []
    for info in infos:
        try:
            with open(os.path.join(root, info, "METADATA"), errors="replace") as fh:
                for line in fh:
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip()
                    if not line.strip():
                        break
        except OSError:
            continue
    try:
        with open(os.path.join(root, package, "_version.py"), errors="replace") as fh:
            m = re.search(_VERSION_RE, fh.read(), re.M)
    except OSError:
        return None
    return m.group(1) if m else None


class _Scanning:
    """The settings json.JSONDecoder hands its C scanner (strict; no hooks; NaN/Infinity refused)."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name: str) -> object:
        raise ValueError(f"{name} is not in a ledger")


_JSON_WS = " \t\n\r"


def json_loads(raw: bytes) -> object:
    """json.loads(raw) for the warm check without importing the json package: its import
    compiles seven regular expressions, ~2 ms of every container restart and the largest part
    of the warm no-op's own time. This is the C scanner json.loads itself runs
    (`_json.make_scanner`, CPython), with the same strictness; anything it does not take whole
    (no C scanner, not UTF-8, trailing text, a syntax error) goes to json.loads, which gives
    the reference answer or the ValueError."""
    try:
        from _json import make_scanner

        text = raw.decode("utf-8")
        start = len(text) - len(text.lstrip(_JSON_WS))
        value, end = make_scanner(_Scanning)(text, start)
        if not text[end:].strip(_JSON_WS):
            return value
    except Exception:  # noqa: BLE001 - StopIteration (a syntax error), ImportError, UnicodeDecodeError...
        pass
    import json

    return json.loads(raw)


def _file_sha(path: str) -> str:
    try:  # non-blocking open + fstat: a FIFO or device in a target's place never blocks the read
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (FileNotFoundError, IsADirectoryError):
        return "absent"
    with open(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "not-a-regular-file"  # matches no recorded hash: the full CLI reports it
        return _sha256(fh.read()).hexdigest()


def catalog_overlay_ids(overlays_dir: str) -> list[str] | None:
    """Sorted ids of the catalog's overlays (folders with an overlay.yaml), or None when unreadable."""
    try:
        return sorted(n for n in os.listdir(overlays_dir) if not n.startswith((".", "_"))
                      and os.path.isfile(os.path.join(overlays_dir, n, "overlay.yaml")))
    except OSError:
        return None


def _parse_apply(argv: list[str]) -> tuple[str | None, str | None, list[str], str | None] | None:
    """`[--catalog DIR] apply [IDS...] [--root DIR] [--plans DIR]` -> (catalog, root, ids, plans); None otherwise."""
    catalog = root = plans = None
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
        if arg in ("--root", "--plans"):
            value = next(it, None)
            if value is None:
                return None
            if arg == "--root":
                root = value
            else:
                plans = value
        elif arg.startswith("--root="):
            root = arg.split("=", 1)[1]
        elif arg.startswith("--plans="):
            plans = arg.split("=", 1)[1]
        elif arg.startswith("-"):
            return None  # --dry-run, --json, --help...: the full CLI
        else:
            ids.append(arg)
    return catalog, root, ids, plans


def _parse(argv: list[str]) -> tuple[str | None, str | None, list[str]] | None:
    """`[--catalog DIR] apply [IDS...] [--root DIR] [--plans DIR]` -> (catalog, root, ids); None otherwise."""
    parsed = _parse_apply(argv)
    return None if parsed is None else parsed[:3]


def _catalog_dir(arg: str | None) -> str | None:
    raw = arg or os.environ.get("OVERLAY_CATALOG")
    if raw:
        return os.path.realpath(os.path.expanduser(raw))
    from .catalog import default_catalog_dir

    found = default_catalog_dir()
    return os.fspath(found) if found is not None else None


def _root(arg: str | None) -> str | None:
    if arg:
        return os.path.realpath(os.path.expanduser(arg))
    spec = importlib.machinery.PathFinder.find_spec("vllm", sys.path)
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.dirname(os.path.realpath(list(spec.submodule_search_locations)[0]))


def nothing_to_do(argv: list[str]) -> list[tuple[str, str]] | None:
    """[(overlay id, status)] when `overlay <argv>` is an apply the ledger proves is a no-op."""
    parsed = _parse(argv)
    if parsed is None:
        return None
    catalog_arg, root_arg, ids = parsed
    catalog, root = _catalog_dir(catalog_arg), _root(root_arg)
    if catalog is None or root is None:
        return None
    state = os.path.join(root, ".overlay-manager")
    try:
        with open(os.path.join(state, "ledger.json"), "rb") as fh:
            ledger = json_loads(fh.read())
    except (OSError, ValueError):
        return None
    if os.path.exists(os.path.join(state, "journal.json")):
        return None
    if ledger.get("package_version") != package_version(root):
        return None
    overlays_dir = os.path.join(catalog, "overlays")
    every = catalog_overlay_ids(overlays_dir)
    if every is None:
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
        if rec.get("status") not in quiet or rec.get("digest") != overlay_digest(os.path.join(overlays_dir, oid)):
            return None
        for t in rec.get("targets", []):
            want = observed.get(t["path"])
            if want is None or _file_sha(os.path.join(root, t["path"])) != want:
                return None
        out.append((oid, rec["status"]))
    return out


def _from_plan(argv: list[str]) -> dict | None:
    """A first apply replayed from a prepared plan (manager.overlays.plans), or None."""
    parsed = _parse_apply(argv)
    if parsed is None:
        return None
    from .overlays.plans import main_apply

    return main_apply(parsed)


def _line(verb: str, text: str) -> None:
    sys.stderr.write(f"{verb:>12}  {text}\n")


_download: list = []


def _download_progress(step) -> None:
    """releases' progress for a release file fetched during the apply: the CLI's reporter (rich),
    imported only when such a step happens (a cache miss of a release-file edit's source)."""
    if not _download:
        from .cli.progress import DownloadProgress

        _download.append(DownloadProgress())
    _download[0](step)


def engine_apply(argv: list[str]) -> int | None:
    """`[--catalog C] apply [IDS] [--root R]` with the full engine, without the CLI: click, rich
    and the other commands' modules are ~0.1 s of a first start that has no prepared plan. Only
    when stderr is not a terminal (a container's log: the lines are the CLI's, plain; a terminal
    gets the CLI and its colours); None otherwise, and for any other command line. Errors go
    through the CLI's own handler (one line, exit 1; a crash log, exit 3)."""
    parsed = _parse_apply(argv)
    if parsed is None or sys.stderr.isatty():
        return None
    catalog_arg, root_arg, ids, _ = parsed  # --plans: tried before this, as the CLI's apply does
    try:
        from .catalog import Catalog
        from .overlays import find_root, load_overlays, select
        from .overlays.plans import ENV_CACHE
        from .overlays.prepare import apply_and_record, report_lines
        from .releases import set_progress

        set_progress(_download_progress)
        every = load_overlays(Catalog.locate(catalog_arg))
        recorded = apply_and_record(select(every, ids), find_root(root_arg), explicit=bool(ids), ids=ids,
                                    cache=os.environ.get(ENV_CACHE) or None, on_wait=lambda m: _line("waiting", m))
        for verb, text, _kind in report_lines(recorded):
            _line(verb, text)
        return 0
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - reported exactly as the CLI reports it
        from .cli.app import handle_errors

        with handle_errors():
            raise exc


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
    try:
        planned = _from_plan(argv)
    except Exception:  # noqa: BLE001 - the engine redoes (and recovers) whatever the plan path left
        planned = None
    if planned is not None:
        for oid, why in planned["skipped"]:
            sys.stderr.write(f"{'skipped':>12}  {oid}: {why}\n")
        for verb, path, ids in planned["changes"]:
            sys.stderr.write(f"{verb:>12}  {path}  ({', '.join(ids)})\n")
        for oid, st in planned["statuses"]:
            if st in _QUIET:
                sys.stderr.write(f"{st:>12}  {oid}\n")
        sys.stderr.write(f"{'plan':>12}  {planned['plan']} (prepared plan, hashes verified)\n")
        sys.exit(0)
    code = engine_apply(argv)
    if code is not None:
        sys.exit(code)
    from .cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
