"""A values file for vLLM's production-stack Helm chart (one `servingEngineSpec.modelSpec[]` entry).

Field names as the chart reads them: chart `vllm-stack` 0.1.12, https://github.com/vllm-project/production-stack
commit a6c01db05f65f556235413ba8dbcfb0c01132fff, files helm/values.yaml (the modelSpec field list),
helm/values.schema.json and helm/templates/deployment-vllm-multi.yaml (how each field is rendered).

The chart starts the container itself (`vllm serve <modelURL> --host 0.0.0.0 --port 8000 ...`, no entrypoint
of ours), so in-memory delivery here rests on the environment alone: the bundle's `memory/` directory on
PYTHONPATH installs the import hook, which checks every target's hash at import. There is no pre-start step:
a deployment that needs kernels built (`overlay build`) or a server other than `vllm serve` is refused.
"""

from __future__ import annotations

from typing import Any

from ..compose.memory import MEMORY_DIR
from ..compose.render import BUNDLE_MOUNT, ServicePlan
from ..errors import ComposeError
from .pod import PodOptions, init_container, security_context, server_env, volumes
from .pod import server_container as _server_container

CHART = "vllm-stack 0.1.12 (vllm-project/production-stack a6c01db05f65f556235413ba8dbcfb0c01132fff, helm/values.yaml)"
# set by the chart itself (deployment-vllm-multi.yaml): not repeated in extraArgs
_CHART_FLAGS = ("--host", "--port")


def _extra_args(plan: ServicePlan) -> list[str]:
    args, out, i = list(plan.serve_args), [], 1  # [0]: the model path, the chart's modelURL
    while i < len(args):
        if args[i] in _CHART_FLAGS:
            i += 2
            continue
        out.append(args[i])
        i += 1
    return out


def _image(image: str) -> tuple[str, str]:
    name, sep, tag = image.rpartition(":")
    if not sep or "/" in tag:
        return image, "latest"
    return name, tag


def helm_values(plan: ServicePlan, opts: PodOptions, hash_: str, pod_annots: dict[str, str]) -> dict[str, Any]:
    if plan.kernel_overlays:
        raise ComposeError(f"{plan.slug}: helm-values: the chart runs `vllm serve` itself (no pre-start step), so "
                           f"the kernel overlays {', '.join(plan.kernel_overlays)} cannot be built; use --layout "
                           "deployment")
    if plan.server_command != ("vllm", "serve") or plan.device != "cuda":
        raise ComposeError(f"{plan.slug}: helm-values: the chart runs `vllm serve` on GPUs; engine {plan.engine!r} "
                           f"starts {' '.join(plan.server_command)} on {plan.device}")
    server = _server_container(plan, opts, [], plan.gpus)
    env = server_env(plan, {"PYTHONPATH": f"{BUNDLE_MOUNT}/{MEMORY_DIR}"})
    repository, tag = _image(plan.image)
    init = init_container(opts)
    spec: dict[str, Any] = {
        "name": plan.slug,
        "repository": repository,
        "tag": tag,
        "modelURL": plan.serve_args[0],
        "replicaCount": 1,
        # not in the registry: what the pod asks of a node besides its GPUs (set for yours)
        "requestCPU": 4,
        "requestMemory": "16Gi",
        "requestGPU": plan.gpus,
        "podAnnotations": pod_annots,
        "initContainer": {
            "name": init["name"],
            "image": init["image"],
            "command": init["command"],
            "resources": init["resources"],
            "mountPvcStorage": False,
            "extraVolumeMounts": init["volumeMounts"],
        },
        "extraVolumes": volumes(plan, opts),
        "extraVolumeMounts": server["volumeMounts"],
        "env": env,
        "vllmConfig": {
            # the chart adds --no-enable-prefix-caching unless this is true; vLLM's own default is on
            "enablePrefixCaching": True,
            "extraArgs": _extra_args(plan),
        },
    }
    return {
        "servingEngineSpec": {
            "runtimeClassName": "nvidia",
            "securityContext": {"runAsNonRoot": True, "runAsUser": opts.run_as_user,
                                "runAsGroup": opts.run_as_user, "fsGroup": opts.run_as_user,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containerSecurityContext": security_context(opts),
            "modelSpec": [spec],
        },
    }
