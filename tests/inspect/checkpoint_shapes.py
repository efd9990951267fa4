"""Header-only synthetic checkpoints with the key names, dtypes and shapes of public Gemma-4 checkpoints.

Each set is a config.json, a model.safetensors.index.json and shards holding ONLY the 8-byte
length + JSON header (the data region is absent: the files are "truncated"), or, with
`sparse=True`, a data region made of a hole (os.truncate: no disk blocks).

Where the shapes come from:
- config values: the model profiles (profiles/models/*.yaml, each field with its public source);
- key names / per-layer modules: transformers 5.24.0 models/gemma4/modeling_gemma4.py
  (Gemma4TextAttention: no k/v projections on KV-shared layers, no v_proj on K=V layers;
  Gemma4TextMLP double-wide on KV-shared layers; Gemma4TextExperts fused [E, 2I, H] / [E, H, I];
  router proj/scale/per_expert_scale; per-layer embeddings); Gemma4ForConditionalGeneration
  prefixes `model.language_model.`, `model.vision_tower.`, `model.embed_vision.`;
- the vision tower: transformers 5.24.0 Gemma4VisionConfig defaults (768 hidden, 16 layers, 3072 MLP),
  NOT re-read from the public checkpoints;
- ASSUMED (not in the profiles' sources): intermediate_size of 31B (21504) and 12B (15360) = 4 x hidden;
- compressed-tensors pack-quantized W4A16 layout (weight_packed I32 [out, in/8], weight_scale
  [out, in/group], weight_shape I64 [2]; fused experts `experts.{gate_up,down}_proj_{packed,scale}`):
  overlays/vllm-pr40886-gemma4-awq-moe-keys (PR #40886) and docs/engine.md (the project's real-engine runs);
- NVFP4 compressed-tensors layout (weight_packed U8 [out, in/2], weight_scale F8_E4M3 [out, in/16],
  weight_global_scale / input_global_scale F32 [1]) with the per-layer embedding quantized, which
  is what a user report's KeyError 'embed_tokens_per_layer.weight_packed' implies.
A factory-made tiny real checkpoint (testing/checkpoints.py, branch `engine`) can be
added as another case next to these: the tests take a directory.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

from manager.inspect.headers import expected_nbytes, header_bytes

Tensor = tuple[str, str, tuple[int, ...]]


def _layer_types(n: int, full_every: int) -> list[str]:
    return ["full_attention" if (i + 1) % full_every == 0 else "sliding_attention" for i in range(n)]


MODELS: dict[str, dict[str, Any]] = {
    "26b-a4b": dict(hidden_size=2816, num_hidden_layers=30, num_attention_heads=16, num_key_value_heads=8,
                    num_global_key_value_heads=2, head_dim=256, global_head_dim=512, sliding_window=1024,
                    attention_k_eq_v=True, enable_moe_block=True, num_experts=128, top_k_experts=8,
                    moe_intermediate_size=704, intermediate_size=2112, max_position_embeddings=262144,
                    vocab_size=262144, layer_types=_layer_types(30, 6), tie_word_embeddings=True),
    "31b": dict(hidden_size=5376, num_hidden_layers=60, num_attention_heads=32, num_key_value_heads=16,
                num_global_key_value_heads=4, head_dim=256, global_head_dim=512, sliding_window=1024,
                attention_k_eq_v=True, intermediate_size=21504, max_position_embeddings=262144, vocab_size=262144,
                layer_types=_layer_types(60, 6), tie_word_embeddings=True),
    "12b": dict(hidden_size=3840, num_hidden_layers=48, num_attention_heads=16, num_key_value_heads=8,
                num_global_key_value_heads=1, head_dim=256, global_head_dim=512, sliding_window=1024,
                attention_k_eq_v=True, intermediate_size=15360, max_position_embeddings=262144, vocab_size=262144,
                layer_types=_layer_types(48, 6), tie_word_embeddings=True),
    "e2b": dict(hidden_size=1536, num_hidden_layers=35, num_attention_heads=8, num_key_value_heads=1,
                num_global_key_value_heads=1, head_dim=256, global_head_dim=512, sliding_window=512,
                attention_k_eq_v=False, intermediate_size=6144, num_kv_shared_layers=20, use_double_wide_mlp=True,
                hidden_size_per_layer_input=256, vocab_size_per_layer_input=262144, max_position_embeddings=131072,
                vocab_size=262144, layer_types=_layer_types(35, 5), tie_word_embeddings=True),
}
ARCH = {"12b": ("Gemma4UnifiedForConditionalGeneration", "gemma4_unified")}
VISION = dict(hidden=768, layers=16, inter=3072)

CT_W4A16 = {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                          "weights": {"num_bits": 4, "type": "int", "strategy": "group",
                                                      "group_size": 32, "symmetric": True}}},
            "ignore": ["lm_head", "re:.*router.*", "re:.*vision_tower.*", "re:.*embed_vision.*"]}
CT_NVFP4 = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"],
                                          "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                                                      "group_size": 16, "symmetric": True},
                                          "input_activations": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                                                                "group_size": 16, "dynamic": "local"}}},
            "ignore": ["lm_head", "re:.*vision_tower.*", "re:.*embed_vision.*", "re:.*embed_audio.*"]}


def config(model: str, quant: dict | None = None) -> dict[str, Any]:
    arch, mtype = ARCH.get(model, ("Gemma4ForConditionalGeneration", "gemma4"))
    text = dict(MODELS[model], model_type=f"{mtype}_text")
    cfg: dict[str, Any] = {"architectures": [arch], "model_type": mtype, "text_config": text, "dtype": "bfloat16",
                           "vision_config": {"hidden_size": VISION["hidden"], "num_hidden_layers": VISION["layers"]},
                           "tie_word_embeddings": True}
    if quant:
        cfg["quantization_config"] = quant
    return cfg


def _linear(name: str, out: int, inp: int, quant: str | None) -> list[Tensor]:
    if quant == "w4a16":
        return [(f"{name}.weight_packed", "I32", (out, inp // 8)), (f"{name}.weight_scale", "BF16", (out, inp // 32)),
                (f"{name}.weight_shape", "I64", (2,))]
    if quant == "nvfp4":
        return [(f"{name}.weight_packed", "U8", (out, inp // 2)), (f"{name}.weight_scale", "F8_E4M3", (out, inp // 16)),
                (f"{name}.weight_global_scale", "F32", (1,)), (f"{name}.input_global_scale", "F32", (1,))]
    return [(f"{name}.weight", "BF16", (out, inp))]


def tensors(model: str, quant: str | None = None) -> list[Tensor]:
    c = MODELS[model]
    H, n, heads = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"]
    shared_from = n - c.get("num_kv_shared_layers", 0)
    lm = "model.language_model"
    out: list[Tensor] = [(f"{lm}.embed_tokens.weight", "BF16", (c["vocab_size"], H)), (f"{lm}.norm.weight", "BF16", (H,))]
    ple = c.get("hidden_size_per_layer_input")
    if ple:
        # the NVFP4 quant quantizes the per-layer embedding table too (seed 000's KeyError)
        out += _linear(f"{lm}.embed_tokens_per_layer", c["vocab_size_per_layer_input"], n * ple, quant if quant == "nvfp4" else None)
        out += _linear(f"{lm}.per_layer_model_projection", n * ple, H, quant)
        out.append((f"{lm}.per_layer_projection_norm.weight", "BF16", (ple,)))
    for i, lt in enumerate(c["layer_types"]):
        p = f"{lm}.layers.{i}"
        full = lt == "full_attention"
        d = c["global_head_dim"] if full else c["head_dim"]
        kv = c["num_global_key_value_heads"] if full else c["num_key_value_heads"]
        out += [(f"{p}.{nm}.weight", "BF16", (H,)) for nm in
                ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")]
        out.append((f"{p}.layer_scalar", "BF16", (1,)))
        out += _linear(f"{p}.self_attn.q_proj", heads * d, H, quant)
        out.append((f"{p}.self_attn.q_norm.weight", "BF16", (d,)))
        if i < shared_from:
            out += _linear(f"{p}.self_attn.k_proj", kv * d, H, quant)
            out.append((f"{p}.self_attn.k_norm.weight", "BF16", (d,)))
            if not (full and c.get("attention_k_eq_v")):
                out += _linear(f"{p}.self_attn.v_proj", kv * d, H, quant)
        out += _linear(f"{p}.self_attn.o_proj", H, heads * d, quant)
        inter = c["intermediate_size"] * (2 if c.get("use_double_wide_mlp") and i >= shared_from else 1)
        out += _linear(f"{p}.mlp.gate_proj", inter, H, quant) + _linear(f"{p}.mlp.up_proj", inter, H, quant)
        out += _linear(f"{p}.mlp.down_proj", H, inter, quant)
        if ple:
            out += _linear(f"{p}.per_layer_input_gate", ple, H, quant) + _linear(f"{p}.per_layer_projection", H, ple, quant)
            out.append((f"{p}.post_per_layer_input_norm.weight", "BF16", (H,)))
        if c.get("enable_moe_block"):
            E, I = c["num_experts"], c["moe_intermediate_size"]
            out += [(f"{p}.router.proj.weight", "BF16", (E, H)), (f"{p}.router.scale", "BF16", (H,)),
                    (f"{p}.router.per_expert_scale", "BF16", (E,))]
            out += [(f"{p}.{nm}.weight", "BF16", (H,)) for nm in
                    ("post_feedforward_layernorm_1", "post_feedforward_layernorm_2", "pre_feedforward_layernorm_2")]
            if quant == "w4a16":
                out += [(f"{p}.experts.gate_up_proj_packed", "I32", (E, 2 * I, H // 8)),
                        (f"{p}.experts.gate_up_proj_scale", "BF16", (E, 2 * I, H // 32)),
                        (f"{p}.experts.down_proj_packed", "I32", (E, H, I // 8)),
                        (f"{p}.experts.down_proj_scale", "BF16", (E, H, I // 32))]
            else:
                out += [(f"{p}.experts.gate_up_proj", "BF16", (E, 2 * I, H)), (f"{p}.experts.down_proj", "BF16", (E, H, I))]
    vh, vi = VISION["hidden"], VISION["inter"]
    for j in range(VISION["layers"]):
        v = f"model.vision_tower.encoder.layers.{j}"
        for nm in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out.append((f"{v}.self_attn.{nm}.linear.weight", "BF16", (vh, vh)))
        out += [(f"{v}.mlp.gate_proj.linear.weight", "BF16", (vi, vh)), (f"{v}.mlp.up_proj.linear.weight", "BF16", (vi, vh)),
                (f"{v}.mlp.down_proj.linear.weight", "BF16", (vh, vi)), (f"{v}.input_layernorm.weight", "BF16", (vh,))]
    out.append(("model.embed_vision.embedding_projection.weight", "BF16", (H, vh)))
    return out


def write(dest: Path, model: str, quant: str | None = None, *, shard_bytes: int = 5_000_000_000,
          sparse: bool = False, index: bool = True) -> dict[str, Any]:
    """Write config.json, the index and header-only shards; return {"total": bytes, "tensors": n, "files": [...]}."""
    dest.mkdir(parents=True, exist_ok=True)
    qcfg = {"w4a16": CT_W4A16, "nvfp4": CT_NVFP4}.get(quant or "")
    (dest / "config.json").write_text(json.dumps(config(model, qcfg), indent=1))
    ts = tensors(model, quant)
    shards: list[list[Tensor]] = [[]]
    size = 0
    for t in ts:
        nb = expected_nbytes(t[1], t[2])
        if shards[-1] and size + nb > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += nb
    files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))] if len(shards) > 1 or index \
        else ["model.safetensors"]
    weight_map = {}
    total = 0
    for f, group in zip(files, shards):
        hdr, off = {}, 0
        for name, dtype, shape in sorted(group):
            nb = expected_nbytes(dtype, shape)
            hdr[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + nb]}
            off += nb
            weight_map[name] = f
        raw = header_bytes(hdr, {"format": "pt"})
        (dest / f).write_bytes(raw)
        if sparse:
            os.truncate(dest / f, len(raw) + off)
        total += off
    if index:
        (dest / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    return {"total": total, "tensors": len(ts), "files": files}


def scale_first_dims(shard: Path, factor: int, dest: Path | None = None) -> None:
    """Write `shard`'s header again (to `dest`, default in place), header only, with every tensor's first
    dimension and byte range x `factor`: the same keys, describing `factor` times the bytes."""
    raw = shard.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    obj = json.loads(raw[8:8 + n])
    meta = obj.pop("__metadata__", None)
    off, new = 0, {}
    for k, v in sorted(obj.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        size = (v["data_offsets"][1] - v["data_offsets"][0]) * factor
        new[k] = {"dtype": v["dtype"], "shape": [v["shape"][0] * factor] + v["shape"][1:], "data_offsets": [off, off + size]}
        off += size
    (dest or shard).write_bytes(header_bytes(new, meta))
