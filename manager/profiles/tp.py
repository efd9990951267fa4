"""Tensor-parallel sizes and vLLM's head-split rule: the one place fits and inspect read them from."""

from __future__ import annotations

from .schema import ModelProfile

TP_SIZES = (1, 2, 4, 8, 16)  # the tensor-parallel sizes fits, plan and inspect consider


def kv_heads_split(kv_heads: int, tp: int) -> bool:
    """vLLM's rule for KV heads under TP (Gemma4Attention, vllm/model_executor/models/gemma4.py of 0.19.1
    and later; QKVParallelLinear alike): at least TP heads must divide by TP; fewer must divide TP, and
    each rank then holds a replica of one head (the KV bytes per rank grow: fits.memory._per_rank)."""
    return kv_heads % tp == 0 if kv_heads >= tp else tp % kv_heads == 0


def valid_tps(model: ModelProfile) -> list[int]:
    """The sizes of TP_SIZES the model's attention heads and every attention group's KV heads split under."""
    out = []
    for tp in TP_SIZES:
        if model.num_attention_heads % tp:
            continue
        if all(kv_heads_split(g.kv_heads, tp) for g in model.layer_groups if g.kind != "linear" and g.kv_heads):
            out.append(tp)
    return out
