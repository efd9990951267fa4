"""CPU engine profiles (vLLM's CPU build): schema, fits(), the compose plan and render — no engine run.

The real engine behind them runs in tests/compose/test_cpu_deployment_real_engine.py and tests/testing/test_real_engine_ab.py. The CPU host profile
and the registry (a TP=1 and a TP=2 entry) are tests/fixtures/cpu-deployment (the CI machine); tiny-dense-config.json there is the
config.json the checkpoint factory writes for kind `dense` (model_type gemma4_text).
"""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from manager.catalog import Catalog
from manager.compose.plan import SERVER_COMMANDS, load_profiles, plan_deployment
from manager.compose.registry import load_registry
from manager.compose.render import RenderOptions, render_compose
from manager.errors import ProfileError
from manager.fits import OverlayIndex, OverlayInfo, fits
from manager.overlays.manifest import NeededWhen
from manager.fits.core import default_engine
from manager.profiles.importcfg import profile_from_config, to_yaml
from manager.profiles.loader import load_profiles_dir
from tests.helpers import REPO_ROOT, TEST_FIXTURES

FIXTURES = TEST_FIXTURES / "cpu-deployment"
CPU = "vllm-cpu-0.20.0"
HOST = "ci-cpu-host"
CONVERTOR = "gemma4-convertor-per-layer"


@pytest.fixture(scope="module")
def catalog(tmp_path_factory) -> Catalog:
    """The shipped catalog + the CI host, the tiny model (imported from its config.json) and the CPU registry."""
    dest = tmp_path_factory.mktemp("cpu-catalog")
    (dest / "overlays").symlink_to(REPO_ROOT / "overlays")
    shutil.copytree(REPO_ROOT / "profiles", dest / "profiles")
    shutil.copy(FIXTURES / "hardware" / f"{HOST}.yaml", dest / "profiles" / "hardware")
    cfg = FIXTURES / "tiny-dense-config.json"
    prof = profile_from_config(json.loads(cfg.read_text()), model_id="gemma-4-tiny", hf_repo="tiny-dense",
                               size_gb=0.009, file=str(cfg))
    (dest / "profiles" / "models" / "gemma-4-tiny.yaml").write_text(to_yaml(prof))
    (dest / "compose").mkdir()
    shutil.copy(FIXTURES / "deployments.yaml", dest / "compose")
    return Catalog(dest)


@pytest.fixture(scope="module")
def profiles(catalog):
    return load_profiles(catalog)


def _index() -> OverlayIndex:
    """The four overlays' needed_when as shipped, statuses as on a pristine 0.20.0 (all pending): offline."""
    infos = {
        CONVERTOR: OverlayInfo(CONVERTOR, needed_when=NeededWhen(families=["gemma4"], transformers=">=5.15"),
                               versions=">=0.19.0"),
        "dynamo-dict-caches": OverlayInfo("dynamo-dict-caches", needed_when=NeededWhen(max_sm=7.0), versions=">=0.19.0"),
        "sm70-d512-attention": OverlayInfo("sm70-d512-attention", needed_when=NeededWhen(max_sm=7.0, head_dims=[512]),
                                           kernel=True),
        "vllm-pr40886-gemma4-awq-moe-keys": OverlayInfo(
            "vllm-pr40886-gemma4-awq-moe-keys",
            needed_when=NeededWhen(families=["gemma4"], weight_formats=["compressed-tensors"], moe=True),
            versions=">=0.19.0", native_from="0.22.0"),
    }
    return OverlayIndex(infos, status_fn=lambda version: {i: "pending" for i in infos})


def test_every_field_of_the_cpu_engine_profile_names_its_source():
    raw = yaml.safe_load((REPO_ROOT / "profiles" / "engines" / f"{CPU}.yaml").read_text())
    covered = {part for key in raw["sources"] for part in key.split("/")}
    facts = set(raw) - {"id", "sources", "unverified", "upstream_repo", "attention"}  # attention: one per entry
    assert facts - covered == set()
    assert all(b["source"] for b in raw["attention"])
    assert raw["unverified"] == ["image"]


def test_the_cpu_engine_profile_is_a_cpu_build_of_the_release(profiles):
    e = profiles.engines[CPU]
    assert (e.device, e.server, e.upstream_ref, e.fork) == ("cpu", "openai-api-server", "v0.20.0", False)
    assert e.cuda_version is None and e.cuda_arch_list == [] and e.min_sm == 0
    assert all(p.device == "cuda" for i, p in profiles.engines.items() if i != CPU)


@pytest.mark.parametrize(("kind", "name", "change", "message"), [
    ("engines", f"{CPU}.yaml", {"cuda_version": "13.0.2"}, "a CPU build has no cuda_version"),
    ("hardware", f"{HOST}.yaml", {"sm": 7.0}, "sm must be 0"),
])
def test_cpu_profiles_refuse_gpu_facts(tmp_path, catalog, kind, name, change, message):
    dest = tmp_path / "profiles"
    shutil.copytree(catalog.profiles_dir, dest)
    path = dest / kind / name
    data = yaml.safe_load(path.read_text())
    data.update(change)
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match=message):
        load_profiles_dir(dest)


def test_fits_never_pairs_a_cpu_engine_with_a_gpu_or_the_reverse(profiles, catalog):
    r = fits(profiles, model="gemma-4-tiny", hardware="rtx-3090", engine=CPU, catalog=catalog, overlay_index=_index())
    assert r.verdict == "fails"
    assert r.constraint("engine-sm").message.startswith(f"{CPU} is a cpu build; rtx-3090 is a cuda device")
    r = fits(profiles, model="gemma-4-tiny", hardware=HOST, engine="vllm-0.20.0", catalog=catalog,
             overlay_index=_index())
    assert r.constraint("engine-sm").result == "fail"
    assert default_engine(profiles, profiles.hardware[HOST]).id == CPU
    for hw in profiles.hardware.values():
        if hw.device == "cuda":
            assert default_engine(profiles, hw).device == "cuda", hw.id


def test_on_a_cpu_host_only_the_convertor_is_needed_not_the_sm70_overlays(profiles, catalog):
    """sm is 0 on a CPU host: the `max_sm: 7.0` overlays (CUDA graphs, D=512 kernels) must not match it."""
    r = fits(profiles, model="gemma-4-tiny", hardware=HOST, engine=CPU, ctx=256, max_seqs=4, catalog=catalog,
             overlay_index=_index())
    assert r.overlays == [CONVERTOR]
    assert r.constraint("engine-sm").result == "pass"
    assert r.constraint("head-dim").message.startswith("D=64: CPU_ATTN; D=512: CPU_ATTN")
    # the unverified image pin and the host's placeholder fields are the evidence beside the verdict
    assert r.verdict == "fits" and r.constraint("unverified").result == "warn" and r.unverified


def test_the_cpu_deployment_execs_the_api_server_with_model_and_no_gpu_flags(profiles, catalog):
    dep = load_registry(catalog).get("gemma4-tiny-cpu")
    plan = plan_deployment(dep, profiles, catalog)
    assert plan.server_command == SERVER_COMMANDS["openai-api-server"] and plan.device == "cpu"
    assert plan.serve_args[:2] == ("--model", "/models/tiny-dense")
    assert "--gpu-memory-utilization" not in plan.serve_args and "float16" not in plan.serve_args
    assert plan.overlays == (CONVERTOR,)
    # a CPU plan never gets an NVIDIA reservation, even when the caller asks for GPUs
    svc = yaml.safe_load(render_compose(plan, RenderOptions(gpu=True)))["services"]["gemma4-tiny-cpu"]
    assert "deploy" not in svc
    script = svc["entrypoint"][2]
    assert script.endswith(f'"$$OVERLAY" apply {CONVERTOR}\nexec python3 -m vllm.entrypoints.openai.api_server "$$@"\n')


def test_gpu_deployments_still_exec_vllm_serve_with_the_model_first(catalog):
    shipped = Catalog(REPO_ROOT)
    plan = plan_deployment(load_registry(shipped).get("gemma4-26b-a4b-awq-3090-tp2"), load_profiles(shipped), shipped)
    assert plan.server_command == ("vllm", "serve") and plan.serve_args[0].startswith("/models/")
    assert 'exec vllm serve "$$@"' in render_compose(plan)
