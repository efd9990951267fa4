"""`overlay` command line: thin click callbacks over library functions.

One Application object lives in ctx.obj (catalog, cache, output mode). One
error handler maps ManagerError -> exit 1 (a one-line message),
KeyboardInterrupt -> 130, anything else -> exit 3 with a crash log.
Each area registers its commands from its own module (overlays, profiles,
compose, upstream, build) so the callbacks stay next to nothing but parsing.
"""

from __future__ import annotations

import sys

import click

from .. import __version__
from . import app
from .app import Application, handle_errors
from . import build, completion, compose, engine, image, inspect, k8s, overlays, profiles, upstream, upstream_tests


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="overlay")
@click.option(
    "--catalog",
    "catalog",
    type=click.Path(file_okay=False, path_type=str),
    envvar="OVERLAY_CATALOG",
    default=None,
    help="Catalog directory holding overlays/, profiles/ and compose/ (default: the shipped catalog).",
)
@click.pass_context
def cli(ctx: click.Context, catalog: str | None) -> None:
    """Overlays, fit checks and compose deployments for vLLM."""
    ctx.obj = Application(catalog_arg=catalog)
    from ..releases import set_progress
    from .progress import DownloadProgress

    set_progress(DownloadProgress())


@cli.result_callback()
@click.pass_context
def _exit_status(ctx: click.Context, rv: object, **_: object) -> object:
    """Every command returns its exit status (an int; None = 0): a non-zero one ends the run with it
    (also under click's standalone mode), zero is handed back as the command returned it."""
    if isinstance(rv, int) and rv:
        ctx.exit(rv)
    return rv


for _module in (overlays, profiles, compose, k8s, image, upstream, upstream_tests, build, inspect, engine, completion):
    _module.register(cli)
app.accept_catalog_anywhere(cli)


def main(argv: list[str] | None = None) -> None:
    with handle_errors() as result:
        rc = cli.main(args=argv, prog_name="overlay", standalone_mode=False)
        result.code = rc if isinstance(rc, int) else 0
    sys.exit(result.code)
