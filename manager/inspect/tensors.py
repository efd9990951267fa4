"""Tensor classes and how vLLM splits each across tensor-parallel ranks.

Sources for the rules (vLLM 0.20.0 sdist, read 2026-11-30):
- vllm/model_executor/models/gemma4.py: QKVParallelLinear (q/k/v), RowParallelLinear (o_proj,
  mlp.down_proj), MergedColumnParallelLinear (mlp gate/up), FusedMoE (experts), GateLinear
  router "replicated across TP", VocabParallelEmbedding (embed_tokens, embed_tokens_per_layer),
  ParallelLMHead (lm_head, tied to embed_tokens when tie_word_embeddings), ColumnParallelLinear
  (per_layer_model_projection), ReplicatedLinear (per_layer_input_gate, per_layer_projection).
- vllm/model_executor/models/gemma4_mm.py: vision/audio towers are transformers AutoModel
  modules (not TP-sharded); embed_vision/embed_audio use ReplicatedLinear.
- FusedMoE under TP (no expert parallelism) keeps every expert on every rank and splits each
  expert's intermediate dimension.
The same layer kinds carry the same names in Llama/Qwen-style checkpoints.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from .headers import TensorEntry, expected_nbytes

PREFIXES = ("model.language_model.", "language_model.model.", "model.text_model.", "language_model.", "model.")
TOWERS = ("vision_tower", "audio_tower", "embed_vision", "embed_audio", "vision_model", "multi_modal_projector")
# Parameter names that only quantized modules carry.
QUANT_PARAMS = {
    "weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight_global_scale",
    "input_global_scale", "weight_scale_2", "input_scale", "qweight", "qzeros", "scales", "g_idx",
}
TRANSPOSED = {"qweight", "qzeros", "scales"}  # GPTQ/AWQ store [in, out]-major
COLUMN = {"q_proj", "k_proj", "v_proj", "qkv_proj", "gate_proj", "up_proj", "gate_up_proj",
          "per_layer_model_projection"}
ROW = {"o_proj", "down_proj"}
VOCAB = {"embed_tokens", "embed_tokens_per_layer", "lm_head"}
REPLICATED_LINEAR = {"per_layer_input_gate", "per_layer_projection"}
FUSED_EXPERT = re.compile(r"^(?P<mod>.*\bexperts)\.(?P<proj>gate_up_proj|down_proj)"
                          r"(?:_(?P<part>packed|scale|zero_point|shape))?$")

_INDEX = re.compile(r"\.\d+\.")

RULES = {
    "column": "split by output rows "
              "(column-parallel: QKVParallelLinear / MergedColumnParallelLinear / ColumnParallelLinear)",
    "row": "split by input columns (row-parallel: RowParallelLinear)",
    "vocab": "split by vocabulary rows (VocabParallelEmbedding / ParallelLMHead)",
    "experts": "every expert on every rank, each expert's intermediate dim split (FusedMoE TP)",
    "replicated": "whole on every rank",
}


@dataclass(frozen=True)
class Placement:
    cls: str  # tensor class, e.g. layers.*.self_attn.q_proj
    param: str  # weight, weight_packed, weight_scale, packed, ...
    rule: str  # column / row / vocab / experts / replicated
    dim: int | None  # the split dimension of this tensor (None: replicated)
    why: str = ""  # for replicated tensors: why
    quantized: bool = False


def strip_prefix(name: str) -> str:
    for p in PREFIXES:
        if name.startswith(p):
            return name[len(p):]
    return name


def classify(t: TensorEntry) -> Placement:
    generic = _INDEX.sub(".*.", "." + strip_prefix(t.name) + ".")[1:-1]
    return _classify(generic, len(t.shape))


@functools.lru_cache(maxsize=4096)
def _classify(generic: str, ndim: int) -> Placement:
    top = generic.split(".", 1)[0]
    m = FUSED_EXPERT.match(generic)
    if m:
        cls = f"{m['mod']}.{m['proj']}"
        param = m["part"] or "weight"
        quant = m["part"] in ("packed", "scale", "zero_point", "shape")
        if ndim == 3:
            return Placement(cls, param, "experts", 1 if m["proj"] == "gate_up_proj" else 2, quantized=quant)
        return Placement(cls, param, "replicated", None, "expert metadata (shape/scalar)", quant)
    cls, _, param = generic.rpartition(".")
    if not cls:
        cls, param = generic, ""
    quant = param in QUANT_PARAMS
    leaf = cls.rsplit(".", 1)[-1]
    if top in TOWERS:
        return Placement(top, param, "replicated", None, "vision/audio tower or its projection (not TP-sharded)", quant)
    if (param in ("weight_shape", "weight_global_scale", "input_global_scale", "weight_scale_2", "input_scale")
            or ndim <= 1):
        if param == "g_idx" and leaf in ROW:
            return Placement(cls, param, "row", 0, quantized=True)
        return Placement(cls, param, "replicated", None, "1-D or scalar (norm, router scale, per-tensor scale, shape)",
                         quant)
    transposed = param in TRANSPOSED
    if cls in VOCAB or (leaf in VOCAB and "layers" not in cls):
        return Placement(cls, param, "vocab", 0, quantized=quant)
    if leaf in COLUMN:
        return Placement(cls, param, "column", 1 if transposed else 0, quantized=quant)
    if leaf in ROW:
        return Placement(cls, param, "row", 0 if transposed else 1, quantized=quant)
    if leaf in REPLICATED_LINEAR or ".router" in "." + cls:
        return Placement(cls, param, "replicated", None, "ReplicatedLinear / router (same routing on every rank)",
                         quant)
    return Placement(cls, param, "replicated", None, "unknown layer class: counted whole on every rank", quant)


def rank_bytes(t: TensorEntry, p: Placement, tp: int) -> int | None:
    """Bytes of `t` one rank holds at TP `tp` (None: the split dimension is not divisible by tp)."""
    if p.dim is None or tp == 1:
        return t.nbytes
    n = t.shape[p.dim]
    if n % tp:
        return None
    shape = list(t.shape)
    shape[p.dim] = n // tp
    return expected_nbytes(t.dtype, tuple(shape))
