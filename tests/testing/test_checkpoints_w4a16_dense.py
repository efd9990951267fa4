"""The factory's dense W4A16 kinds (ct-w4a16-dense, ct-w4a16-dense-asym), checked against the parameters vLLM
0.19.1's and 0.20.0's CompressedTensorsWNA16.create_weights registers (their sources from the cached sdists via
manager.releases) and against their own dequantized/ float reference."""

from __future__ import annotations

import json
import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from manager import releases
from testing import checkpoints as ck
from tests.testing.test_checkpoints_nvfp4 import _tensors

WNA16 = "vllm/model_executor/layers/quantization/compressed_tensors/schemes/compressed_tensors_wNa16.py"
LINEAR = re.compile(r"\.(self_attn|mlp)\.(q|k|v|o|gate|up|down)_proj\.weight_packed$")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    base = tmp_path_factory.mktemp("w4a16-dense")
    return {k: ck.build_checkpoint(k, base / k) for k in ("ct-w4a16-dense", "ct-w4a16-dense-asym")}


def _dequantize(t, b, symmetric, group=32):
    q = ck.unpack_int4(t[b + ".weight_packed"]).to(torch.int64) + 8   # stored nibbles
    n, k = q.shape
    if symmetric:
        z = torch.full((n, k // group), 8)
    else:
        zp = t[b + ".weight_zero_point"].to(torch.int64) & 0xFFFFFFFF
        z = torch.stack([(zp >> (4 * i)) & 0xF for i in range(8)], dim=1).reshape(-1, zp.shape[-1])[:n]
    gi = torch.arange(k) // group
    return (q - z[:, gi]).float() * t[b + ".weight_scale"].float()[:, gi]


@pytest.mark.parametrize("kind, symmetric", [("ct-w4a16-dense", True), ("ct-w4a16-dense-asym", False)])
def test_every_attention_and_mlp_linear_is_packed_and_dequantizes_to_the_reference(built, kind, symmetric):
    info = built[kind]
    t, ref = _tensors(info.path), _tensors(info.reference_path)
    bases = sorted(k[: -len(".weight_packed")] for k in t if LINEAR.search(k))
    layers = {b.split(".self_attn")[0].split(".mlp")[0] for b in bases}
    assert len(layers) == 6 and len(bases) >= 6 * 6
    for b in bases:
        assert b + ".weight" not in t and b + ".weight" in ref
        n, k = ref[b + ".weight"].shape
        assert t[b + ".weight_packed"].dtype == torch.int32 and t[b + ".weight_packed"].shape == (n, k // 8)
        assert t[b + ".weight_scale"].shape == (n, k // 32) and t[b + ".weight_scale"].dtype == torch.bfloat16
        assert t[b + ".weight_shape"].tolist() == [n, k]
        assert (b + ".weight_zero_point" in t) != symmetric
        if not symmetric:
            assert t[b + ".weight_zero_point"].shape == (-(-n // 8), k // 32)
        deq = _dequantize(t, b, symmetric)
        assert ref[b + ".weight"].dtype == torch.float32 and torch.equal(deq, ref[b + ".weight"])
    cfg = json.loads((info.path / "config.json").read_text())["quantization_config"]
    assert cfg["config_groups"]["group_0"]["weights"]["symmetric"] is symmetric
    assert cfg["ignore"] == ["lm_head", "re:.*router.*"] and cfg["format"] == "pack-quantized"


@pytest.mark.parametrize("version", ["0.19.1", "0.20.0"])
def test_vllm_declares_the_tensors_the_dense_w4a16_kinds_carry(built, version):
    src = (releases.pristine_tree(version) / WNA16).read_text()
    for name in ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point"):
        assert f'register_parameter("{name}"' in src
    # [N, K/8] int32 packed along K; scales [N, K/group]; zero points [N/8, K/group] int32 packed along N
    assert "input_size_per_partition // self.pack_factor" in src and "dtype=torch.int32" in src
    assert "output_size_per_partition // self.pack_factor" in src and "packed_dim=0" in src
    assert "WNA16_ZP_SUPPORTED_TYPES_MAP" in src and "def get_min_capability" in src
    t = _tensors(built["ct-w4a16-dense-asym"].path)
    assert any(k.endswith(".weight_zero_point") for k in t)


@pytest.mark.parametrize("kind", ["ct-w4a16-dense", "ct-w4a16-dense-asym"])
def test_dequantized_reference_is_float32_and_holds_the_checkpoints_other_tensors_unchanged(built, kind):
    """The reference is what the quantized checkpoint means, not a bfloat16 rounding of it: every tensor the two
    share equals the checkpoint's bfloat16 value exactly, and the quantized ones are exact q * scale in float32
    (bfloat16 cannot hold all of them: the test below)."""
    info = built[kind]
    t, ref = _tensors(info.path), _tensors(info.reference_path)
    shared = [k for k in ref if k in t]
    assert shared and all(ref[k].dtype == torch.float32 for k in ref)
    for k in shared:
        assert t[k].dtype == torch.bfloat16 and torch.equal(t[k].float(), ref[k]), k
    assert json.loads((info.reference_path / "config.json").read_text()).get("dtype") in (None, "float32")


def test_a_bfloat16_reference_would_round_the_dequantized_int4_weights(built):
    """Why the reference is float32: q * scale with a bfloat16 scale needs up to 11 significant bits, so a bfloat16
    copy of the dequantized weights differs from them (the engine's float16 holds them exactly)."""
    info = built["ct-w4a16-dense"]
    t = _tensors(info.path)
    b = "model.layers.0.mlp.down_proj"
    deq = _dequantize(t, b, True)
    assert not torch.equal(deq.to(torch.bfloat16).float(), deq)
    assert torch.equal(deq.to(torch.float16).float(), deq)
