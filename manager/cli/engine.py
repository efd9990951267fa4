"""CLI: `overlay engine audit WHEEL|SITE-PACKAGES|--image IMAGE [--sm 70] [--json]` (thin: parse,
call manager.engines.audit, render)."""

from __future__ import annotations

from pathlib import Path

import click

from ..console import err, print_data, print_json


def render(report, with_tus: bool = False) -> str:
    """The audit as plain text: one line per component (`with_tus`: then one per TU), then the
    per-binary TU counts."""
    sm = report.sm
    lines = [f"audit       {report.source} on sm_{sm}: {report.verdict}"
             f" ({len(report.binaries)} CUDA binaries of {report.scanned} ELF files read)"]
    for c in report.components:
        code = "SASS " + (",".join(c.sass) or "-") + "; PTX " + (",".join(c.ptx) or "-")
        if c.tool_release:
            code = f"CUDA {c.tool_release}"
        tus = f"{c.tus_running}/{len(c.tus)} TUs run" if c.tus else ""
        lines.append(f"  [{c.verdict}] {c.name} ({c.binary}): {tus + '; ' if tus else ''}{code}")
        lines.append(f"      {c.note}" + (f"  [source: {c.source}]" if c.source else ""))
        if with_tus:
            for t in c.tus:
                lines.append(f"      TU {t.index} {t.name or '(unnamed)'}: SASS {','.join(t.sass) or '-'}; "
                             f"PTX {','.join(t.ptx) or '-'}; on sm_{sm}: {t.runs or 'no code'}")
    lines.append(f"binaries    TUs with sm_{sm} SASS / TUs that run on sm_{sm} / TUs")
    for b in report.binaries:
        lines.append(f"  {b.path}: {b.tus_with_sass} / {b.tus_running} / {b.tu_count}"
                     f"  (SASS {','.join(b.sass) or '-'}; PTX {','.join(b.ptx) or '-'})")
    for e in report.errors:
        lines.append(f"error       {e}")
    return "\n".join(lines) + "\n"


@click.group("engine")
def engine() -> None:
    """Engines' binaries: which GPU architectures they carry."""


@engine.command("audit")
@click.argument("target", required=False)
@click.option("--image", default=None, help="Audit a local Docker image's site-packages instead of a path.")
@click.option("--sm", type=click.IntRange(10, 199), default=70, show_default=True,
              help="The SM to answer for (70 = V100, 86 = RTX 3090).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout (components under 'components').")
@click.option("--tus/--no-tus", default=False, help="List every translation unit of each component.")
def audit_cmd(target: str | None, image: str | None, sm: int, as_json: bool, tus: bool) -> int:
    """List the SASS/PTX architectures of every CUDA binary in a wheel, a site-packages directory or an
    image, and say whether SM runs what a Gemma-4 step needs (vLLM 0.19.x selection). Exit 0: it runs;
    1: a needed component has no code for SM."""
    from ..engines.audit import audit_image, audit_path

    if (target is None) == (image is None):
        raise click.UsageError("give either a WHEEL / SITE-PACKAGES path or --image IMAGE")
    if image is not None:
        report = audit_image(image, sm)
    else:
        assert target is not None  # exactly one of the two, checked above
        report = audit_path(Path(target), sm)
    if as_json:
        print_json(report.as_dict(with_tus=tus))
    else:
        print_data(render(report, with_tus=tus))
    if not report.ok:
        why = report.errors[0] if report.errors else ", ".join(c.name for c in report.failing)
        err.print(f"error: sm_{sm}: {report.verdict}" + (f": {why}" if why else ""), markup=False)
        return 1
    return 0


def register(cli: click.Group) -> None:
    cli.add_command(engine)
