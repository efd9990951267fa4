"""CLI commands for Kubernetes rendering: `k8s render`."""

from __future__ import annotations

from pathlib import Path

import click

from ..console import print_data, status
from ..errors import ComposeError
from .params import CatalogChoice


@click.group("k8s")
def k8s_group() -> None:
    """Deployments from compose/deployments.yaml rendered for Kubernetes (read-only pods, in-memory overlays)."""


@k8s_group.command("render")
@click.argument("slug", required=False, type=CatalogChoice("deployment"))
@click.option("--all", "render_all", is_flag=True, help="Every deployment of the registry (needs -o DIR).")
@click.option("-o", "--output", type=click.Path(path_type=Path),
              help="FILE for one SLUG, or an existing DIR (<slug>.<layout>.yaml per deployment).")
@click.option("--layout", type=click.Choice(["deployment", "lws", "helm-values"]), default="deployment",
              show_default=True, help="Deployment + Service, LeaderWorkerSet (multi-node), or production-stack values.")
@click.option("--nodes", type=int, default=None, help="LeaderWorkerSet group size (default: tp, one GPU per node).")
@click.option("--bundle-image", default=None, help="Image holding the bundle under /bundle (docs/kubernetes.md).")
@click.option("--models-claim", default="models", show_default=True, help="PVC holding the weights (read-only).")
@click.option("--namespace", default=None, help="metadata.namespace of every object (default: none).")
@click.option("--run-as-user", type=int, default=1000, show_default=True, help="The non-root uid the pods run as.")
@click.pass_obj
def render_cmd(app, slug, render_all, output, layout, nodes, bundle_image, models_claim, namespace,
               run_as_user) -> None:
    """Render one deployment (stdout or -o FILE), or all of them into -o DIR."""
    from ..k8s.pod import PodOptions
    from ..k8s.render import render, write

    if render_all == bool(slug):
        raise ComposeError("give exactly one of SLUG or --all")
    if render_all and output is None:
        raise ComposeError("--all writes one file per deployment: give -o DIR")
    opts = PodOptions(models_claim=models_claim, namespace=namespace, run_as_user=run_as_user,
                      **({"bundle_image": bundle_image} if bundle_image is not None else {}))
    rendered = render(app.catalog, None if render_all else [slug], layout, opts, nodes)
    if output is None:
        print_data(rendered[0].text)
        return
    into_dir = render_all or output.is_dir()
    for verb, path in write(rendered, output, into_dir):
        status(verb, str(path))


def register(cli: click.Group) -> None:
    """Add this area's commands to the root `overlay` group."""
    cli.add_command(k8s_group)
