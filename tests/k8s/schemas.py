"""Offline validation of rendered Kubernetes objects with kubernetes-validate's bundled JSON schemas.

The core objects (Deployment, Service) are validated as they are. A LeaderWorkerSet is a CRD the package does not
carry: its leader and worker pod templates are validated as core `v1 PodTemplate` objects (the CRD embeds
PodTemplateSpec), its own fields are not. A production-stack values file is no Kubernetes object: the pod the chart
would build from it (initContainer, extraVolumes, extraVolumeMounts, env, security contexts) is validated as a
`v1 Pod`, the chart's templating itself is not (no Helm here).
"""

from __future__ import annotations

from typing import Any

import pytest

kv = pytest.importorskip("kubernetes_validate")

# The Kubernetes releases the rendered objects are validated for (strict schemas: unknown fields are errors).
VERSIONS = ("1.30.0", "1.33.0", "1.37.0")


def validate(obj: dict[str, Any], version: str) -> str:
    """Validate one object; returns the schema version used (raises kubernetes_validate's ValidationError)."""
    return kv.validate(obj, version, strict=True)


def core_objects(kind_objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What kubernetes-validate can check of a rendering (see the module docstring)."""
    out: list[dict[str, Any]] = []
    for obj in kind_objects:
        if obj.get("kind") == "LeaderWorkerSet":
            t = obj["spec"]["leaderWorkerTemplate"]
            for role in ("leaderTemplate", "workerTemplate"):
                out.append({"apiVersion": "v1", "kind": "PodTemplate",
                            "metadata": {"name": f"{obj['metadata']['name']}-{role.lower()}"}, "template": t[role]})
        elif "servingEngineSpec" in obj:
            out += [chart_pod(obj, m) for m in obj["servingEngineSpec"]["modelSpec"]]
        else:
            out.append(obj)
    return out


def chart_pod(values: dict[str, Any], m: dict[str, Any]) -> dict[str, Any]:
    """The pod production-stack's deployment-vllm-multi.yaml builds from one modelSpec (the fields we set)."""
    engine = values["servingEngineSpec"]
    init = m["initContainer"]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": m["name"], "annotations": m["podAnnotations"]},
        "spec": {
            "securityContext": engine["securityContext"],
            "runtimeClassName": engine["runtimeClassName"],
            "initContainers": [{"name": init["name"], "image": init["image"], "command": init["command"],
                                "resources": init["resources"], "volumeMounts": init["extraVolumeMounts"],
                                "securityContext": engine["containerSecurityContext"]}],
            "containers": [{
                "name": "vllm", "image": f"{m['repository']}:{m['tag']}",
                "command": ["vllm", "serve", m["modelURL"], "--host", "0.0.0.0", "--port", "8000",
                            "--enable-prefix-caching", *m["vllmConfig"]["extraArgs"]],
                "env": m["env"], "volumeMounts": m["extraVolumeMounts"],
                "resources": {"requests": {"cpu": str(m["requestCPU"]), "memory": m["requestMemory"],
                                           "nvidia.com/gpu": str(m["requestGPU"])},
                              "limits": {"nvidia.com/gpu": str(m["requestGPU"])}},
                "securityContext": engine["containerSecurityContext"],
            }],
            "volumes": m["extraVolumes"],
        },
    }
