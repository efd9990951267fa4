"""Single node (TP=1, TP=2 on one machine): a Deployment of one pod with all the GPUs, and its Service."""

from __future__ import annotations

from typing import Any

from ..compose.render import CONTAINER_PORT, ServicePlan
from .pod import PodOptions, labels, pod_annotations, pod_spec, server_container


def _meta(plan: ServicePlan, opts: PodOptions, name: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": labels(plan)}
    if opts.namespace:
        meta["namespace"] = opts.namespace
    return meta


def deployment_objects(plan: ServicePlan, opts: PodOptions, hash_: str) -> list[dict[str, Any]]:
    """Deployment + Service. `Recreate`: a rolling update would need a second set of GPUs while the first runs."""
    container = server_container(plan, opts, list(plan.serve_args), plan.gpus)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(plan, opts, plan.slug),
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app.kubernetes.io/name": plan.slug}},
            "template": {
                "metadata": {"labels": labels(plan), "annotations": pod_annotations(plan, hash_)},
                "spec": pod_spec(plan, opts, container),
            },
        },
    }
    return [deployment, service(plan, opts, {"app.kubernetes.io/name": plan.slug})]


def service(plan: ServicePlan, opts: PodOptions, selector: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(plan, opts, plan.slug),
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [{"name": "http", "port": CONTAINER_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }
