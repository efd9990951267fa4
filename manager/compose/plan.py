"""From a registry entry to a ServicePlan: profiles give the image and serve flags, fits() the overlays."""

from __future__ import annotations

import json
import re
from typing import Any

from ..catalog import Catalog
from ..errors import ComposeError
from .registry import Deployment, Registry
from .render import CONTAINER_PORT, MODELS_MOUNT, ServicePlan

FAIL_RESULTS = ("fail", "failed", "error", "no")


def _get(obj: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        if isinstance(obj, dict) and name in obj:
            return obj[name]
        if obj is not None and not isinstance(obj, dict) and getattr(obj, name, None) is not None:
            return getattr(obj, name)
    return default


def _lookup(table: Any, key: str, kind: str, slug: str) -> Any:
    try:
        return table[key]
    except (KeyError, TypeError):
        known = ", ".join(sorted(table)) if isinstance(table, dict) else "none"
        raise ComposeError(f"deployments.{slug}.{kind}: no {kind} profile {key!r} (known: {known})") from None


def _sm(hardware: Any) -> float | None:
    raw = _get(hardware, "sm", "compute_capability")
    if raw is None:
        return None
    try:
        return float(raw)
    except (TypeError, ValueError):
        return None


def _weights(model: Any, weights_id: str | None, slug: str) -> Any:
    if weights_id is None:
        return None
    table = _get(model, "weights", default=None)
    if isinstance(table, dict):
        return _lookup(table, weights_id, "weights", slug)
    if isinstance(table, (list, tuple)):
        for w in table:
            if _get(w, "id", "name") == weights_id:
                return w
        raise ComposeError(f"deployments.{slug}.weights: model has no weights variant {weights_id!r}")
    return None


def overlay_kinds(catalog: Catalog) -> dict[str, tuple[bool, bool]]:
    """id -> (has edits: goes to `overlay apply`, has a `kernels:` section: goes to `overlay build`).

    A kernel overlay usually has both: edits that route vLLM to the kernels (applied like any
    overlay) and the kernel sources `overlay build` compiles into the cache.
    """
    try:
        from ..overlays import load_overlays
    except ImportError:  # pragma: no cover - the overlay engine ships with the package
        return {}
    out: dict[str, tuple[bool, bool]] = {}
    for ov in load_overlays(catalog):
        manifest = getattr(ov, "manifest", ov)
        oid = str(getattr(ov, "id", None) or getattr(manifest, "id"))
        out[oid] = (bool(getattr(manifest, "edits", None)), bool(getattr(manifest, "kernels", None)))
    return out


_REPO_PATH = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$")


def _models_path(raw: Any, what: str, slug: str) -> str:
    text = str(raw)
    if not _REPO_PATH.match(text):
        raise ComposeError(
            f"deployments.{slug}: {what} {text!r} is not a repo id or relative path; set model_dir in the registry"
        )
    return f"{MODELS_MOUNT}/{text}"


# The command that starts the OpenAI server, per engine profile `server` (manager/profiles/schema.py).
SERVER_COMMANDS: dict[str, tuple[str, ...]] = {
    "vllm-serve": ("vllm", "serve"),
    "openai-api-server": ("python3", "-m", "vllm.entrypoints.openai.api_server"),
}


def serve_args(dep: Deployment, model: Any, weights: Any, hardware: Any, drafter: Any,
               engine: Any = None) -> tuple[str, ...]:
    """The server's arguments (everything after `vllm serve`, or after the api_server module), from the
    registry entry and profiles. The API server module takes the model as `--model` (only `vllm serve` maps its
    positional model_tag to --model); a CPU engine gets no GPU flags."""
    cpu = _get(engine, "device", default="cuda") == "cpu"
    if dep.model_dir:
        model_path = f"{MODELS_MOUNT}/{dep.model_dir}"
    else:
        repo = _get(weights, "hf_repo", "repo", "path") or _get(model, "hf_repo", "repo") or dep.model
        model_path = _models_path(repo, "weights hf_repo", dep.slug)
    served = dep.served_name or _get(model, "served_name") or dep.model
    server = _get(engine, "server", default="vllm-serve")
    args: list[str] = [
        *(["--model"] if server == "openai-api-server" else []),
        model_path,
        "--served-model-name", str(served),
        "--host", "0.0.0.0",
        "--port", str(CONTAINER_PORT),
        "--tensor-parallel-size", str(dep.tp),
        "--max-model-len", str(dep.ctx),
        "--max-num-seqs", str(dep.max_seqs),
    ]
    if not cpu:  # the CPU build sizes its KV cache from VLLM_CPU_KVCACHE_SPACE, not a GPU memory fraction
        args += ["--gpu-memory-utilization",
                 f"{float(dep.gpu_memory_utilization or _get(hardware, 'safe_mem_util') or 0.9):.2f}"]
    sm = _sm(hardware)
    if not cpu and sm is not None and sm < 8.0:
        args += ["--dtype", "float16"]
    if dep.kv_dtype:
        args += ["--kv-cache-dtype", dep.kv_dtype]
    if drafter is not None:
        spec = dict(_get(drafter, "speculative_config", default={}) or {})
        repo = _get(drafter, "hf_repo", "repo") or spec.get("model") or dep.drafter
        spec["model"] = _models_path(repo, "drafter hf_repo", dep.slug)
        tokens = dep.num_speculative_tokens or _get(drafter, "default_tokens") or spec.get("num_speculative_tokens")
        if tokens:
            spec["num_speculative_tokens"] = int(tokens)
        args += ["--speculative-config", json.dumps(spec, sort_keys=True, separators=(",", ":"))]
    args += list(dep.extra_args)
    return tuple(args)


def fit_report(profiles: Any, dep: Deployment, catalog: Catalog) -> Any:
    from ..fits import fits  # the profiles engineer's contract

    return fits(
        profiles,
        model=dep.model,
        hardware=dep.hardware,
        gpus=dep.gpus,
        tp=dep.tp,
        weights=dep.weights,
        engine=dep.engine,
        drafter=dep.drafter,
        ctx=dep.ctx,
        kv_dtype=dep.kv_dtype,
        max_seqs=dep.max_seqs,
        catalog=catalog,
    )


def failing_constraints(report: Any) -> tuple[str, ...]:
    out = []
    for c in _get(report, "constraints", default=()) or ():
        if str(_get(c, "result", default="")).lower() in FAIL_RESULTS:
            out.append(str(_get(c, "id", default="?")))
    return tuple(out)


def plan_warnings(report: Any) -> tuple[str, ...]:
    """Header warnings: every failing constraint and every unverified profile field the verdict rests on."""
    out = []
    for c in _get(report, "constraints", default=()) or ():
        if str(_get(c, "result", default="")).lower() in FAIL_RESULTS:
            out.append(f"fits() fails {_get(c, 'id')}: {_get(c, 'message')}")
    for field_ in _get(report, "unverified", default=()) or ():
        out.append(f"unverified: {field_}")
    return tuple(out)


def plan_deployment(dep: Deployment, profiles: Any, catalog: Catalog, report: Any = None,
                    kinds: dict[str, tuple[bool, bool]] | None = None) -> ServicePlan:
    engine = _lookup(profiles.engines, dep.engine, "engine", dep.slug)
    model = _lookup(profiles.models, dep.model, "model", dep.slug)
    hardware = _lookup(profiles.hardware, dep.hardware, "hardware", dep.slug)
    drafter = _lookup(profiles.drafters, dep.drafter, "drafter", dep.slug) if dep.drafter else None
    weights = _weights(model, dep.weights, dep.slug)
    image = _get(engine, "image")
    if not image:
        raise ComposeError(f"engine profile {dep.engine!r} has no image pin")
    if report is None:
        report = fit_report(profiles, dep, catalog)
    if kinds is None:
        kinds = overlay_kinds(catalog)
    needed = [str(i) for i in (_get(report, "overlays", default=()) or ())]
    return ServicePlan(
        slug=dep.slug,
        image=str(image),
        serve_args=serve_args(dep, model, weights, hardware, drafter, engine),
        server_command=SERVER_COMMANDS[str(_get(engine, "server", default="vllm-serve"))],
        device=str(_get(engine, "device", default="cuda")),
        overlays=tuple(i for i in needed if kinds.get(i, (True, False))[0]),
        kernel_overlays=tuple(i for i in needed if kinds.get(i, (True, False))[1]),
        gpus=dep.gpus,
        tp=dep.tp,
        port=dep.port,
        status=dep.status,
        note=dep.note,
        engine=dep.engine,
        vllm_version=str(_get(engine, "vllm_version", default="")),
        model=dep.model,
        hardware=dep.hardware,
        env=dict(dep.env),
        shm_size=dep.shm_size,
        verdict=str(_get(report, "verdict", default="")),
        failing=failing_constraints(report),
        warnings=plan_warnings(report),
    )


def load_profiles(catalog: Catalog) -> Any:
    from ..profiles import load_profiles as _load  # the profiles engineer's contract

    return _load(catalog)


def plan_all(registry: Registry, catalog: Catalog, profiles: Any = None) -> dict[str, ServicePlan]:
    profiles = profiles if profiles is not None else load_profiles(catalog)
    kinds = overlay_kinds(catalog)
    return {
        slug: plan_deployment(dep, profiles, catalog, kinds=kinds)
        for slug, dep in sorted(registry.deployments.items())
    }
