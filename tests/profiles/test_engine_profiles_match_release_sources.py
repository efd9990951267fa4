"""Engine facts read from the real release sources, per release (issue 11).

Every engine profile fact below is what that release's sdist says, not what someone typed: the
registered Gemma-4 architectures (families), the backend Gemma4Config forces for heterogeneous head
dims, FlashAttention's head-size ceiling, the Marlin floor, the NVFP4 schemes' minimum capability, the
gemma4_mtp drafter mapping, and the AutoRound MoE fallback's SiLU-only assertion vs Gemma-4's GELU.
"""

from __future__ import annotations

import re

import pytest

from manager.catalog import Catalog
from manager.profiles import load_profiles
from tests.helpers import REPO_ROOT

P = load_profiles(Catalog(REPO_ROOT))
# the releases issue 11 names; each has an engine profile except 0.24.0 (read for the families only)
RELEASES = ["0.20.0", "0.22.0", "0.24.0", "0.27.1", "0.28.0"]
ENGINES = {v: P.engines[f"vllm-{v}"] for v in RELEASES if f"vllm-{v}" in P.engines}
# the sm70 engine is stock 0.19.1 (the newest vLLM whose PyPI binaries carry sm_70 code) plus this catalog's overlays
BASES = {**{f"vllm-{v}": v for v in ENGINES}, "vllm-0.19.1-sm70": "0.19.1"}


def _src(pristine_release, version: str, rel: str) -> str:
    return (pristine_release(version) / rel).read_text()


def _forces_triton_above_256(config_py: str) -> bool:
    """Gemma4Config.verify_and_update_config forces TRITON_ATTN whenever the head dims differ and exceed 256
    (0.20.0/0.22.0); later releases first try FlashAttention 4 (`is_fa_version_supported(4)`)."""
    m = re.search(r"class Gemma4Config\(.*?(?=\nclass )", config_py, re.S)
    assert m, "Gemma4Config not found"
    body = m.group(0)
    return "AttentionBackendEnum.TRITON_ATTN" in body and "max_head_dim > 256" in body and "is_fa_version_supported(4)" not in body


@pytest.mark.parametrize("version", RELEASES)
def test_gemma4_unified_is_registered_from_0_24_0(pristine_release, version):
    reg = _src(pristine_release, version, "vllm/model_executor/models/registry.py")
    native = '"Gemma4UnifiedForConditionalGeneration"' in reg and (
        pristine_release(version) / "vllm/model_executor/models/gemma4_unified.py").is_file()
    from packaging.version import Version

    assert native == (Version(version) >= Version("0.24.0"))
    if version in ENGINES:
        assert ("gemma4_unified" in ENGINES[version].families) == native


@pytest.mark.parametrize("engine", sorted(BASES))
def test_forced_attention_backend_matches_the_release(pristine_release, engine):
    e = P.engines[engine]
    forced = _forces_triton_above_256(_src(pristine_release, BASES[engine], "vllm/model_executor/models/config.py"))
    got = [(f.backend, f.when_head_dims_differ_above) for f in e.forced_attention]
    assert got == ([("TRITON_ATTN", 256)] if forced else [])


@pytest.mark.parametrize("engine", sorted(BASES))
def test_flash_attn_head_size_ceiling_and_marlin_floor(pristine_release, engine):
    v, e = BASES[engine], P.engines[engine]
    fa = _src(pristine_release, v, "vllm/v1/attention/backends/flash_attn.py")
    ceiling = int(re.search(r"def supports_head_size.*?<= (\d+)", fa, re.S).group(1))
    assert [b.max_head_dim for b in e.attention if b.backend == "FLASH_ATTN"] == [ceiling]
    marlin = _src(pristine_release, v, "vllm/model_executor/layers/quantization/utils/marlin_utils.py")
    floor = int(re.search(r"device_capability < (\d+)", marlin).group(1))
    assert e.marlin_min_sm == floor / 10


def test_sm70_engine_has_no_nvfp4_because_0_19_1_needs_capability_75(pristine_release):
    base = "vllm/model_executor/layers/quantization/compressed_tensors/schemes/"
    caps = []
    for f in ("compressed_tensors_w4a4_nvfp4.py", "compressed_tensors_w4a16_nvfp4.py"):
        text = _src(pristine_release, "0.19.1", base + f)
        caps.append(int(re.search(r"def get_min_capability.*?return (\d+)", text, re.S).group(1)))
    e = P.engines["vllm-0.19.1-sm70"]
    assert min(caps) / 10 == e.quant_min_sm["nvfp4"] > P.hardware["v100-sxm2-16gb"].sm
    assert "nvfp4" not in e.weight_formats
    assert e.unverified == [] and not e.fork


def test_sm70_engine_facts_match_the_0_19_1_sources(pristine_release):
    """Every sm70 limit the profile states, read from the 0.19.1 sdist."""
    e = P.engines["vllm-0.19.1-sm70"]
    src = lambda rel: _src(pristine_release, "0.19.1", rel)
    # no bfloat16 below cc 8.0; V100 serves float16
    cuda = src("vllm/platforms/cuda.py")
    assert "Bfloat16 is only supported on GPUs" in cuda and re.search(r"if not cls.has_device_capability\(80\)", cuda)
    assert "bfloat16" not in next(b for b in e.attention if b.max_sm == 7.0).kv_dtypes
    # Gemma-4 is not refused in float16 (gemma2/gemma3 are): its float16 numerics are unverified, not forbidden
    model = src("vllm/config/model.py")
    table = re.search(r"_FLOAT16_NOT_SUPPORTED_MODELS = \{(.*?)\n\}", model, re.S).group(1)
    assert '"gemma3"' in table and '"gemma4' not in table
    assert "unverified" in e.sources["dtype"]
    # attention: FLASH_ATTN >= 8.0, FLASHINFER >= 7.5, TRITON_ATTN any SM with head sizes >= 32
    assert "capability >= DeviceCapability(8, 0)" in src("vllm/v1/attention/backends/flash_attn.py")
    assert "capability >= DeviceCapability(7, 5)" in src("vllm/v1/attention/backends/flashinfer.py")
    triton = src("vllm/v1/attention/backends/triton_attn.py")
    assert re.search(r"def supports_compute_capability.*?return True", triton, re.S)
    assert re.search(r"def supports_head_size.*?head_size >= 32", triton, re.S)
    mins = {b.backend: b.min_sm for b in e.attention if b.backend != "TRITON_ATTN"}
    assert mins == {"FLASH_ATTN": 8.0, "FLASHINFER": 7.5}
    assert any(b.backend == "TRITON_ATTN" and b.runs_on(7.0) for b in e.attention)
    # Marlin MoE chosen on shape alone: check_moe_marlin_supports_layer tests no capability
    mu = src("vllm/model_executor/layers/quantization/utils/marlin_utils.py")
    body = re.search(r"def check_moe_marlin_supports_layer.*?return [^\n]*", mu, re.S).group(0)
    assert "capability" not in body and e.marlin_moe_ignores_sm
    # compressed-tensors W4A16 Linear layers need cc 7.5 and the non-Marlin MoE path needs symmetric weights
    wna16 = src("vllm/model_executor/layers/quantization/compressed_tensors/schemes/compressed_tensors_wNa16.py")
    assert int(re.search(r"def get_min_capability.*?return (\d+)", wna16, re.S).group(1)) == 75
    moe = src("vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors_moe.py")
    assert "Only symmetric quantization is supported for MoE" in moe and "CompressedTensorsWNA16MoEMethod(" in moe
    assert "should_moe_wna16_use_cuda" in src("vllm/model_executor/layers/fused_moe/fused_moe.py")


def test_sm70_engine_transformers_and_torch_pins_are_what_the_0_19_1_requirements_allow():
    import tarfile

    from packaging.requirements import Requirement

    from manager import releases

    with tarfile.open(releases.sdist("0.19.1")) as tar:
        read = lambda rel: tar.extractfile(f"vllm-0.19.1/{rel}").read().decode()
        common, cuda = read("requirements/common.txt"), read("requirements/cuda.txt")
    reqs = {r.name: r for r in (Requirement(l.split("#")[0].strip()) for l in (common + cuda).splitlines()
                                if l.split("#")[0].strip() and not l.startswith("-"))}
    e = P.engines["vllm-0.19.1-sm70"]
    assert reqs["transformers"].specifier.contains(e.transformers_version)
    assert not reqs["transformers"].specifier.contains("5.5.0")  # 0.19.1 excludes it; Gemma-4 needs >= 5.5.0
    assert str(reqs["torch"].specifier) == "==2.10.0" and "torch 2.10.0" in e.sources["cuda_version"]


def test_sm70_engine_version_and_pin_match_the_0_19_1_sdist(pristine_release):
    e = P.engines["vllm-0.19.1-sm70"]
    version = _src(pristine_release, "0.19.1", "vllm/_version.py")
    assert "__version__ = version = '0.19.1'" in version and "gb1388b1fb" in version
    assert e.vllm_version == "0.19.1" and e.upstream_ref == "v0.19.1" and "gb1388b1fb" in e.sources["vllm_version/upstream_ref"]


@pytest.mark.parametrize("engine", sorted(BASES))
def test_gemma4_mtp_drafter_mapping(pristine_release, engine):
    spec = _src(pristine_release, BASES[engine], "vllm/config/speculative.py")
    assert ("gemma4_mtp" in P.engines[engine].drafter_model_types) == ("gemma4_mtp" in spec)


def test_autoround_moe_fallback_is_silu_only_and_gemma4_experts_use_gelu(pristine_release):
    inc = _src(pristine_release, "0.20.0", "vllm/model_executor/layers/quantization/inc.py")
    wna16 = _src(pristine_release, "0.20.0", "vllm/model_executor/layers/quantization/moe_wna16.py")
    gemma4 = _src(pristine_release, "0.20.0", "vllm/model_executor/models/gemma4.py")
    assert "MoeWNA16Config.from_config(config).get_quant_method" in inc
    assert re.search(r"while intermediate_size_per_partition % group_size.*?group_size = group_size // 2", wna16, re.S)
    assert "assert layer.activation == MoEActivation.SILU" in wna16
    assert 'activation="gelu"' in gemma4
    w = P.models["gemma-4-26b-a4b"].weights["autoround-int4-mixed"]
    assert w.moe_fallback == "none" and "SiLU" in w.moe_fallback_reason and "GELU" in w.moe_fallback_reason
    from manager.fits import OverlayIndex, fits

    c = fits(P, model="gemma-4-26b-a4b", weights="autoround-int4-mixed", hardware="rtx-3090", gpus=2,
             engine="vllm-0.20.0", overlay_index=OverlayIndex({})).constraint("quant-kernel")
    assert c.result == "fail" and "SiLU" in c.message and "GELU" in c.message


def test_head_dim_message_follows_the_engines_forced_backend():
    from manager.fits import OverlayIndex, fits

    kw = dict(model="gemma-4-26b-a4b", hardware="rtx-3090", gpus=2, overlay_index=OverlayIndex({}))
    old = fits(P, engine="vllm-0.20.0", **kw).constraint("head-dim").message
    assert "forces TRITON_ATTN" in old and "D=256: TRITON_ATTN" in old and "FLASH_ATTN" not in old
    new = fits(P, engine="vllm-0.28.0", **kw).constraint("head-dim").message
    assert "forces" not in new


def _sdist_transformers_spec(version: str) -> str:
    """The `transformers` requirement of a release, read from requirements/common.txt inside its sdist."""
    import tarfile

    from manager import releases

    with tarfile.open(releases.sdist(version)) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/requirements/common.txt"))
        text = tar.extractfile(member).read().decode()
    lines = [ln.split("#")[0].strip() for ln in text.splitlines()]
    spec = [ln for ln in lines if re.match(r"transformers\b", ln)]
    assert len(spec) == 1, spec
    return spec[0][len("transformers"):].split(";")[0].strip()


@pytest.mark.network
@pytest.mark.parametrize("engine", sorted(BASES) + sorted(f"vllm-{v}" for v in ("0.19.0", "0.26.0", "0.30.0", "0.31.0", "0.33.0")))
def test_engine_transformers_pin_satisfies_its_release_requirement(engine):
    """Each engine's transformers (typed, and marked unverified where no image was read) must at least be one
    its release accepts: requirements/common.txt of the real sdist, per release."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    prof = P.engines[engine]
    base = BASES.get(engine, engine.removeprefix("vllm-"))
    spec = SpecifierSet(_sdist_transformers_spec(base))
    assert Version(prof.transformers_version) in spec, (engine, prof.transformers_version, str(spec))
