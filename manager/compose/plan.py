"""From a registry entry to a ServicePlan: profiles give the image and serve flags, fits() the overlays."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, TypeVar
from collections.abc import Mapping

from ..catalog import Catalog
from ..errors import ComposeError
from .registry import Deployment, Registry
from .render import CONTAINER_PORT, MODELS_MOUNT, ServicePlan

if TYPE_CHECKING:
    from ..fits import FitReport
    from ..profiles import Profiles
    from ..profiles.schema import DrafterProfile, EngineProfile, HardwareProfile, ModelProfile, WeightVariant

T = TypeVar("T")


def _lookup(table: Mapping[str, T], key: str, kind: str, slug: str) -> T:
    try:
        return table[key]
    except KeyError:
        raise ComposeError(f"deployments.{slug}.{kind}: no {kind} profile {key!r} "
                           f"(known: {', '.join(sorted(table))})") from None


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
        out[ov.id] = (bool(ov.manifest.edits), ov.manifest.kernels is not None)
    return out


_REPO_PATH = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$")


def _models_path(raw: str, what: str, slug: str) -> str:
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


def serve_args(dep: Deployment, model: ModelProfile, weights: WeightVariant | None, hardware: HardwareProfile,
               drafter: DrafterProfile | None, engine: EngineProfile | None = None) -> tuple[str, ...]:
    """The server's arguments (everything after `vllm serve`, or after the api_server module), from the
    registry entry and profiles. The API server module takes the model as `--model` (only `vllm serve` maps its
    positional model_tag to --model); a CPU engine gets no GPU flags."""
    cpu = engine is not None and engine.device == "cpu"
    if dep.model_dir:
        model_path = f"{MODELS_MOUNT}/{dep.model_dir}"
    else:
        repo = (weights.hf_repo if weights is not None else None) or model.hf_repo or dep.model
        model_path = _models_path(repo, "weights hf_repo", dep.slug)
    served = dep.served_name or dep.model
    server = engine.server if engine is not None else "vllm-serve"
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
        args += ["--gpu-memory-utilization", f"{float(dep.gpu_memory_utilization or hardware.safe_mem_util):.2f}"]
    if not cpu and hardware.sm < 8.0:
        args += ["--dtype", "float16"]
    if dep.kv_dtype:
        args += ["--kv-cache-dtype", dep.kv_dtype]
    if drafter is not None:
        spec: dict[str, Any] = dict(drafter.speculative_config or {})
        drafter_repo = str(drafter.hf_repo or spec.get("model") or dep.drafter)  # _models_path takes str() of it
        spec["model"] = _models_path(drafter_repo, "drafter hf_repo", dep.slug)
        tokens = dep.num_speculative_tokens or drafter.default_tokens or spec.get("num_speculative_tokens")
        if tokens:
            spec["num_speculative_tokens"] = int(tokens)
        args += ["--speculative-config", json.dumps(spec, sort_keys=True, separators=(",", ":"))]
    args += list(dep.extra_args)
    return tuple(args)


def fit_report(profiles: Profiles, dep: Deployment, catalog: Catalog) -> FitReport:
    from ..fits import fits  # the fits() contract (docs/design.md)

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


def failing_constraints(report: FitReport) -> tuple[str, ...]:
    """The ids of the constraints fits() failed (Constraint.result: pass / warn / fail / skip)."""
    return tuple(c.id for c in report.constraints if c.result == "fail")


def plan_warnings(report: FitReport) -> tuple[str, ...]:
    """Header warnings: every failing constraint and every unverified profile field the verdict rests on."""
    out = [f"fits() fails {c.id}: {c.message}" for c in report.constraints if c.result == "fail"]
    out += [f"unverified: {field_}" for field_ in report.unverified]
    return tuple(out)


def plan_deployment(dep: Deployment, profiles: Profiles, catalog: Catalog, report: FitReport | None = None,
                    kinds: dict[str, tuple[bool, bool]] | None = None) -> ServicePlan:
    engine = _lookup(profiles.engines, dep.engine, "engine", dep.slug)
    model = _lookup(profiles.models, dep.model, "model", dep.slug)
    hardware = _lookup(profiles.hardware, dep.hardware, "hardware", dep.slug)
    drafter = _lookup(profiles.drafters, dep.drafter, "drafter", dep.slug) if dep.drafter else None
    weights = _lookup(model.weights, dep.weights, "weights", dep.slug) if dep.weights is not None else None
    image = engine.image
    if not image:
        raise ComposeError(f"engine profile {dep.engine!r} has no image pin")
    if report is None:
        report = fit_report(profiles, dep, catalog)
    if kinds is None:
        kinds = overlay_kinds(catalog)
    needed = [str(i) for i in report.overlays]
    return ServicePlan(
        slug=dep.slug,
        image=str(image),
        serve_args=serve_args(dep, model, weights, hardware, drafter, engine),
        server_command=SERVER_COMMANDS[engine.server],
        device=engine.device,
        overlays=tuple(i for i in needed if kinds.get(i, (True, False))[0]),
        kernel_overlays=tuple(i for i in needed if kinds.get(i, (True, False))[1]),
        gpus=dep.gpus,
        tp=dep.tp,
        port=dep.port,
        status=dep.status,
        note=dep.note,
        engine=dep.engine,
        vllm_version=str(engine.vllm_version),
        model=dep.model,
        hardware=dep.hardware,
        env=dict(dep.env),
        shm_size=dep.shm_size,
        verdict=str(report.verdict),
        failing=failing_constraints(report),
        warnings=plan_warnings(report),
        delivery=dep.delivery,
    )


def load_profiles(catalog: Catalog) -> Profiles:
    from ..profiles import load_profiles as _load  # the profiles contract (docs/design.md)

    return _load(catalog)


def plan_all(registry: Registry, catalog: Catalog, profiles: Profiles | None = None) -> dict[str, ServicePlan]:
    profiles = profiles if profiles is not None else load_profiles(catalog)
    kinds = overlay_kinds(catalog)
    return {
        slug: plan_deployment(dep, profiles, catalog, kinds=kinds)
        for slug, dep in sorted(registry.deployments.items())
    }
