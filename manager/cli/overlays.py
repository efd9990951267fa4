"""`overlay list | status | apply | diff | revert`: thin callbacks over manager.overlays."""

from __future__ import annotations

from pathlib import Path

import click

from ..console import data, err, print_data, print_json, print_table, status as say, user_text as esc
from .app import Application
from .params import CatalogChoice, json_option, root_option, wait_option

_STYLE = {
    "applied": "green",
    "upstream": "blue",
    "pending": "yellow",
    "not-applicable": "dim",
    "superseded": "magenta",
    "drift": "red",
    "partial": "red",
    "modified": "red",
    "missing-target": "red",
    "error": "red",
}

def _waiting(message: str) -> None:
    say("waiting", message, "yellow")


def _selected(app: Application, ids: tuple[str, ...]):
    from ..overlays import load_overlays, select

    every = load_overlays(app.catalog)
    return every, select(every, ids)


@click.command("list")
@json_option
@click.option("--wide", is_flag=True, help="Every column, titles in full (wraps); default: one line per overlay.")
@click.pass_obj
def list_cmd(app: Application, as_json: bool, wide: bool) -> None:
    """List the catalog's overlays."""
    from ..overlays import load_overlays

    overlays = load_overlays(app.catalog)
    if as_json:
        print_json(
            {
                "overlays": [
                    {
                        "id": o.id,
                        "title": o.manifest.title,
                        "versions": o.manifest.versions,
                        "targets": o.manifest.targets,
                        "sentinel_version": o.manifest.sentinel_version,
                        "upstream": o.manifest.upstream.model_dump() if o.manifest.upstream else None,
                        "kernel": o.manifest.kernels is not None,
                    }
                    for o in overlays
                ]
            }
        )
        return
    from rich.table import Table

    say("catalog", str(app.catalog.overlays_dir), "dim")
    table = Table(box=None, pad_edge=False, header_style="bold")
    # ids are what users type: never cut (min_width = the longest); the title gives way first
    rows = []
    for o in overlays:
        up = o.manifest.upstream
        rows.append((o, [o.id, o.manifest.versions or "any", f"#{up.pr} {up.state}" if up else "local"]))

    def width(i: int) -> int:
        return max((len(r[i]) for _, r in rows), default=4)

    table.add_column("id", no_wrap=True, min_width=width(0))
    table.add_column("vllm", no_wrap=True, min_width=width(1))
    table.add_column("upstream", no_wrap=True, min_width=width(2))
    if wide:
        table.add_column("targets", overflow="fold")
    if wide:
        table.add_column("title", overflow="fold")
    else:  # one line per overlay (`overlay list | grep` sees whole rows): the title takes what is left
        from rich.console import Console

        left = Console().width - sum(width(i) + 2 for i in range(3))
        table.add_column("title", no_wrap=True, overflow="ellipsis", max_width=max(left, 8))
    for o, row in rows:
        if wide:
            row.append("\n".join(o.manifest.targets))
        table.add_row(*(esc(c) for c in row), esc(o.manifest.title))
    print_table(table)


def _print_status(report) -> None:
    from rich.table import Table

    table = Table(title=f"vllm {esc(report.package_version or '?')} at {esc(report.root)}", box=None, pad_edge=False,
                  header_style="bold", title_justify="left")
    # the id and the status never break (ids are what users type); paths and details wrap
    table.add_column("overlay", no_wrap=True, min_width=max((len(o.id) for o in report.overlays), default=7))
    table.add_column("status", no_wrap=True, min_width=max((len(o.status) for o in report.overlays), default=6))
    table.add_column("target", overflow="fold", ratio=1)
    table.add_column("detail", overflow="fold", ratio=1)
    first_only = data.is_terminal  # piped: every row names its overlay (`status | grep PATH` shows whose)
    for o in report.overlays:
        for i, t in enumerate(o.targets):
            style = _STYLE.get(t.status, "")
            table.add_row(
                esc(o.id) if i == 0 or not first_only else "",
                f"[{_STYLE.get(o.status, '')}]{o.status}[/]" if i == 0 or not first_only else "",
                f"[{style}]{esc(t.path)}[/]",
                esc(t.detail),
            )
    print_table(table)


def _memory_delivery(ids: tuple[str, ...]) -> list[tuple[str, str, str]] | None:
    """In memory mode ($OVERLAY_DELIVERY=memory, set by the rendered service): how each overlay reaches the engine
    (manager/inmemory/check.delivery); None otherwise."""
    import os

    if os.environ.get("OVERLAY_DELIVERY") != "memory":
        return None
    from ..inmemory.check import delivery
    from ..inmemory.memplan import env_ids

    return delivery(list(ids) or env_ids())


@click.command("status")
@click.argument("ids", nargs=-1, type=CatalogChoice("overlay", validate=False))
@root_option
@json_option
@click.pass_obj
def status_cmd(app: Application, ids: tuple[str, ...], root: str | None, as_json: bool) -> int:
    """Status of each overlay on the installed package (exit 1 on drift/partial/modified/error)."""
    from ..overlays import find_root, status

    _, selected = _selected(app, ids)
    report = status(selected, find_root(root))
    memory = _memory_delivery(ids)
    if as_json:
        print_json({**report.to_json(), **({"delivery": memory} if memory is not None else {})})
    else:
        _print_status(report)
        for oid, how, why in memory or ():
            say(how, f"{oid}: {why}", "green" if how == "memory" else "yellow" if how == "skipped" else "red")
    if report.interrupted:
        say("interrupted", report.interrupted, "red")
    refused = any(how == "refused" for _, how, _ in memory or ())
    return 1 if report.failing or refused else 0


@click.command("apply")
@click.argument("ids", nargs=-1, type=CatalogChoice("overlay", validate=False))
@root_option
@click.option("--dry-run", is_flag=True, help="Change nothing; exit 1 when work is pending.")
@click.option("--plans", "plans", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Prepared plans to use first (also $OVERLAY_PLANS); read by the start-up path before this command.")
@json_option
@wait_option
@click.pass_obj
def apply_cmd(app: Application, ids: tuple[str, ...], root: str | None, dry_run: bool, plans: str | None,
              as_json: bool, wait: float) -> int:
    """Apply overlays transactionally (all or nothing), idempotently.

    A first apply is recorded as a plan into $OVERLAY_PLAN_CACHE when that is set."""
    import os

    from ..overlays import find_root
    from ..overlays.plankey import ENV_CACHE
    from ..overlays.prepare import apply_and_record, report_lines

    _, selected = _selected(app, ids)
    if as_json and not dry_run:  # the start-up path replays a prepared plan for text mode; --json reaches here
        from ..overlays.plans import main_apply

        planned = main_apply((app.catalog_arg, root, list(ids), plans))
        if planned is not None:
            print_json({"root": str(find_root(root)), "plan": planned["plan"], "dry_run": False,
                        "changes": [{"path": p, "verb": v, "overlays": list(o)} for v, p, o in planned["changes"]],
                        "skipped": [{"id": i, "why": w} for i, w in planned["skipped"]],
                        "status": [{"id": i, "status": st} for i, st in planned["statuses"]]})
            say("plan", f"{planned['plan']} (prepared plan, hashes verified)", "dim")
            return 0
    recorded = apply_and_record(selected, find_root(root), dry_run=dry_run, explicit=bool(ids), ids=ids,
                                cache=os.environ.get(ENV_CACHE) or None, wait=wait, on_wait=_waiting)
    result = recorded.result
    if as_json:
        print_json({**result.to_json(), "plan": recorded.plan})
    kinds = {"note": "yellow", "skipped": "magenta", "change": "green", "quiet": "dim"}
    for verb, text, kind in report_lines(recorded, dry_run):  # say() shows the text literally
        say(verb, text, _STYLE.get(verb, "cyan") if kind == "status" else kinds[kind])
    return 1 if dry_run and result.changes else 0


@click.command("prepare")
@click.argument("ids", nargs=-1)
@click.option("--vllm", "versions", multiple=True, required=True,
              help="Real vLLM release to prepare plans for (repeatable; sources from PyPI, cached).")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory to write the plans into (`overlay apply --plans DIR`).")
@json_option
@click.pass_obj
def prepare_cmd(app: Application, ids: tuple[str, ...], versions: tuple[str, ...], out: Path, as_json: bool) -> None:
    """Prepare plans: the full engine's first apply of IDS (default: all) on each release, recorded."""
    from ..overlays import load_overlays
    from ..overlays.prepare import prepare

    made = prepare(load_overlays(app.catalog), versions, ids, out)
    if as_json:
        print_json([{"vllm": p.version, "plan": p.path, "writes": list(p.changes),
                     "statuses": dict(p.statuses)} for p in made])
        return
    for p in made:
        states = ", ".join(f"{i} {s}" for i, s in p.statuses)
        say("prepared", f"vllm {p.version}: {esc(p.path)} ({len(p.changes)} files; {states})", "green")


@click.command("diff")
@click.argument("ids", nargs=-1, type=CatalogChoice("overlay", validate=False))
@root_option
@click.pass_obj
def diff_cmd(app: Application, ids: tuple[str, ...], root: str | None) -> None:
    """The unified diff `apply` would write."""
    from ..overlays import diff, find_root

    _, selected = _selected(app, ids)
    text = diff(selected, find_root(root), explicit=bool(ids))
    if text:
        print_data(text)
    else:
        say("identical", "no changes pending", "dim")


@click.command("revert")
@click.argument("ids", nargs=-1, type=CatalogChoice("overlay", validate=False))
@root_option
@wait_option
@click.pass_obj
def revert_cmd(app: Application, ids: tuple[str, ...], root: str | None, wait: float) -> None:
    """Restore the original bytes of files the overlays changed (refuses if changed since)."""
    from ..overlays import find_root, revert

    every, selected = _selected(app, ids)
    result = revert(selected, every, find_root(root), wait=wait, on_wait=_waiting)
    for note in result.notes:
        say("note", note, "yellow")
    for c in result.changes:
        say("restored" if c.after is not None else "deleted", f"{c.path}  ({', '.join(c.overlays)})", "green")
    if not result.changes:
        say("identical", "nothing to revert", "dim")


@click.command("demo")
@click.option("--vllm", "version", default="0.20.0", show_default=True, help="Real vLLM release to download from PyPI.")
@click.option("--dest", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Where to extract it and keep it (default: a temporary directory, removed at the end).")
@click.option("--keep", is_flag=True, help="Keep the temporary tree (its path is printed).")
@click.pass_obj
def demo_cmd(app: Application, version: str, dest: str | None, keep: bool) -> None:
    """The built-in default job: download a real vLLM release, show status, apply, show status."""
    import shutil
    import tempfile

    from ..overlays import apply, load_overlays, status
    from ..overlays.manifest import ReleaseFileEdit
    from ..releases import copy_release

    # the catalog first: a missing or broken one fails before anything is downloaded
    overlays = [o for o in load_overlays(app.catalog) if o.manifest.kernels is None or o.manifest.edits]
    others = sorted({e.release for o in overlays for e in o.manifest.edits
                     if isinstance(e, ReleaseFileEdit) and e.release != version})
    root = Path(dest) if dest else Path(tempfile.mkdtemp(prefix=f"overlay-demo-{version}-"))
    say("release", f"vllm=={version} sources from PyPI into {root}"
        + (f"; the overlays copy files from vllm {', '.join(others)} too (its sdist is fetched once, cached)"
           if others else ""))
    try:
        copy_release(version, root)
        _print_status(status(overlays, root))
        result = apply(overlays, root)
        for oid, why in result.skipped:
            say("skipped", f"{oid}: {why}", "magenta")
        for c in result.changes:
            say(c.verb, f"{root / c.path}", "green")
        _print_status(result.statuses)
    finally:
        if dest is None and not keep:
            shutil.rmtree(root, ignore_errors=True)
            say("removed", f"{root} (--keep or --dest DIR keeps the tree)", "dim")
        else:
            say("root", str(root))


@click.command("trace")
@click.argument("logfile", type=click.Path(dir_okay=False, allow_dash=True, path_type=str))
@click.option("--expect", "expect", multiple=True, metavar="ID", type=CatalogChoice("overlay"),
              help="Overlay id (of the catalog) whose blocks must have run (exit 1 when no line names it). Repeatable.")
@json_option
def trace_cmd(logfile: str, expect: tuple[str, ...], as_json: bool) -> int:
    """Read back OVERLAY_TRACE=1 lines from an engine log (LOGFILE, or - for stdin): which patched blocks ran."""
    from rich.markup import escape

    from ..overlays.trace import read_trace_file

    summary = read_trace_file(logfile, expect)
    if as_json:
        print_json({"lines": [vars(ln) for ln in summary.lines], "overlays": list(summary.overlays),
                    "missing": list(summary.missing),
                    "memory": {str(pid): ids for pid, ids in summary.memory.items()}})
    else:
        for ln in summary.lines:
            print_data(f"{ln.overlay} v{ln.version} {ln.edit} pid={ln.pid} module={ln.module}")
        for pid, ids in summary.memory.items():  # in-memory delivery (manager/inmemory/marker.py)
            for oid, modules in ids.items():
                print_data(f"{oid} from-memory pid={pid} modules={','.join(modules)}")
        if not summary.lines and not summary.memory:
            err.print(f"no overlay-trace lines in {escape(logfile)} (was the engine started with OVERLAY_TRACE=1?)")
    for missing in summary.missing:
        err.print(f"[red]not traced[/red]  {escape(missing)}: none of its blocks ran in this log")
    return 1 if summary.missing else 0


def register(cli: click.Group) -> None:
    for cmd in (list_cmd, status_cmd, apply_cmd, prepare_cmd, diff_cmd, revert_cmd, demo_cmd, trace_cmd):
        cli.add_command(cmd)
