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

import os
import sys

from .state import (
    APPLY_SKIPS,
    JOURNAL_FILE,
    LEDGER_FILE,
    SKIP_UNLESS_NAMED,
    STATE_DIR,
    catalog_dir,
    catalog_overlay_ids,
    file_sha,
    overlay_digest,
    package_version,
    vllm_root,
    warm_records,
)

TYPE_CHECKING = False  # not typing's: `typing` imports `re`, which the warm no-op never loads (tests/test_fastpath.py)
if TYPE_CHECKING:
    from typing import Any

    from .releases import Step

# apply skips these (manager.state): when its ids were named, a superseded/missing-target
# overlay is an error, so the full CLI must report it
_QUIET = APPLY_SKIPS
_QUIET_UNNAMED = APPLY_SKIPS | SKIP_UNLESS_NAMED


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
        value, end = make_scanner(_Scanning)(text, start)  # type: ignore[arg-type]  # a class as the context
        if not text[end:].strip(_JSON_WS):
            return value
    except Exception:  # noqa: BLE001 - StopIteration (a syntax error), ImportError, UnicodeDecodeError...
        pass
    import json

    return json.loads(raw)


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


def nothing_to_do(argv: list[str]) -> list[tuple[str, str]] | None:
    """[(overlay id, status)] when `overlay <argv>` is an apply the ledger proves is a no-op."""
    parsed = _parse(argv)
    if parsed is None:
        return None
    catalog_arg, root_arg, ids = parsed
    catalog, root = catalog_dir(catalog_arg), vllm_root(root_arg)
    if catalog is None or root is None:
        return None
    state = os.path.join(root, STATE_DIR)
    try:
        with open(os.path.join(state, LEDGER_FILE), "rb") as fh:
            ledger = json_loads(fh.read())
    except (OSError, ValueError):
        return None
    overlays_dir = os.path.join(catalog, "overlays")
    every = catalog_overlay_ids(overlays_dir)
    if every is None:
        return None
    found = warm_records(ledger, package_version(root), os.path.exists(os.path.join(state, JOURNAL_FILE)),
                         ids or every, lambda oid: overlay_digest(os.path.join(overlays_dir, oid)),
                         lambda rel: file_sha(os.path.join(root, rel)),
                         quiet=_QUIET if ids else _QUIET_UNNAMED, known=every)
    return None if found is None else [(oid, rec["status"]) for oid, rec in found]


def _from_plan(argv: list[str]) -> dict[str, Any] | None:
    """A first apply replayed from a prepared plan (manager.overlays.plans), or None."""
    parsed = _parse_apply(argv)
    if parsed is None:
        return None
    from .overlays.plans import main_apply

    return main_apply(parsed)


def _line(verb: str, text: str) -> None:
    sys.stderr.write(f"{verb:>12}  {text}\n")


_download: list[Any] = []


def _download_progress(step: Step) -> None:
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
        from .applyreport import plain
        from .overlays.applying import apply_overlays, report_lines
        from .releases import set_progress

        set_progress(_download_progress)
        every = load_overlays(Catalog.locate(catalog_arg))
        recorded = apply_overlays(select(every, ids), find_root(root_arg), ids, on_wait=lambda m: _line("waiting", m))
        sys.stderr.write(plain(report_lines(recorded)))
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
        from .applyreport import apply_lines, plain

        sys.stderr.write(plain(apply_lines(statuses=done, identical="nothing to do (ledger hashes match)")))
        sys.exit(0)
    try:
        planned = _from_plan(argv)
    except Exception:  # noqa: BLE001 - the engine redoes (and recovers) whatever the plan path left
        planned = None
    if planned is not None:
        from .applyreport import apply_lines, plain

        sys.stderr.write(plain(apply_lines(
            skipped=planned["skipped"], changes=planned["changes"], statuses=planned["statuses"], shown=_QUIET,
            closing=("plan", f"{planned['plan']} (prepared plan, hashes verified{planned.get('auth', '')})", "quiet"))))
        sys.exit(0)
    code = engine_apply(argv)
    if code is not None:
        sys.exit(code)
    from .cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
