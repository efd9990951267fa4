"""CLI commands for compose deployments: `compose {list,render,check,add}`, `catalog init`, `bundle`, `verify`."""

from __future__ import annotations

from pathlib import Path

import click

from ..console import data, err, print_data, print_json, status, user_text as esc
from ..errors import ComposeError
from .params import CatalogChoice


@click.group("compose")
def compose_group() -> None:
    """Deployments from compose/deployments.yaml rendered to docker-compose files."""


@compose_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def list_cmd(app, as_json: bool) -> None:
    """List the registry's deployments."""
    from ..compose.registry import load_registry

    reg = load_registry(app.catalog)
    rows = [d.model_dump(mode="json") for _, d in sorted(reg.deployments.items())]
    if as_json:
        print_json({"deployments": rows})
        return
    from rich.table import Table

    from ..console import print_table

    # a terminal: fits its width (the model column folds first); piped: one line per deployment
    t = Table(box=None, pad_edge=False, header_style="bold")
    t.add_column("slug", no_wrap=True)
    t.add_column("port", no_wrap=True, justify="right")
    t.add_column("tp/gpus", no_wrap=True)
    t.add_column("hardware", no_wrap=True)
    t.add_column("model/weights", overflow="fold")
    t.add_column("status", no_wrap=True)
    for d in rows:
        t.add_row(esc(d["slug"]), str(d["port"]), f"{d['tp']}/{d['gpus']}", esc(d["hardware"]),
                  esc(f"{d['model']}{'/' + d['weights'] if d['weights'] else ''}"), d["status"])
    print_table(t)


@compose_group.command("render")
@click.argument("slug", required=False, type=CatalogChoice("deployment"))
@click.option("--all", "render_all", is_flag=True, help="Write compose/generated/<slug>.yml for every deployment.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write to FILE instead of stdout.")
@click.option("--no-gpu", is_flag=True,
              help="Leave out the NVIDIA device reservation (machines without the NVIDIA runtime).")
@click.option("--delivery", type=click.Choice(["files", "memory"]), default=None,
              help="How the overlays reach the engine (default: the registry's `delivery`, else files): memory is a "
                   "read-only root with the overlays served by the bundle's import hook (docs/compose.md).")
@click.pass_obj
def render_cmd(app, slug: str | None, render_all: bool, output: Path | None, no_gpu: bool,
               delivery: str | None) -> None:
    """Render one deployment (stdout or -o FILE), or all of them into compose/generated/."""
    from ..compose.check import render_all as _render_all, write_generated
    from ..compose.plan import load_profiles, plan_all, plan_deployment
    from ..compose.registry import load_registry
    from ..compose.render import RenderOptions, render_compose

    if render_all == bool(slug):
        raise ComposeError("give exactly one of SLUG or --all")
    reg = load_registry(app.catalog)
    profiles = load_profiles(app.catalog)
    if render_all:
        if output or no_gpu or delivery:
            raise ComposeError("--all writes the canonical files in compose/generated/; -o, --no-gpu and --delivery "
                               "need a SLUG")
        for s, verb in write_generated(reg, _render_all(plan_all(reg, app.catalog, profiles))).items():
            status(verb, str(reg.generated_path(s)))
        return
    assert slug is not None  # render_all is False here, so the check above saw a SLUG
    options = RenderOptions(gpu=not no_gpu, delivery=delivery)
    text = render_compose(plan_deployment(reg.get(slug), profiles, app.catalog), options)
    if output:
        from .app import write_output

        status(write_output(output, text.encode()), str(output))
    else:
        print_data(text)


@compose_group.command("check")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def check_cmd(app, as_json: bool) -> None:
    """Registry invariants: unique ports, image pins, TP = devices, fits(), generated files current."""
    from ..compose.check import run_check

    report = run_check(app.catalog)
    if as_json:
        print_json({"ok": report.ok, "findings": [f.as_dict() for f in report.findings]})
    else:
        for f in report.findings:
            if not f.ok:
                data.print(f"[red]FAIL[/red] {esc(f.slug)}: {f.check}: {esc(f.message)}", markup=True)
            elif f.warn:
                data.print(f"[yellow]WARN[/yellow] {esc(f.slug)}: {f.check}: {esc(f.message)}", markup=True)
        n = len({f.slug for f in report.findings})
        passed = len(report.findings) - len(report.problems) - len(report.warnings)
        err.print(f"{passed} checks passed, {len(report.warnings)} warnings, {len(report.problems)} failed, "
                  f"{n} deployments")
    if not report.ok:
        raise ComposeError(f"compose check: {len(report.problems)} problem(s)")


@compose_group.command("add")
@click.option("--from-plan", "option", type=click.IntRange(min=1), required=True,
              help="The option number `overlay plan` printed (run with the same --model/--hardware/--gpus).")
@click.option("--model", required=True, type=CatalogChoice("model"), help="Model profile id, as given to plan.")
@click.option("--hardware", required=True, type=CatalogChoice("hardware"),
              help="Hardware profile id, as given to plan.")
@click.option("--gpus", type=click.IntRange(min=1), default=1, show_default=True, help="GPUs, as given to plan.")
@click.option("--ctx", "ctx_len", type=click.IntRange(min=1), default=None, help="--ctx, as given to plan.")
@click.option("--max-seqs", type=click.IntRange(min=1), default=None, help="--max-seqs, as given to plan.")
@click.option("--slug", default=None, help="Deployment name (default: model-weights-hardware-tpN).")
@click.option("--port", type=click.IntRange(1024, 65535), default=None,
              help="Host port (default: the first free from 8100).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def add_cmd(app, option, model, hardware, gpus, ctx_len, max_seqs, slug, port, as_json) -> None:
    """Add plan option N to this user catalog's registry, render its compose file and check it."""
    from ..compose.add import add_from_plan

    res = add_from_plan(app.catalog, option=option, model=model, hardware=hardware, gpus=gpus, ctx=ctx_len,
                        max_seqs=max_seqs, slug=slug, port=port)
    if as_json:
        print_json({"slug": res.slug, "registry": str(res.registry), "generated": str(res.generated),
                    "entry": res.entry, "findings": [f.as_dict() for f in res.findings]})
        return
    status("add", f"{res.slug} -> {res.registry}")
    status("create", str(res.generated))
    for f in res.findings:
        if f.warn:
            err.print(f"[yellow]WARN[/yellow] {esc(f.slug)}: {f.check}: {esc(f.message)}")
    print_data(str(res.generated))
    err.print(f"next: docker compose -f {esc(res.generated)} up -d (it mounts a bundle: `overlay bundle`)")


@click.group("catalog")
def catalog_group() -> None:
    """Your own catalog, layered over the shipped one."""


@catalog_group.command("init")
@click.argument("directory", type=click.Path(path_type=Path))
def catalog_init_cmd(directory: Path) -> None:
    """Make DIR a user catalog: compose/deployments.yaml of its own, the shipped overlays and profiles."""
    from ..catalog import init_catalog

    reg = init_catalog(directory)
    status("create", str(reg))
    err.print(f"use it with `overlay --catalog {esc(directory)} ...` or OVERLAY_CATALOG={esc(directory)}; "
              "add a deployment with `overlay plan ...`, then `compose add --from-plan N ...`")


@click.command("bundle")
@click.option("--python", "python", required=True, help="The image's Python, e.g. 3.12.")
@click.option("--platform", "platform", default="manylinux_2_28_x86_64", show_default=True,
              help="Wheel platform of the image (glibc >= 2.28: manylinux_2_28_x86_64).")
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Bundle directory.")
@click.option("--no-plans", is_flag=True, help="Do not prepare plans for the deployments' pinned releases.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def bundle_cmd(app, python: str, platform: str, output: Path, no_plans: bool, as_json: bool) -> None:
    """Build an offline bundle of this tool + dependencies + catalog (+ prepared plans) for an image's Python."""
    from ..compose.bundle import build_bundle

    res = build_bundle(output, python, platform, app.catalog, plans=not no_plans)
    if as_json:
        print_json({"path": str(res.path), "python": res.python, "platform": res.platform,
                    "packages": res.packages, "size_bytes": res.size_bytes, "plans": list(res.plans)})
    else:
        status("bundle", f"{res.path} (python {res.python}, {res.platform}, {len(res.packages)} packages, "
                         f"{res.size_bytes / 1e6:.1f} MB)")
        for line in res.plans:
            status("plan", esc(line), "dim")


@click.command("verify")
@click.option("--image", required=True, help="Image to check (must be present locally).")
@click.option("--bundle", "bundle", type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="Bundle to mount (default: build one for the image's Python, cached wheels).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def verify_cmd(app, image: str, bundle: Path | None, as_json: bool) -> None:
    """Run IMAGE (no network, no GPU) and report overlay status, vLLM and transformers versions inside it."""
    from ..compose.verify import verify_image

    rep = verify_image(image, app.catalog, bundle)
    if as_json:
        print_json(rep.as_dict())
    else:
        print_data(f"image         {rep.image}\npython        {rep.python} (glibc {rep.glibc})\n"
                   f"vllm          {rep.vllm}\ntransformers  {rep.transformers}\ntorch         {rep.torch}")
        for oid, st in sorted(rep.overlays.items()):
            print_data(f"  {st:<16} {oid}")
    if rep.error:
        raise ComposeError(f"image {image}: `overlay status` failed inside the image (exit {rep.exit_code}): "
                           f"{rep.error}")
    if rep.failing:
        bad = ", ".join(f"{k} {v}" for k, v in sorted(rep.failing.items()))
        raise ComposeError(f"image {image}: overlays that cannot apply as they are: {bad}")


def register(cli: click.Group) -> None:
    """Add this area's commands to the root `overlay` group."""
    cli.add_command(compose_group)
    cli.add_command(catalog_group)
    cli.add_command(bundle_cmd)
    cli.add_command(verify_cmd)
