"""The factory's NVFP4 kinds (ct-nvfp4-dense, ct-nvfp4-moe) and its 4-bit helpers, checked against what vLLM 0.19.1's
and 0.20.0's compressed-tensors loader declares (their sources from the cached sdists via manager.releases)."""

from __future__ import annotations

import json
import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from safetensors import safe_open

from manager import releases
from testing import checkpoints as ck

# Where each release declares the NVFP4 linear scheme's and MoE method's parameters.
SOURCES = {
    "0.19.1": ("vllm/model_executor/layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a4_nvfp4.py",
               "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors_moe.py"),
    "0.20.0": ("vllm/model_executor/layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a4_nvfp4.py",
               "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors_moe/"
               "compressed_tensors_moe_w4a4_nvfp4.py"),
}
LINEAR_TENSOR = re.compile(r"\.(q|k|v|o|gate|up|down)_proj\.(weight_packed|weight_scale|weight_global_scale|input_global_scale)$")
EXPERT_TENSOR = re.compile(r"\.experts\.(\d+)\.(gate|up|down)_proj\.(weight_packed|weight_scale|weight_global_scale|input_global_scale)$")


@pytest.fixture(scope="module")
def nvfp4(tmp_path_factory):
    base = tmp_path_factory.mktemp("nvfp4")
    return {k: ck.build_checkpoint(k, base / k) for k in ("ct-nvfp4-dense", "ct-nvfp4-moe")}


def _tensors(path):
    with safe_open(str(path / "model.safetensors"), "pt") as fh:
        return {k: fh.get_tensor(k) for k in fh.keys()}


def test_e2m1_codes_round_trip_through_packing_and_dequantize_to_the_reference():
    w = torch.randn((3, 48, 64), generator=torch.Generator().manual_seed(0)) * 0.05
    codes, scale, gscale, deq = ck.quantize_nvfp4(w)
    packed = ck.pack_fp4(codes)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 48, 32)
    assert scale.dtype == torch.float8_e4m3fn and scale.shape == (3, 48, 4) and gscale.shape == (3,)
    assert torch.equal(ck.dequantize_nvfp4(packed, scale, gscale), deq)
    # the nearest E2M1 value: never more than one grid step (2 at the top, between 4 and 6) times the group scale
    step = (scale.float() / gscale.reshape(3, 1, 1)).repeat_interleave(16, dim=-1)
    assert ((w - deq).abs() <= step * 1.0 + 1e-7).all()
    assert torch.allclose(gscale, 448 * 6 / w.abs().reshape(3, -1).amax(-1))


def test_fp4_packing_puts_the_even_index_in_the_low_nibble():
    assert ck.pack_fp4(torch.tensor([[1, 0xA]], dtype=torch.uint8)).tolist() == [[0xA1]]
    packed = torch.zeros((1, 8), dtype=torch.uint8)
    packed[0, 0] = 0xA1
    deq = ck.dequantize_nvfp4(packed, torch.ones((1, 1)).to(torch.float8_e4m3fn), torch.ones(1))
    assert deq[0, :3].tolist() == [0.5, -1.0, 0.0]


def test_asymmetric_int4_zero_points_pack_along_the_output_dim():
    w = torch.randn((2, 12, 96), generator=torch.Generator().manual_seed(1))
    q, scale, zero, deq = ck.quantize_w4_groups_asym(w, 32, torch.float16)
    assert q.shape == w.shape and scale.shape == zero.shape == (2, 12, 3)
    assert ((w - deq).abs() <= scale.float().repeat_interleave(32, dim=-1) * 0.5 + 1e-3).all()
    packed = ck.pack_int4_rows(zero)
    assert packed.shape == (2, 2, 3) and packed.dtype == torch.int32
    p = packed.to(torch.int64) & 0xFFFFFFFF
    rows = torch.stack([(p >> (4 * i)) & 0xF for i in range(8)], dim=2).reshape(2, 16, 3)[:, :12]
    assert torch.equal(rows, zero)


@pytest.mark.parametrize("kind,pattern", [("ct-nvfp4-dense", LINEAR_TENSOR), ("ct-nvfp4-moe", EXPERT_TENSOR)])
def test_quantized_tensors_have_the_nvfp4_pack_quantized_dtypes_and_shapes(nvfp4, kind, pattern):
    t = _tensors(nvfp4[kind].path)
    bases = {k.rsplit(".", 1)[0] for k in t if pattern.search(k)}
    assert bases
    for b in bases:
        packed, scale = t[b + ".weight_packed"], t[b + ".weight_scale"]
        assert packed.dtype == torch.uint8 and scale.dtype == torch.float8_e4m3fn
        assert scale.shape == (packed.shape[0], packed.shape[1] * 2 // 16)
        assert t[b + ".weight_global_scale"].dtype == t[b + ".input_global_scale"].dtype == torch.float32
        assert t[b + ".weight_global_scale"].shape == (1,)
        assert b + ".weight" not in t


def test_dense_kind_dequantizes_to_its_reference_and_fused_groups_share_the_global_scale(nvfp4):
    info = nvfp4["ct-nvfp4-dense"]
    t, ref = _tensors(info.path), _tensors(info.reference_path)
    base = "model.layers.0.self_attn"
    gs = [t[f"{base}.{p}_proj.weight_global_scale"] for p in ("q", "k", "v") if f"{base}.{p}_proj.weight_global_scale" in t]
    assert len(gs) >= 2 and all(torch.equal(g, gs[0]) for g in gs)
    assert torch.equal(t["model.layers.0.mlp.gate_proj.weight_global_scale"], t["model.layers.0.mlp.up_proj.weight_global_scale"])
    b = "model.layers.0.mlp.down_proj"
    deq = ck.dequantize_nvfp4(t[b + ".weight_packed"], t[b + ".weight_scale"], t[b + ".weight_global_scale"])
    assert ref[b + ".weight"].dtype == torch.float32 and torch.equal(deq, ref[b + ".weight"])


def test_moe_kind_writes_every_expert_and_dequantizes_to_the_fused_reference(nvfp4):
    info = nvfp4["ct-nvfp4-moe"]
    t, ref = _tensors(info.path), _tensors(info.reference_path)
    cfg = json.loads((info.path / "config.json").read_text())
    experts = cfg.get("num_experts") or cfg["text_config"]["num_experts"]
    fused = [k for k in ref if k.endswith("experts.gate_up_proj")]
    assert fused and not any(k.endswith(("experts.gate_up_proj", "experts.down_proj")) for k in t)
    base = fused[0][: -len("gate_up_proj")]
    assert {int(m.group(1)) for k in t if (m := EXPERT_TENSOR.search(k))} == set(range(experts))
    for e in range(experts):
        g = ck.dequantize_nvfp4(t[f"{base}{e}.gate_proj.weight_packed"], t[f"{base}{e}.gate_proj.weight_scale"],
                                t[f"{base}{e}.gate_proj.weight_global_scale"])
        u = ck.dequantize_nvfp4(t[f"{base}{e}.up_proj.weight_packed"], t[f"{base}{e}.up_proj.weight_scale"],
                                t[f"{base}{e}.up_proj.weight_global_scale"])
        assert torch.equal(torch.cat([g, u]), ref[fused[0]][e])
        assert torch.equal(t[f"{base}{e}.gate_proj.weight_global_scale"], t[f"{base}{e}.up_proj.weight_global_scale"])


@pytest.mark.parametrize("version", sorted(SOURCES))
def test_vllm_declares_the_tensors_and_accepts_the_config_the_factory_writes(nvfp4, version):
    """The scheme and MoE method of `version` register exactly the parameter names the checkpoint carries, with the
    dtypes and packing it uses; CompressedTensorsConfig._is_nvfp4_format's fields match nvfp4_config; gemma4's
    load_weights maps per-expert `experts.{id}.{proj}.` names (the form ct-nvfp4-moe writes)."""
    root = releases.pristine_tree(version)
    linear, moe = (root / p for p in SOURCES[version])
    lin_src, moe_src = linear.read_text(), moe.read_text()
    for name in ("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale"):
        assert f'register_parameter("{name}"' in lin_src
    assert "input_size_per_partition // 2" in lin_src and "dtype=torch.uint8" in lin_src
    assert "input_size_per_partition // self.group_size" in lin_src and "torch.float8_e4m3fn" in lin_src
    for w in ("w13", "w2"):
        for name in ("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale"):
            assert f'register_parameter("{w}_{name}"' in moe_src or f'register_parameter(\n            "{w}_{name}"' in moe_src
    ct_src = (root / "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py").read_text()
    fmt = ct_src[ct_src.index("def _is_nvfp4_format"):][:900]
    for needle in ("QuantizationStrategy.TENSOR_GROUP", "group_size == 16", "QuantizationType.FLOAT", "num_bits == 4"):
        assert needle in fmt
    q = ck.nvfp4_config(True)["config_groups"]["group_0"]
    for args in (q["weights"], q["input_activations"]):
        assert (args["strategy"], args["group_size"], args["type"], args["num_bits"]) == ("tensor_group", 16, "float", 4)
    gemma4 = (root / "vllm/model_executor/models/gemma4.py").read_text()
    assert 'f"experts.{expert_id}.{proj_name}."' in gemma4
    names = _tensors(nvfp4["ct-nvfp4-moe"].path)
    assert any(EXPERT_TENSOR.search(k) for k in names)
