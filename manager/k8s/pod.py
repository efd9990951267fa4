"""The pod every layout runs: the bundle's initContainer, the read-only server container, volumes, security.

Delivery: an initContainer from a small bundle image (`cp -Rp /bundle/* /opt/overlay/`) fills an emptyDir that
the server mounts read-only. A ConfigMap cannot carry a bundle (its data is capped at 1 MiB, the bundle's
wheels are ~29 MB) and a hostPath would tie the pod to prepared nodes; an emptyDir filled at pod start needs
nothing but an image the cluster can pull. The server runs in memory mode (manager/compose/memory.py): the
root filesystem stays read-only, every path it writes is an emptyDir, and no file of the image changes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .. import __version__
from ..compose.memory import MEMORY_WRITABLE_PATHS, RUNTIME_CACHE, memory_entrypoint_script, memory_environment
from ..compose.render import BUNDLE_MOUNT, CONTAINER_PORT, KERNEL_CACHE, MODELS_MOUNT, ServicePlan, _env_items
from ..errors import ComposeError
from .planhash import PLAN_HASH_ANNOTATION, PLAN_HASH_ENV, rank_check_script, selected_ids

BUNDLE_SOURCE = "/bundle"  # where the bundle image holds the bundle
DEFAULT_SHM = "8Gi"  # compose's `ipc: host` has no size; a Memory emptyDir needs one (the registry's shm_size wins)
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$")
_SHM = {"b": "", "k": "Ki", "kb": "Ki", "m": "Mi", "mb": "Mi", "g": "Gi", "gb": "Gi"}


@dataclass(frozen=True)
class PodOptions:
    """What the registry does not say about a cluster: the bundle image, the models claim, the user to run as."""

    bundle_image: str = f"overlay-manager/bundle:{__version__}"
    models_claim: str = "models"
    run_as_user: int = 1000
    namespace: str | None = None

    def check(self) -> None:
        if not _IMAGE.match(self.bundle_image):
            raise ComposeError(f"--bundle-image {self.bundle_image!r} is not an image reference")
        for what, value in (("--models-claim", self.models_claim), ("--namespace", self.namespace)):
            if value is not None and (len(value) > 63 or not _NAME.match(value)):
                raise ComposeError(f"{what} {value!r} is not a Kubernetes name (lower-case letters, digits, '-')")
        if not 1 <= self.run_as_user <= 2**31 - 1:
            raise ComposeError(f"--run-as-user {self.run_as_user} must be a non-root uid (1 to 2147483647)")


def shm_quantity(shm_size: str | None) -> str:
    """The registry's Compose-style shm_size ('8gb') as a Kubernetes quantity ('8Gi')."""
    if shm_size is None:
        return DEFAULT_SHM
    m = re.fullmatch(r"([0-9]+)(b|k|m|g|kb|mb|gb)", shm_size)
    if m is None:
        raise ComposeError(f"shm_size {shm_size!r} must look like '8gb'")
    return m.group(1) + _SHM[m.group(2)]


def _volume_name(path: str) -> str:
    return "w" + re.sub(r"[^a-z0-9]+", "-", path.lower()).rstrip("-")


def writable_paths() -> tuple[str, ...]:
    """The paths the server writes in memory mode (/dev/shm has its own Memory volume)."""
    return tuple(p for p in MEMORY_WRITABLE_PATHS if p != "/dev/shm")


def security_context(opts: PodOptions) -> dict[str, Any]:
    """The restricted Pod Security Standard's container settings, root filesystem read-only."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": opts.run_as_user,
        "runAsGroup": opts.run_as_user,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def volumes(plan: ServicePlan, opts: PodOptions) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"name": "overlay-bundle", "emptyDir": {"sizeLimit": "512Mi"}},
        {"name": "models", "persistentVolumeClaim": {"claimName": opts.models_claim, "readOnly": True}},
        {"name": "kernel-cache", "emptyDir": {"sizeLimit": "4Gi"}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_quantity(plan.shm_size)}},
    ]
    out += [{"name": _volume_name(p), "emptyDir": {"sizeLimit": "8Gi"}} for p in writable_paths()]
    return out


def init_container(opts: PodOptions) -> dict[str, Any]:
    """The bundle image's copy into the bundle volume (then the server mounts it read-only)."""
    return {
        "name": "overlay-bundle",
        "image": opts.bundle_image,
        "command": ["/bin/sh", "-c", 'set -eu; cp -Rp "$0"/* "$1"/; test -x "$1"/bin/overlay',
                    BUNDLE_SOURCE, BUNDLE_MOUNT],
        "volumeMounts": [{"name": "overlay-bundle", "mountPath": BUNDLE_MOUNT}],
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": security_context(opts),
    }


def server_env(plan: ServicePlan, extra: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Compose's environment, the in-memory delivery's, HOME on a writable volume, and the plan-hash annotation."""
    env = dict(_env_items(plan))
    env.update(memory_environment(BUNDLE_MOUNT, KERNEL_CACHE, selected_ids(plan)))
    env["HOME"] = f"{RUNTIME_CACHE}/home"  # a uid without a passwd entry gets HOME=/ (read-only)
    # and getpass.getuser() fails for it unless LOGNAME/USER is set: torch's inductor calls it at import
    # (torch/_inductor/runtime/cache_dir_utils.py default_cache_dir, torch 2.11: tests/k8s pod semantics)
    env["USER"] = env["LOGNAME"] = "vllm"
    env.update(extra or {})
    out: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(env.items())]
    out.append({"name": PLAN_HASH_ENV, "valueFrom": {"fieldRef": {
        "fieldPath": f"metadata.annotations['{PLAN_HASH_ANNOTATION}']"}}})
    return out


def entrypoint(plan: ServicePlan, rank_flags: bool = False) -> str:
    """The plan-hash check, then memory mode's script (check plans, build kernels, exec the server)."""
    check = rank_check_script(selected_ids(plan), BUNDLE_MOUNT, rank_flags)
    script = memory_entrypoint_script(plan, BUNDLE_MOUNT, KERNEL_CACHE)
    head, sep, rest = script.partition("set -eu\n")
    if not sep:
        raise ComposeError(f"{plan.slug}: the memory-mode entrypoint has no `set -eu` line to follow")
    home = '# HOME is on the /tmp volume (a uid without a passwd entry would get the read-only /)\nmkdir -p "$HOME"\n'
    return head + sep + home + check + rest


def _probe(period: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": period, "timeoutSeconds": 10,
            "failureThreshold": failures}


def server_container(plan: ServicePlan, opts: PodOptions, args: list[str], gpus: int, *,
                     serving: bool = True, rank_flags: bool = False) -> dict[str, Any]:
    """The server: read-only root, the rendered entrypoint and arguments, GPUs, probes on /health when `serving`."""
    mounts = [
        {"name": "overlay-bundle", "mountPath": BUNDLE_MOUNT, "readOnly": True},
        {"name": "models", "mountPath": MODELS_MOUNT, "readOnly": True},
        {"name": "kernel-cache", "mountPath": KERNEL_CACHE},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ] + [{"name": _volume_name(p), "mountPath": p} for p in writable_paths()]
    c: dict[str, Any] = {
        "name": "vllm",
        "image": plan.image,
        "command": ["/bin/sh", "-c", entrypoint(plan, rank_flags), "overlay-entrypoint"],
        "args": list(args),
        "env": server_env(plan),
        "volumeMounts": mounts,
        "securityContext": security_context(opts),
    }
    if serving:
        c["ports"] = [{"name": "http", "containerPort": CONTAINER_PORT, "protocol": "TCP"}]
        # startup: up to 600 s (compose's start_period) for weights, kernels and graph capture
        c["startupProbe"] = _probe(10, 60)
        c["readinessProbe"] = _probe(5, 3)
        c["livenessProbe"] = _probe(15, 5)
    if plan.device == "cuda":
        c["resources"] = {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}}
    return c


def pod_spec(plan: ServicePlan, opts: PodOptions, container: dict[str, Any]) -> dict[str, Any]:
    return {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": opts.run_as_user,
            "runAsGroup": opts.run_as_user,
            "fsGroup": opts.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationGracePeriodSeconds": 30,
        "initContainers": [init_container(opts)],
        "containers": [container],
        "volumes": volumes(plan, opts),
    }


def labels(plan: ServicePlan) -> dict[str, str]:
    return {"app.kubernetes.io/name": plan.slug, "app.kubernetes.io/managed-by": "overlay-manager"}


def pod_annotations(plan: ServicePlan, hash_: str) -> dict[str, str]:
    return {
        PLAN_HASH_ANNOTATION: hash_,
        "overlay-manager.io/overlays": " ".join(selected_ids(plan)),
        "overlay-manager.io/vllm-version": plan.vllm_version,
        "overlay-manager.io/engine": plan.engine,
    }
