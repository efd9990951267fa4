"""CLI: `profiles {list,show,validate,import-config}`, `fits`, `plan` (thin callbacks)."""

from __future__ import annotations

import re
from pathlib import Path

import click
import yaml

from ..console import data, err, print_data, print_json, print_table, status, user_text as esc
from ..errors import ProfileError
from .params import POSITIVE, CatalogChoice

KIND_ALIASES = {"model": "models", "engine": "engines", "drafter": "drafters", "hw": "hardware"}


def _profiles(ctx: click.Context):
    from ..profiles import load_profiles

    return load_profiles(ctx.obj.catalog)


def _checkpoint(ctx: click.Context, profiles, model: str | None, checkpoint: str | None):
    """--model XOR --checkpoint; the checkpoint is inspected (headers only) here."""
    if (model is None) == (checkpoint is None):
        raise ProfileError(
            "give exactly one of --model (a profile id) or --checkpoint (a checkpoint dir, URL or repo id)"
        )
    if checkpoint is None:
        return None
    from ..inspect import inspect_checkpoint

    return inspect_checkpoint(checkpoint, profiles=profiles, catalog=ctx.obj.catalog)


def _index(ctx: click.Context, offline: bool):
    """The overlay index fits/plan use. --offline: the shipped release statuses, then the manifests'
    version ranges (said in the overlays constraint), never a download. Otherwise a release whose
    statuses are neither shipped nor cached is announced on stderr before its sources are read."""
    from ..fits import build_index, index_for

    if offline:
        return build_index(ctx.obj.catalog, use_releases=False)
    idx = index_for(ctx.obj.catalog)
    fn = idx.status_fn
    if fn is not None and not getattr(fn, "announces", False):
        def announced(version: str, _fn=fn):
            err.print(f"[dim]{'sources':>12}[/dim]  overlay status on vLLM {esc(version)} is not shipped or cached: "
                      "reading its sources (a download of ~35 MB when its sdist is not cached; --offline skips)")
            return _fn(version)

        announced.announces = True  # type: ignore[attr-defined]
        idx.status_fn = announced
    return idx


def _bar(used: dict[str, int], total: int, width: int = 40) -> str:
    out, style = [], {"weights": "blue", "drafter": "magenta", "overhead": "yellow", "activations": "yellow",
                      "kv_needed": "green"}
    for key, col in style.items():
        n = round(width * max(used.get(key, 0), 0) / total) if total else 0
        out.append(f"[{col}]" + "█" * n + f"[/{col}]")
    filled = sum(round(width * max(used.get(k, 0), 0) / total) for k in style) if total else 0
    return "".join(out) + "░" * max(width - filled, 0)


_RESTS_ON = re.compile(r" \[rests on unverified: [^\]]*\]")


def _shown(message: str, explain: bool) -> str:
    """A constraint's message; without --explain the `[rests on unverified: ...]` tail is left to the footnote."""
    return message if explain else _RESTS_ON.sub("", message)


def _print_report(report, explain: bool = False) -> None:
    from rich.table import Table

    colours = {"pass": "green", "warn": "yellow", "fail": "red", "skip": "dim"}
    dep = report.deployment
    data.print(f"[bold]{esc(dep['model'])}[/bold] ({esc(dep['weights'])}) on {dep['gpus']}x {esc(dep['hardware'])}, "
               f"TP {dep['tp']}, {esc(dep['engine'])}" + (f", drafter {esc(dep['drafter'])}" if dep["drafter"] else ""))
    t = Table(show_header=True, header_style="bold")
    t.add_column("constraint")
    t.add_column("result")
    t.add_column("detail", overflow="fold")
    for c in report.constraints:
        if c.id == "unverified" and not explain:
            continue
        col = colours[c.result]
        t.add_row(esc(c.id), f"[{col}]{c.result}[/{col}]", esc(_shown(c.message, explain)))
    print_table(t)
    pc = report.memory.per_card
    mm = report.memory
    gb = lambda b: f"{b / 1e9:.1f}"  # noqa: E731
    data.print(f"per card  {_bar(pc, pc['budget'])}  {gb(pc['budget'] - max(pc['free'], 0))}/{gb(pc['budget'])} GB "
              f"(weights {gb(pc['weights'])} {mm.weights_source}, drafter {gb(pc['drafter'])}, "
              f"overhead {gb(pc['overhead'] + pc['activations'])}, "
              f"KV in use {gb(pc['kv_needed'])} of {gb(pc.get('kv_available', pc['kv_needed']))} free for KV)")
    data.print(f"KV cache {mm.kv_bytes_per_token} B/token for the whole model ({mm.kv_dtype}) = "
               f"{mm.kv_bytes_per_token_per_card} B/token on each card at TP {dep['tp']}; max ctx {mm.max_ctx}, "
               f"room for {mm.kv_capacity_tokens} tokens per card")
    if report.overlays:
        data.print("overlays: " + ", ".join(report.overlays), markup=False)
    col = {"fits": "green", "tight": "yellow", "fails": "red"}[report.verdict]
    data.print(f"verdict: [{col}]{report.verdict}[/{col}], {esc(report.evidence)}"
               + (" (listed below; --explain: which constraint rests on which)"
                  if report.unverified and not explain else ""))
    if report.unverified and not explain:
        for f in report.unverified:
            data.print(f"  unverified: {esc(f)}")


@click.group("profiles")
def profiles_group() -> None:
    """Model, engine, drafter and hardware profiles."""

@profiles_group.command("list")
@click.option("--kind", "kind", type=click.Choice(["models", "engines", "drafters", "hardware"]), default=None)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def list_cmd(ctx: click.Context, kind: str | None, as_json: bool) -> None:
    """List profiles (all kinds, or one)."""
    p = _profiles(ctx)
    kinds = [kind] if kind else ["models", "engines", "drafters", "hardware"]
    if as_json:
        print_json({k: sorted(p.kind(k)) for k in kinds})
        return
    for k in kinds:
        for pid in sorted(p.kind(k)):
            print_data(f"{k}/{pid}")

@profiles_group.command("show")
@click.argument("ref", type=CatalogChoice("profile", validate=False))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def show_cmd(ctx: click.Context, ref: str, as_json: bool) -> None:
    """Show one profile: KIND/ID (e.g. models/gemma-4-26b-a4b)."""
    if "/" not in ref:
        raise ProfileError(f"{ref}: expected KIND/ID (kinds: models, engines, drafters, hardware)")
    kind, pid = ref.split("/", 1)
    kind = KIND_ALIASES.get(kind, kind)
    obj = _profiles(ctx).get(kind, pid)
    data = obj.model_dump(mode="json", exclude_defaults=False)
    if as_json:
        print_json(data)
    else:
        print_data(yaml.safe_dump(data, sort_keys=False, width=100))

@profiles_group.command("validate")
@click.argument("path", required=False, type=click.Path(exists=True, path_type=Path))
@click.pass_context
def validate_cmd(ctx: click.Context, path: Path | None) -> None:
    """Validate the catalog's profiles (or PATH: a profiles dir, catalog root, or one file)."""
    from ..profiles import validate_path

    target = path if path is not None else ctx.obj.catalog.profiles_dir
    p = validate_path(target)
    n = sum(len(p.kind(k)) for k in ("models", "engines", "drafters", "hardware"))
    err.print(f"[green]ok[/green]  {n} profile{'s' if n != 1 else ''} valid in {esc(target)}")

@profiles_group.command("import-config")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--id", "model_id", default=None, help="Profile id (default: the directory or file name).")
@click.option("--hf-repo", default=None, help="Hugging Face repo of the weights.")
@click.option("--size-gb", type=float, default=None, help="Checkpoint size on disk (default: estimated).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the profile here instead of stdout.")
def import_cmd(file: Path, model_id: str | None, hf_repo: str | None, size_gb: float | None,
               output: Path | None) -> None:
    """Build a model profile from a Hugging Face config.json."""
    from ..profiles import import_config, to_yaml
    from .app import write_output

    # absolute first: `import-config config.json` names the profile for the directory it is in (not '')
    text = to_yaml(import_config(file.absolute(), model_id=model_id, hf_repo=hf_repo, size_gb=size_gb))
    if output is None:
        print_data(text)
    else:
        status(write_output(output, text.encode(), make_dirs=True), str(output))

@click.command("fits")
@click.option("--model", default=None, type=CatalogChoice("model"), help="Model profile id (or give --checkpoint).")
@click.option("--checkpoint", default=None,
              help="A checkpoint dir / URL / repo id: its config and measured weight bytes (overlay inspect).")
@click.option("--weights", default=None, type=CatalogChoice("weights"),
              help="Weights variant of the model (default: the model's first).")
@click.option("--hardware", required=True, type=CatalogChoice("hardware"), help="Hardware profile id (e.g. rtx-3090).")
@click.option("--gpus", type=POSITIVE, default=1, show_default=True, help="GPUs of that hardware.")
@click.option("--tp", type=POSITIVE, default=None, help="--tensor-parallel-size (default: --gpus).")
@click.option("--engine", default=None, type=CatalogChoice("engine"),
              help="Engine profile id, e.g. vllm-0.20.0 (default: the newest).")
@click.option("--drafter", default=None, type=CatalogChoice("drafter"),
              help="Drafter profile id for speculative decoding.")
@click.option("--ctx", "ctx_len", type=POSITIVE, default=None, help="--max-model-len (default: the largest that fits).")
@click.option("--kv-dtype", default=None, type=CatalogChoice("kv-dtype"),
              help="KV cache dtype: auto, bfloat16, float16, fp8 (bf16/fp16 accepted).")
@click.option("--max-seqs", type=POSITIVE, default=None, help="--max-num-seqs the KV cache must hold at --ctx.")
@click.option("--explain", is_flag=True, help="Show which constraint rests on which unverified fact.")
@click.option("--offline", is_flag=True,
              help="Never download: overlay statuses from the catalog's shipped file, else version ranges.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def fits_cmd(ctx: click.Context, model, checkpoint, weights, hardware, gpus, tp, engine, drafter, ctx_len,
             kv_dtype, max_seqs, explain, offline, as_json) -> int:
    """Check whether a deployment fits; exit 0 for fits/tight, 1 for fails."""
    from ..fits import fits

    profiles = _profiles(ctx)
    insp = _checkpoint(ctx, profiles, model, checkpoint)
    report = fits(profiles, model=model, hardware=hardware, gpus=gpus, tp=tp, weights=weights,
                  engine=engine, drafter=drafter, ctx=ctx_len, kv_dtype=kv_dtype,
                  max_seqs=max_seqs, catalog=ctx.obj.catalog, checkpoint=insp, overlay_index=_index(ctx, offline))
    if as_json:
        print_json(report.to_json())
    else:
        _print_report(report, explain)
    return 0 if report.ok else 1

@click.command("plan")
@click.option("--model", default=None, type=CatalogChoice("model"), help="Model profile id (or give --checkpoint).")
@click.option("--checkpoint", default=None, help="A checkpoint dir / URL / repo id (overlay inspect).")
@click.option("--hardware", required=True, type=CatalogChoice("hardware"), help="Hardware profile id (e.g. rtx-3090).")
@click.option("--gpus", type=POSITIVE, default=1, show_default=True, help="GPUs of that hardware.")
@click.option("--ctx", "ctx_len", type=POSITIVE, default=None, help="--max-model-len every option must hold.")
@click.option("--max-seqs", type=POSITIVE, default=None, help="--max-num-seqs every option must hold.")
@click.option("--limit", type=int, default=10, show_default=True, help="Options to show (text output).")
@click.option("--explain", is_flag=True, help="List each option's unverified facts and what rests on them.")
@click.option("--offline", is_flag=True,
              help="Never download: overlay statuses from the catalog's shipped file, else version ranges.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def plan_cmd(ctx: click.Context, model, checkpoint, hardware, gpus, ctx_len, max_seqs, limit, explain, offline,
             as_json) -> int:
    """List the deployments that fit, best first, and why the others were rejected."""
    from ..fits import plan

    profiles = _profiles(ctx)
    insp = _checkpoint(ctx, profiles, model, checkpoint)
    pl = plan(profiles, model=model, hardware=hardware, gpus=gpus, ctx=ctx_len,
              max_seqs=max_seqs, catalog=ctx.obj.catalog, checkpoint=insp, overlay_index=_index(ctx, offline))
    model = pl.model
    from ..compose.add import add_command, engine_note

    note = engine_note(profiles, model, hardware, pl.options)
    if as_json:
        print_json({**pl.to_json(), "engine_note": note})
        return 0 if pl.options else 1
    shown = min(limit, len(pl.options))
    data.print(f"[bold]{esc(model)} on {gpus}x {esc(hardware)}[/bold]: {len(pl.options)} deployments fit"
               + (f" (best {shown} shown, +{len(pl.options) - shown} more)" if len(pl.options) > shown else ""))
    facts: dict[str, None] = {}  # the unverified facts of the options shown: listed once, after them
    for i, r in enumerate(pl.options[:limit], 1):
        d = r.deployment
        col = "green" if r.verdict == "fits" else "yellow"
        facts.update(dict.fromkeys(r.unverified))
        data.print(f" {i:>2}. [{col}]{r.verdict:<5}[/{col}] TP{d['tp']} "
                   + esc(f"{d['engine']} {d['weights']} kv={r.memory.kv_dtype} max_ctx={r.memory.max_ctx} "
                         f"drafter={d['drafter'] or '-'} overlays={','.join(r.overlays) or '-'}, {r.evidence}"))
        for c in r.constraints:
            if c.result == "warn" and (c.id != "unverified" or explain):
                data.print(f"       [yellow]warn[/yellow] {esc(c.id)}: {esc(_shown(c.message, explain))}")
    if facts and not explain:
        data.print(f"[bold]unverified facts[/bold] these options rest on "
                   f"({len(facts)}; --explain: per option and constraint):")
        for f in facts:
            data.print(f"  {esc(f)}")
    if pl.rejected:
        data.print(f"[bold]rejected[/bold] ({len(pl.rejected)}):")
        seen: dict[str, list[str]] = {}
        for rj in pl.rejected:
            d = rj.deployment
            seen.setdefault("; ".join(rj.reasons), []).append(f"TP{d['tp']} {d['engine']} {d['weights']}")
        groups = sorted(seen.items(), key=lambda kv: -len(kv[1]))
        for reason, deps in groups[:limit]:
            more = f" +{len(deps) - 4} more" if len(deps) > 4 else ""
            data.print("  [red]x[/red] " + esc(f"{', '.join(deps[:4])}{more}: {_shown(reason, explain)}"))
        hidden = groups[limit:]
        if hidden:
            data.print(f"  +{sum(len(d) for _, d in hidden)} more rejected, for {len(hidden)} other reasons "
                       f"(--limit N or --json for all)")
    if note:
        data.print(f"[bold]engine:[/bold] {esc(note)}")
    if pl.options and checkpoint is None:
        err.print("deploy option N: " + esc(add_command(ctx.obj.catalog, 1, model, hardware, gpus, ctx_len, max_seqs)
                                           ).replace("--from-plan 1", "--from-plan N"))
    return 0 if pl.options else 1


def register(cli: click.Group) -> None:
    """Add this area's commands to the root `overlay` group."""
    for cmd in (profiles_group, fits_cmd, plan_cmd):
        cli.add_command(cmd)
