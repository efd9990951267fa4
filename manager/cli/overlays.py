"""`overlay list | status | apply | diff | revert`: thin callbacks over manager.overlays."""

from __future__ import annotations

from pathlib import Path

import click

from ..console import err, print_data, print_json, status as say
from .app import Application

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

root_option = click.option(
    "--root",
    "root",
    type=click.Path(file_okay=False, path_type=str),
    default=None,
    help="Directory holding the vllm/ package (default: where python would import it from).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Machine output (JSON) on stdout.")


def _selected(app: Application, ids: tuple[str, ...]):
    from ..overlays import load_overlays, select

    every = load_overlays(app.catalog)
    return every, select(every, ids)


@click.command("list")
@json_option
@click.pass_obj
def list_cmd(app: Application, as_json: bool) -> None:
    """List the catalog's overlays."""
    from ..overlays import load_overlays

    overlays = load_overlays(app.catalog)
    if as_json:
        print_json(
            [
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
        )
        return
    from rich.table import Table

    table = Table(title=f"overlays in {app.catalog.overlays_dir}")
    for col in ("id", "vllm", "upstream", "title"):
        table.add_column(col)
    for o in overlays:
        up = o.manifest.upstream
        table.add_row(o.id, o.manifest.versions or "any", f"#{up.pr} {up.state}" if up else "local", o.manifest.title)
    err.print(table)


def _print_status(report) -> None:
    from rich.table import Table

    table = Table(title=f"vllm {report.package_version or '?'} at {report.root}")
    for col in ("overlay", "status", "target", "detail"):
        table.add_column(col, overflow="fold")
    for o in report.overlays:
        for i, t in enumerate(o.targets):
            style = _STYLE.get(t.status, "")
            table.add_row(
                o.id if i == 0 else "",
                f"[{_STYLE.get(o.status, '')}]{o.status}[/]" if i == 0 else "",
                f"[{style}]{t.path}[/]",
                t.detail,
            )
    err.print(table)


@click.command("status")
@click.argument("ids", nargs=-1)
@root_option
@json_option
@click.pass_obj
def status_cmd(app: Application, ids: tuple[str, ...], root: str | None, as_json: bool) -> int:
    """Status of each overlay on the installed package (exit 1 on drift/partial/modified/error)."""
    from ..overlays import find_root, status

    _, selected = _selected(app, ids)
    report = status(selected, find_root(root))
    if as_json:
        print_json(report.to_json())
    else:
        _print_status(report)
    return 1 if report.failing else 0


@click.command("apply")
@click.argument("ids", nargs=-1)
@root_option
@click.option("--dry-run", is_flag=True, help="Change nothing; exit 1 when work is pending.")
@json_option
@click.pass_obj
def apply_cmd(app: Application, ids: tuple[str, ...], root: str | None, dry_run: bool, as_json: bool) -> int:
    """Apply overlays transactionally (all or nothing), idempotently."""
    from ..overlays import apply, find_root

    _, selected = _selected(app, ids)
    result = apply(selected, find_root(root), dry_run=dry_run, explicit=bool(ids))
    if as_json:
        print_json(result.to_json())
    for note in result.notes:
        say("recovered", note, "yellow")
    for oid, why in result.skipped:
        say("skipped", f"{oid}: {why}", "magenta")
    for c in result.changes:
        verb = {"create": "would create", "updated": "would update", "delete": "would delete"}.get(c.verb, c.verb)
        say(verb if dry_run else c.verb, f"{c.path}  ({', '.join(c.overlays)})", "green")
    for o in result.statuses.overlays:
        if o.status in ("applied", "upstream", "not-applicable") and not dry_run:
            say(o.status, o.id, _STYLE.get(o.status, "cyan"))
    if not result.changes:
        say("identical", f"nothing to do{' (ledger hashes match)' if result.fast_path else ''}", "dim")
    return 1 if dry_run and result.changes else 0


@click.command("diff")
@click.argument("ids", nargs=-1)
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
@click.argument("ids", nargs=-1)
@root_option
@click.pass_obj
def revert_cmd(app: Application, ids: tuple[str, ...], root: str | None) -> None:
    """Restore the original bytes of files the overlays changed (refuses if changed since)."""
    from ..overlays import find_root, revert

    every, selected = _selected(app, ids)
    result = revert(selected, every, find_root(root))
    for note in result.notes:
        say("note", note, "yellow")
    for c in result.changes:
        say("restored" if c.after is not None else "deleted", f"{c.path}  ({', '.join(c.overlays)})", "green")
    if not result.changes:
        say("identical", "nothing to revert", "dim")


@click.command("demo")
@click.option("--vllm", "version", default="0.20.0", show_default=True, help="Real vLLM release to download from PyPI.")
@click.option("--dest", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Where to extract it (default: a fresh temporary directory).")
@click.pass_obj
def demo_cmd(app: Application, version: str, dest: str | None) -> None:
    """The built-in default job: download a real vLLM release, show status, apply, show status."""
    import tempfile

    from ..overlays import apply, load_overlays, status
    from ..releases import copy_release

    root = Path(dest) if dest else Path(tempfile.mkdtemp(prefix=f"overlay-demo-{version}-"))
    say("download", f"vllm=={version} sources from PyPI (cached)")
    copy_release(version, root)
    overlays = [o for o in load_overlays(app.catalog) if o.manifest.kernels is None or o.manifest.edits]
    _print_status(status(overlays, root))
    result = apply(overlays, root)
    for oid, why in result.skipped:
        say("skipped", f"{oid}: {why}", "magenta")
    for c in result.changes:
        say(c.verb, f"{root / c.path}", "green")
    _print_status(result.statuses)
    say("root", str(root))


@click.command("trace")
@click.argument("logfile", type=click.Path(dir_okay=False, path_type=str))
@click.option("--expect", "expect", multiple=True, metavar="ID",
              help="Overlay id whose blocks must have run (exit 1 when no line names it). Repeatable.")
@json_option
def trace_cmd(logfile: str, expect: tuple[str, ...], as_json: bool) -> int:
    """Read back OVERLAY_TRACE=1 lines from an engine log: which patched blocks ran, in which process."""
    from rich.markup import escape

    from ..overlays.trace import read_trace_file

    summary = read_trace_file(logfile, expect)
    if as_json:
        print_json({"lines": [vars(ln) for ln in summary.lines], "overlays": list(summary.overlays),
                    "missing": list(summary.missing)})
    else:
        for ln in summary.lines:
            print_data(f"{ln.overlay} v{ln.version} {ln.edit} pid={ln.pid} module={ln.module}")
        if not summary.lines:
            err.print(f"no overlay-trace lines in {escape(logfile)} (was the engine started with OVERLAY_TRACE=1?)")
    for missing in summary.missing:
        err.print(f"[red]not traced[/red]  {escape(missing)}: none of its blocks ran in this log")
    return 1 if summary.missing else 0


def register(cli: click.Group) -> None:
    for cmd in (list_cmd, status_cmd, apply_cmd, diff_cmd, revert_cmd, demo_cmd, trace_cmd):
        cli.add_command(cmd)
