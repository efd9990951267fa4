"""Multi-node: a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1, LWS >= 0.6) whose pods carry one overlay set.

vLLM's own multi-node form (no Ray): every rank runs `vllm serve MODEL ... --nnodes N --node-rank R
--master-addr LEADER --master-port 29501`, workers with `--headless` (vLLM 0.19.1, 0.20.0 and 0.24.0
vllm/engine/arg_utils.py add `--nnodes`/`--node-rank`/`--master-addr`/`--master-port`;
vllm/entrypoints/cli/serve.py runs a rank > 0 as a headless multiproc executor). LWS sets LWS_WORKER_INDEX and
LWS_LEADER_ADDRESS in each pod; the entrypoint appends them, after checking its plan hash against the pod
annotation both templates carry (manager/k8s/planhash.py).
"""

from __future__ import annotations

from typing import Any

from ..compose.render import ServicePlan
from ..errors import ComposeError
from .deployment import _meta, service
from .pod import PodOptions, labels, pod_annotations, pod_spec, server_container

MASTER_PORT = 29501  # vLLM's ParallelConfig.master_port default (vllm/config/parallel.py, 0.20.0)
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"


def default_nodes(plan: ServicePlan) -> int:
    """One GPU per node unless told: the TP ranks spread over `tp` nodes."""
    return plan.tp


def lws_objects(plan: ServicePlan, opts: PodOptions, hash_: str, nodes: int | None = None) -> list[dict[str, Any]]:
    n = default_nodes(plan) if nodes is None else nodes
    if n < 1 or plan.tp % n:
        raise ComposeError(f"{plan.slug}: --nodes {n} does not divide tp={plan.tp} "
                           "(vLLM needs world_size % nnodes == 0)")
    if plan.server_command != ("vllm", "serve"):
        raise ComposeError(f"{plan.slug}: engine {plan.engine!r} starts {' '.join(plan.server_command)}, which has "
                           "no --headless worker form; LeaderWorkerSet needs `vllm serve`")
    base = [*plan.serve_args, "--nnodes", str(n), "--master-port", str(MASTER_PORT)]
    per_node = plan.tp // n

    def template(role: str, args: list[str], serving: bool) -> dict[str, Any]:
        container = server_container(plan, opts, args, per_node, serving=serving, rank_flags=True)
        return {
            "metadata": {"labels": {**labels(plan), "role": role}, "annotations": pod_annotations(plan, hash_)},
            "spec": pod_spec(plan, opts, container),
        }

    lws = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": _meta(plan, opts, plan.slug),
        "spec": {
            "replicas": 1,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": n,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": template("leader", base, True),
                "workerTemplate": template("worker", [*base, "--headless"], False),
            },
        },
    }
    return [lws, service(plan, opts, {LWS_NAME_LABEL: plan.slug, "role": "leader"})]
