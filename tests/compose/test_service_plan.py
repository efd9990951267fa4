"""From registry entry + profiles + fits() to the service plan: image pin, serve flags, overlay split."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from manager.catalog import Catalog
from manager.compose.plan import load_profiles, plan_deployment
from manager.compose.registry import load_registry, parse_registry
from manager.errors import ComposeError


@pytest.fixture(scope="module")
def ctx():
    catalog = Catalog.locate()
    return catalog, load_registry(catalog), load_profiles(catalog)


def _args(plan) -> dict:
    out, it = {}, iter(plan.serve_args[1:])
    for a in it:
        out[a] = next(it)
    return out


def test_image_comes_from_the_engine_profile_and_overlays_from_fits(ctx) -> None:
    catalog, reg, profiles = ctx
    from manager.fits import fits

    dep = reg.get("gemma4-26b-a4b-awq-3090-tp2")
    plan = plan_deployment(dep, profiles, catalog)
    assert plan.image == profiles.engines[dep.engine].image
    report = fits(profiles, model=dep.model, hardware=dep.hardware, gpus=dep.gpus, tp=dep.tp, weights=dep.weights,
                  engine=dep.engine, drafter=dep.drafter, ctx=dep.ctx, kv_dtype=dep.kv_dtype,
                  max_seqs=dep.max_seqs, catalog=catalog)
    assert set(plan.overlays) | set(plan.kernel_overlays) == set(report.overlays)
    assert "vllm-pr40886-gemma4-awq-moe-keys" in plan.overlays


def test_serve_arguments_follow_the_registry(ctx) -> None:
    catalog, reg, profiles = ctx
    dep = reg.get("gemma4-26b-a4b-awq-3090-tp2")
    plan = plan_deployment(dep, profiles, catalog)
    assert plan.serve_args[0] == "/models/" + profiles.models[dep.model].weights[dep.weights].hf_repo
    a = _args(plan)
    assert a["--tensor-parallel-size"] == "2" and a["--max-model-len"] == str(dep.ctx)
    assert a["--max-num-seqs"] == str(dep.max_seqs) and a["--port"] == "8000"
    assert "--dtype" not in a  # sm86 keeps the checkpoint dtype


def test_sm70_runs_float16_with_the_kv_dtype_and_builds_its_kernel_overlay(ctx) -> None:
    catalog, reg, profiles = ctx
    plan = plan_deployment(reg.get("gemma4-26b-a4b-nvfp4-v100-tp2"), profiles, catalog)
    a = _args(plan)
    assert a["--dtype"] == "float16" and a["--kv-cache-dtype"] == "float16"
    assert plan.serve_args[0] == "/models/gemma-4-26B-A4B-it-NVFP4"
    # its routing edits are applied like any overlay; its kernels are compiled by `overlay build`
    assert "sm70-d512-attention" in plan.kernel_overlays and "sm70-d512-attention" in plan.overlays
    assert "dynamo-dict-caches" in plan.overlays and "dynamo-dict-caches" not in plan.kernel_overlays


def test_drafter_becomes_a_speculative_config_below_the_models_mount(ctx) -> None:
    catalog, reg, profiles = ctx
    dep = reg.get("gemma4-26b-a4b-awq-mtp-3090-tp2")
    spec = json.loads(_args(plan_deployment(dep, profiles, catalog))["--speculative-config"])
    assert spec["model"] == "/models/" + profiles.drafters[dep.drafter].hf_repo
    assert spec["num_speculative_tokens"] == dep.num_speculative_tokens


def test_weights_without_a_repo_id_need_model_dir(ctx, tmp_path) -> None:
    catalog, _, profiles = ctx
    reg = parse_registry({"deployments": {"x": {
        "model": "gemma-4-12b", "weights": "nvfp4", "engine": "vllm-0.19.1-sm70", "hardware": "v100-sxm2-16gb",
        "gpus": 2, "tp": 2, "ctx": 4096, "port": 9000}}}, tmp_path / "d.yaml")
    report = SimpleNamespace(verdict="fits", constraints=[], overlays=[])
    with pytest.raises(ComposeError, match="not a repo id or relative path; set model_dir"):
        plan_deployment(reg.get("x"), profiles, catalog, report=report, kinds={})


def test_unknown_engine_names_the_registry_key(ctx, tmp_path) -> None:
    catalog, _, profiles = ctx
    reg = parse_registry({"deployments": {"x": {
        "model": "gemma-4-12b", "engine": "vllm-9.9", "hardware": "rtx-3090",
        "gpus": 1, "tp": 1, "ctx": 4096, "port": 9000}}}, tmp_path / "d.yaml")
    with pytest.raises(ComposeError, match=r"deployments\.x\.engine: no engine profile 'vllm-9\.9'"):
        plan_deployment(reg.get("x"), profiles, catalog, report=SimpleNamespace(overlays=[]), kinds={})
