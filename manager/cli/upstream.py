"""`overlay upstream {check,report}`: drop triggers from PR state, pin ancestry and source probes."""

from __future__ import annotations

from pathlib import Path

import click

from ..console import data, err, print_data, print_json, status, user_text as esc
from ..errors import UpstreamError
from .params import CatalogChoice

_VERDICT_STYLE = {
    "keep": "green", "waiting": "yellow", "drop": "bold magenta", "superseded": "magenta",
    "drift": "bold red", "unknown": "dim",
}


def _common(f):  # type: ignore[no-untyped-def]
    options = [
        click.argument("ids", nargs=-1, type=CatalogChoice("overlay", validate=False)),
        click.option("--engine", "engines", multiple=True, metavar="ID", type=CatalogChoice("engine"),
                     help="Only these engine profiles (repeatable)."),
        click.option("--offline", is_flag=True,
                     help="Do not contact GitHub: answer from the cache, saying how old each fact is."),
        click.option("--api-url", default=None, metavar="URL", help="GitHub REST API root (Enterprise, tests). Default https://api.github.com."),
        click.option("--git-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                     help="A local vLLM clone: ancestry by `git merge-base --is-ancestor` (compare API otherwise)."),
        click.option("--cache", "cache_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                     help="GitHub answer cache (default: <overlay cache>/github)."),
        click.option("--no-probe", is_flag=True, help="Skip source probes on the engines' release sources."),
        click.option("--probe-root", "probe_roots", multiple=True, metavar="ENGINE=DIR",
                     help="Probe this engine on the vllm sources under DIR (e.g. copied out of its image)."),
        click.option("--probe-report", "probe_reports", multiple=True, metavar="ENGINE=FILE",
                     help="Use saved `overlay verify --image IMAGE --json` (or `overlay status --json`) output "
                          "as this engine's probe."),
    ]
    for opt in reversed(options):
        f = opt(f)
    return f


def _roots(items: tuple[str, ...], option: str = "--probe-root", what: str = "DIR") -> dict[str, Path]:
    roots: dict[str, Path] = {}
    for item in items:
        engine, sep, path = item.partition("=")
        if not sep or not engine or not path:
            raise UpstreamError(f"{option} {item!r}: expected ENGINE={what}")
        roots[engine] = Path(path)
    return roots


def _run(app, ids, engines, offline, api_url, git_dir, cache_dir, no_probe, probe_roots, probe_reports,  # type: ignore[no-untyped-def]
         relative_ages, fail_fast=False):
    from .. import upstream

    return upstream.check(
        app.catalog, list(ids) or None, list(engines) or None, offline=offline, api_url=api_url,
        git_dir=git_dir, cache_dir=cache_dir, probe=not no_probe, probe_roots=_roots(probe_roots),
        probe_reports=_roots(probe_reports, "--probe-report", "FILE"),
        relative_ages=relative_ages, fail_fast=fail_fast,
    )


@click.group("upstream")
def upstream_group() -> None:
    """Drop triggers: is each overlay still needed on each engine?"""

@upstream_group.command("check")
@_common
@click.option("--json", "as_json", is_flag=True, help="Machine output: {\"results\": [...]} on stdout.")
@click.option("--fail-on", default=None, metavar="VERDICTS",
              help="Exit 1 when any of these verdicts occurs, e.g. drop,drift (for a scheduled CI job).")
@click.pass_obj
def check_cmd(app, ids, engines, offline, api_url, git_dir, cache_dir, no_probe, probe_roots,  # type: ignore[no-untyped-def]
              probe_reports, as_json, fail_on) -> int:
    """Verdict (keep/waiting/drop/superseded/drift/unknown) per overlay x engine, with evidence."""
    from ..upstream import VERDICTS, parse_fail_on

    fail = parse_fail_on(fail_on)
    report = _run(app, ids, engines, offline, api_url, git_dir, cache_dir, no_probe, probe_roots, probe_reports, True,
                  fail_fast="unknown" in fail)
    if report.unreachable:  # once, not per result
        err.print(f"[yellow]warning:[/yellow] {esc(report.unreachable)}; GitHub facts from the cache only")
    if as_json:
        print_json(report.to_json())
    else:
        for r in report.results:
            style = _VERDICT_STYLE.get(r.verdict, "white")
            extra = f" (manifest suggests {r.provisional})" if r.provisional else ""
            head = f"{r.overlay} on {r.engine} (pin {r.pin}){extra}"
            if not data.is_terminal:  # piped: one result per line, its evidence after a tab ('; '-joined)
                print_data(f"{r.verdict}\t{head}\t" + "; ".join(r.evidence))
                continue
            data.print(f"[{style}]{r.verdict:>10}[/{style}]  " + esc(head), markup=True)
            for line in r.evidence:
                data.print(f"            - {line}", markup=False)
    counts = {v: n for v in VERDICTS if (n := sum(1 for r in report.results if r.verdict == v))}
    err.print(f"{len(report.results)} result(s): " + ", ".join(f"{n} {v}" for v, n in counts.items())
              + (" (offline: GitHub facts from the cache only)" if report.offline else ""), markup=False)
    hits = report.failing(fail)
    if hits:
        err.print(f"[red]fail-on:[/red] {len(hits)} result(s) with verdict in {','.join(fail)}: "
                  + esc(", ".join(f"{r.overlay}@{r.engine}={r.verdict}" for r in hits)), markup=True)
        return 1
    return 0

@upstream_group.command("report")
@_common
@click.option("--format", "fmt", type=click.Choice(["markdown", "json"]), default="markdown", show_default=True)
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write here (create/identical/updated) instead of stdout, e.g. docs/UPSTREAM.md.")
@click.pass_obj
def report_cmd(app, ids, engines, offline, api_url, git_dir, cache_dir, no_probe, probe_roots,  # type: ignore[no-untyped-def]
               probe_reports, fmt, output) -> None:
    """The tracking table (overlay, PR, state, verdicts per engine, drop rule, last checked)."""
    import json

    from ..upstream import render_markdown
    from .app import write_output

    report = _run(app, ids, engines, offline, api_url, git_dir, cache_dir, no_probe, probe_roots, probe_reports, False)
    text = render_markdown(report) if fmt == "markdown" else json.dumps(report.to_json(), indent=2) + "\n"
    if output is None:
        print_data(text)
    else:
        status(write_output(output, text.encode(), make_dirs=True), str(output))


def register(cli: click.Group) -> None:
    """Add this area's commands to the root `overlay` group."""
    for cmd in (upstream_group,):
        cli.add_command(cmd)
