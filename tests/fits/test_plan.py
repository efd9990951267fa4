"""plan() and the CLI: profiles list/show/validate, fits exit codes and JSON, plan output."""

from __future__ import annotations

import json
import re

import pytest

from manager.catalog import Catalog
from manager.fits import build_index, fits, plan
from tests.fits.overlay_index import make_index
from tests.helpers import REPO_ROOT
from tests.helpers.cli import run_cli


def test_plan_26b_on_two_3090_best_first_and_rejections_explained(P):
    pl = plan(P, model="gemma-4-26b-a4b", hardware="rtx-3090", gpus=2, overlay_index=make_index())
    assert pl.options, "something must fit on 2x 24 GB"
    best = pl.options[0]
    assert best.verdict in ("fits", "tight") and best.deployment["weights"] in ("awq", "nvfp4")
    verdicts = [r.verdict for r in pl.options]
    assert verdicts == sorted(verdicts, key=lambda v: v != "fits")  # every fits before any tight
    assert all(r.verdict != "fails" for r in pl.options)
    reasons = " ".join(" ".join(r.reasons) for r in pl.rejected)
    assert "704 % 128" in reasons  # AutoRound blocked
    assert "memory:" in reasons  # bf16 does not fit
    assert all(r.deployment["weights"] != "bf16" for r in pl.options)


def test_plan_26b_on_two_v100_uses_the_0_19_1_engine_and_its_overlays(P):
    from tests.fits.overlay_index import closed_index

    pl = plan(P, model="gemma-4-26b-a4b", hardware="v100-sxm2-16gb", gpus=2, overlay_index=closed_index())
    assert pl.options
    assert {r.deployment["engine"] for r in pl.options} == {"vllm-0.19.1-sm70"}
    assert all("dynamo-dict-caches" in r.overlays for r in pl.options)
    # float16 KV only: 0.19.1's Triton attention has no fp8 cache on sm70
    assert {r.deployment["kv_dtype"] for r in pl.options} == {"auto"}
    assert any("engine-sm" in " ".join(r.reasons) for r in pl.rejected)


def test_plan_on_v100_never_proposes_an_engine_without_sm70_code(P):
    """Engines whose cuda_arch_list/min_sm exclude 7.0 (the CUDA 13 builds) are rejected with that reason."""
    no_sm70 = {eid for eid, e in P.engines.items() if e.device == "cuda" and min(e.cuda_arch_list) > 7.0}
    assert {"vllm-0.20.0", "vllm-0.33.0"} <= no_sm70
    pl = plan(P, model="gemma-4-26b-a4b", hardware="v100-sxm2-16gb", gpus=2, overlay_index=make_index())
    assert not no_sm70 & {r.deployment["engine"] for r in pl.options}
    for r in pl.rejected:
        if r.deployment["engine"] in no_sm70:
            assert any(x.startswith("engine-sm:") and "carry no code for sm 7.0" in x for x in r.reasons), r.reasons


def test_cli_plan_on_two_v100_proposes_the_0_19_1_engine_with_its_overlays():
    r = invoke("plan", "--hardware", "v100-sxm2-16gb", "--gpus", "2", "--model", "gemma-4-26b-a4b", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    best = data["options"][0]
    assert (best["engine"], best["image"], best["tp"]) == ("vllm-0.19.1-sm70", "overlay-manager/vllm-v100:0.19.1-cu128", 2)
    # 4-bit weights on sm70 go through the sm70-w4-gemm route (NVFP4, or W4A16 with #40886's expert keys)
    assert {"sm70-w4-gemm", "sm70-d512-attention"} <= set(best["overlays"])
    assert best["weights"] == "nvfp4" or "vllm-pr40886-gemma4-awq-moe-keys" in best["overlays"]
    # tight for named reasons only: the memory numbers fit
    assert not any(w.startswith("memory:") for w in best["warnings"])
    assert not any("engines/vllm-0.19.1-sm70" in w for w in best["warnings"])


def test_plan_to_json_lists_options_and_rejections(P):
    j = plan(P, model="gemma-4-12b", hardware="rtx-3090", gpus=1, overlay_index=make_index()).to_json()
    assert j["options"] and {"tp", "engine", "weights", "kv_dtype", "max_ctx", "drafter", "overlays", "verdict"} <= set(j["options"][0])
    assert all(r["reasons"] for r in j["rejected"])


@pytest.mark.network
def test_real_overlay_catalog_and_release_sources_decide_the_convertor(P):
    """Integration: the shipped overlay manifests and real vLLM sources (downloaded once, cached)."""
    idx = build_index(Catalog(REPO_ROOT))
    assert "gemma4-convertor-per-layer" in idx.overlays
    old = fits(P, model="gemma-4-12b", hardware="rtx-3090", engine="vllm-0.27.1", overlay_index=idx)
    new = fits(P, model="gemma-4-12b", hardware="rtx-3090", engine="vllm-0.28.0", overlay_index=idx)
    assert "gemma4-convertor-per-layer" in old.overlays
    assert "gemma4-convertor-per-layer" not in new.overlays


# ----------------------------------------------------------------------------- CLI


def invoke(*args):
    return run_cli("--catalog", str(REPO_ROOT), *args)


def test_cli_profiles_list_json_and_kinds():
    r = invoke("profiles", "list", "--kind", "hardware", "--json")
    assert r.exit_code == 0
    assert "v100-sxm2-16gb" in json.loads(r.output)["hardware"]
    r = invoke("profiles", "list")
    assert "engines/vllm-0.19.1-sm70" in r.output and "models/gemma-4-26b-a4b" in r.output


def test_cli_profiles_show_and_unknown_id():
    r = invoke("profiles", "show", "engines/vllm-0.27.1", "--json")
    assert r.exit_code == 0 and json.loads(r.output)["transformers_version"] == "5.15.0"
    bad = invoke("profiles", "show", "models/nope")
    assert bad.exit_code != 0


def test_cli_profiles_validate_ok_and_broken(tmp_path):
    assert invoke("profiles", "validate").exit_code == 0
    broken = tmp_path / "profiles" / "hardware"
    broken.mkdir(parents=True)
    (broken / "x.yaml").write_text("id: x\nsm: 7.0\n")
    r = invoke("profiles", "validate", str(tmp_path / "profiles"))
    assert r.exit_code != 0


def test_cli_fits_json_shape_and_exit_codes():
    ok = invoke("fits", "--model", "gemma-4-12b", "--hardware", "h200", "--engine", "vllm-0.33.0", "--json")
    assert ok.exit_code == 0, ok.output
    j = json.loads(ok.stdout)
    assert j["verdict"] in ("fits", "tight") and "max_ctx" in j["memory"]
    bad = invoke("fits", "--model", "gemma-4-31b", "--hardware", "v100-sxm2-16gb", "--gpus", "2", "--json")
    assert bad.exit_code == 1
    assert json.loads(bad.stdout)["verdict"] == "fails"


def test_cli_fits_text_has_table_and_memory_bar():
    r = invoke("fits", "--model", "gemma-4-12b", "--hardware", "h200", "--engine", "vllm-0.33.0")
    assert r.exit_code == 0
    assert "quant-kernel" in r.output and "per card" in r.output and "verdict:" in r.output


def test_cli_plan_exit_and_text():
    r = invoke("plan", "--model", "gemma-4-12b", "--hardware", "rtx-3090", "--limit", "3")
    assert r.exit_code == 0 and "deployments fit" in r.output and "rejected" in r.output


def test_the_shipped_catalogs_plans_are_not_all_one_verdict(P):
    """issue 26 point 4: unverified facts are the evidence beside the verdict, not a cap on it."""
    idx = make_index()
    verdicts: dict[str, int] = {}
    for model in sorted(P.models):
        for hw in ("rtx-3090", "v100-sxm2-16gb", "a100-80gb", "h200"):
            for r in plan(P, model=model, hardware=hw, gpus=2, overlay_index=idx).options:
                verdicts[r.verdict] = verdicts.get(r.verdict, 0) + 1
                assert r.evidence.startswith("rests on ") == bool(r.unverified)
    assert verdicts.get("fits", 0) > 0 and verdicts.get("tight", 0) > 0, verdicts


def test_plan_lists_the_unverified_facts_once_and_explain_per_option():
    args = ("plan", "--model", "gemma-4-e2b", "--hardware", "rtx-3090", "--gpus", "2", "--limit", "5")
    short = invoke(*args)
    assert short.exit_code == 0
    lines = short.stdout.splitlines()
    options = [ln for ln in lines if re.match(r"^\s*\d+\. ", ln)]
    assert len(options) == 5 and all("rests on 8 unverified facts" in ln for ln in options), options
    fact = "models/gemma-4-e2b.num_attention_heads"
    assert sum(ln.count(fact) for ln in lines) == 1  # the footnote, once
    assert "rests on unverified:" not in short.stdout
    full = invoke(*args, "--explain")
    assert full.stdout.count(fact) >= 5 and "(-> tp-heads)" in full.stdout


def test_fits_keeps_verdict_and_evidence_apart():
    res = invoke("fits", "--model", "gemma-4-e2b", "--hardware", "h200", "--engine", "vllm-0.33.0")
    verdict = [ln for ln in res.stdout.splitlines() if ln.startswith("verdict:")]
    assert verdict and verdict[0].startswith("verdict: fits, rests on ") and "unverified fact" in verdict[0]
    # piped: the constraint table is one line per row
    rows = [[c.strip() for c in ln.strip("│ ").split("│")] for ln in res.stdout.splitlines() if ln.startswith("│")]
    assert ["memory", "pass"] in [r[:2] for r in rows] and not any(r[0] == "unverified" for r in rows)
    assert "rests on unverified:" not in res.stdout
    explain = invoke("fits", "--model", "gemma-4-e2b", "--hardware", "h200", "--engine", "vllm-0.33.0", "--explain")
    rows = [[c.strip() for c in ln.strip("│ ").split("│")] for ln in explain.stdout.splitlines() if ln.startswith("│")]
    assert ["unverified", "warn"] in [r[:2] for r in rows]
    assert "rests on unverified:" in explain.stdout
