"""CLI commands for engine images: `overlay image {build,context,wheels}` (manager.compose.image)."""

from __future__ import annotations

from pathlib import Path

import click

from ..console import err, print_json, status, user_text as esc


@click.group("image")
def image_group() -> None:
    """Engine images built from the catalog's recipes (compose/images/<name>/)."""


_WHEELS_HELP = ("Wheel cache root: download the recipe's wheels there once (for the base's python and glibc, "
                "pip-hashed) and install them offline. Default: the build's pip downloads from PyPI.")


@image_group.command("build")
@click.argument("name")
@click.option("--base", default=None, help="Base image (local; default the Dockerfile's ARG BASE).")
@click.option("--tag", default=None, help="Image tag (default the recipe's).")
@click.option("--wheels", "wheels", type=click.Path(file_okay=False, path_type=Path), default=None, help=_WHEELS_HELP)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def build_cmd(app, name: str, base: str | None, tag: str | None, wheels: Path | None, as_json: bool) -> None:
    """Assemble the build context of recipe NAME (Dockerfile + overlay bundle + plans) and build it."""
    from ..compose.image import build_image

    res = build_image(name, app.catalog, base=base, tag=tag, wheels=wheels,
                      on_log=lambda line: err.print(esc(line), style="dim"))
    if as_json:
        print_json(res.as_dict())
        return
    verb = "cached" if res.cached else "built"
    status(verb, f"{res.tag} from {res.base} (python {res.python}, {res.size_bytes / 1e9:.2f} GB, "
                 f"{res.seconds:.0f} s)")
    if res.wheels is not None:
        status("wheels", f"{res.wheels.path} ({res.wheels.count} wheels, "
                         f"{res.wheels.size_bytes / 1e9:.2f} GB, {'cached' if res.wheels.cached else 'downloaded'})",
               "dim")
    for line in res.context.plans:
        status("plan", line, "dim")


@image_group.command("context")
@click.argument("name")
@click.option("--python", "python", required=True, help="The base image's Python, e.g. 3.12.")
@click.option("--platform", "platform", default="manylinux_2_28_x86_64", show_default=True,
              help="Wheel platform of the bundle (the base's glibc).")
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="New directory for the context.")
@click.pass_obj
def context_cmd(app, name: str, python: str, platform: str, output: Path) -> None:
    """Write the build context of recipe NAME for a plain `docker build` (wheels from PyPI)."""
    from ..compose.image import load_recipe, write_context

    ctx = write_context(load_recipe(app.catalog, name), app.catalog, output, python, platform)
    status("context", f"{ctx.path} (bundle {ctx.bundle_bytes / 1e6:.1f} MB)")
    for line in ctx.plans:
        status("plan", line, "dim")


@image_group.command("wheels")
@click.argument("name")
@click.option("--python", "python", required=True, help="The image's Python, e.g. 3.12.")
@click.option("--platform", "platform", default="manylinux_2_36_x86_64", show_default=True,
              help="Newest manylinux tag of the image's glibc (bookworm: 2.36).")
@click.option("--wheels", "wheels", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Wheel cache root (default <OVERLAY_CACHE>/wheels/NAME).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def wheels_cmd(app, name: str, python: str, platform: str, wheels: Path | None, as_json: bool) -> None:
    """Download (once) every wheel of recipe NAME for an image's python/platform, with a hash lock."""
    from ..compose.image import load_recipe
    from ..compose.wheels import wheel_set

    ws = wheel_set(load_recipe(app.catalog, name), python, platform, wheels)
    if as_json:
        print_json({"path": str(ws.path), "lock": str(ws.lock), "count": ws.count, "size_bytes": ws.size_bytes,
                    "cached": ws.cached})
        return
    status("cached" if ws.cached else "downloaded", f"{ws.path} ({ws.count} wheels, {ws.size_bytes / 1e9:.2f} GB)")


def register(cli: click.Group) -> None:
    """Add this area's commands to the root `overlay` group."""
    cli.add_command(image_group)
