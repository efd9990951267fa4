"""CLI commands for this area (registered on the root group): `overlay build`."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from .params import CatalogChoice


class ConsoleProgress:
    """builder.BuildProgress on stderr: a spinner while NVRTC compiles, one status line per object."""

    def compiling(self, overlay: str, source: str, arch: str, compiler: str):
        from .. import console

        return console.err.status(f"compiling {escape(f'{overlay}/{source} [{arch}]')} with {compiler}")

    def built(self, item, seconds: float) -> None:
        from .. import console

        style = "green" if item.action == "compiled" else ("yellow" if item.action == "rebuilt" else "cyan")
        # status() shows its subject literally (it escapes once): no escape here, or `\[` shows
        console.status(item.action, f"{item.overlay}/{item.source} [{item.arch}] {item.key[:12]} ({seconds:.1f}s)",
                       style=style)


@click.command("build")
@click.argument("ids", nargs=-1, type=CatalogChoice("overlay", validate=False))
@click.option("--arch", "archs", multiple=True, metavar="ARCH",
              help="sm_XY / compute_XY (repeatable): PTX for the lowest virtual arch plus a cubin "
                   "per real arch. Default: the overlay's kernels.archs.")
@click.option("--cache", "cache", type=click.Path(file_okay=False, path_type=Path), default=None,
              envvar="OVERLAY_KERNEL_CACHE",
              help="Kernel cache directory (default $OVERLAY_KERNEL_CACHE or <OVERLAY_CACHE>/kernels).")
@click.option("--nvrtc", "nvrtc", type=click.Path(path_type=str), default=None, envvar="OVERLAY_NVRTC",
              help="libnvrtc.so path or a directory holding it (default: the nvidia-cuda-nvrtc-cu12 "
                   "wheel in site-packages, then CUDA_HOME / /usr/local/cuda).")
@click.option("--json", "as_json", is_flag=True, help="Print the build result as JSON on stdout.")
@click.pass_obj
def build_cmd(app, ids: tuple[str, ...], archs: tuple[str, ...], cache: Path | None, nvrtc: str | None,
              as_json: bool) -> None:
    """Compile kernel overlays (csrc/*.cu + kernels:) with NVRTC into a content-addressed cache.

    IDS: overlays to build (default: every overlay with a kernels: section).
    A warm cache compiles nothing; corrupted entries are rebuilt.
    """
    from .. import console
    from ..kernels import builder

    result = builder.build(app.catalog.overlays_dir, ids, archs or None, cache, nvrtc, progress=ConsoleProgress())
    console.err.print(builder.summary(result))
    if as_json:
        console.print_json(result.to_json())


def register(cli: click.Group) -> None:
    """Add this area's commands to the root `overlay` group."""
    for cmd in (build_cmd,):
        cli.add_command(cmd)
