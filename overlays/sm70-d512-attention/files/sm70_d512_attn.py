"""head_dim-512 attention on compute capability 7.0 (V100) through the sm70-d512-attention kernels.

Called from TritonAttentionImpl.forward (the backend vLLM selects on sm70, where
FlashAttention and FlashInfer do not run) once the KV cache holds the step's
tokens. Returns True when it wrote `output`; False leaves the step to Triton:
another GPU, fp8 KV cache, ALiBi, soft-cap, sinks, multimodal prefix ranges,
or kernels that are not built/loadable (logged once).

The kernels come from the `overlay build` cache ($OVERLAY_KERNEL_CACHE, the compose
volume); the launcher is the overlay's sm70_d512_kernels module beside this one, on top
of the overlay-manager package's kernel runtime (`manager.kernels.runtime`), found on
sys.path or under $OVERLAY_MANAGER_HOME. OVERLAY_D512=off disables the route,
OVERLAY_D512=force enables it on any GPU (a test switch; unset = auto = compute capability 7.0 only).
The first decode, split decode, prefill and chunked prefill that run on the kernels are each logged
once ("head_dim-512 attention: <kind> ran ... pid N"): the marker that they ran in the engine's worker.
"""

from __future__ import annotations

import os
import sys

import torch

from vllm.logger import init_logger

logger = init_logger(__name__)

_state: dict = {}


def _kernels():
    if "attn" in _state:
        return _state["attn"]
    attn = None
    mode = os.environ.get("OVERLAY_D512", "auto").lower()
    try:
        if mode != "off" and (mode == "force" or torch.cuda.get_device_capability() == (7, 0)):
            home = os.environ.get("OVERLAY_MANAGER_HOME")
            if home and home not in sys.path:
                sys.path.append(home)
            from vllm.v1.attention.backends import sm70_d512_kernels as d512

            cache = os.environ.get("OVERLAY_KERNEL_CACHE")
            attn = d512.load(cache=cache or None)
            logger.info("head_dim-512 attention: sm70-d512-attention kernels (%s)",
                        ", ".join(f"{o.arch} {o.kind}" for o in attn.k.objects))
    except Exception as exc:  # noqa: BLE001 - any failure falls back to Triton
        logger.warning("head_dim-512 attention: sm70-d512-attention kernels unavailable (%s); using Triton", exc)
        attn = None
    _state["attn"] = attn
    return attn


def _ran(kind: str, detail: str) -> None:
    seen = _state.setdefault("ran", set())
    if kind not in seen:
        seen.add(kind)
        logger.info("head_dim-512 attention: %s ran on sm70-d512-attention kernels in pid %d (%s)",
                    kind, os.getpid(), detail)


def sm70_d512_forward(impl, query, key_cache, value_cache, output, attn_metadata) -> bool:
    if (
        query.dtype != torch.float16
        or key_cache.dtype != torch.float16
        or getattr(impl, "alibi_slopes", None) is not None
        or getattr(impl, "logits_soft_cap", 0)
        or getattr(impl, "sinks", None) is not None
        or getattr(impl, "chunk_lookback", -1) not in (-1, None)
        or getattr(attn_metadata, "mm_prefix_range_tensor", None) is not None
        or getattr(attn_metadata, "use_cascade", False)
    ):
        return False
    left, right = getattr(impl, "sliding_window", (-1, -1)) or (-1, -1)
    if right not in (-1, 0):
        return False
    attn = _kernels()
    if attn is None:
        return False
    window = left + 1 if left >= 0 else 0
    heads, hd = impl.num_heads, impl.head_size
    seq_lens = attn_metadata.seq_lens
    if attn_metadata.max_query_len == 1:
        n = seq_lens.shape[0]
        out = output[:n].view(n, heads, hd)
        max_seq_len = attn_metadata.max_seq_len
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            # A captured decode graph replays for every context length, but the split count is fixed
            # at capture (where vLLM's dummy batches have seq_len 1): size it for the longest context
            # the block table can hold. Empty splits are neutral in the merge, so shorter ones stay exact.
            max_seq_len = max(max_seq_len, attn_metadata.block_table.shape[1] * key_cache.shape[1])
        attn.decode(query[:n].view(n, heads, hd), key_cache, value_cache, attn_metadata.block_table, seq_lens,
                    max_seq_len, impl.scale, window=window, out=out)
        splits = getattr(attn, "last_splits", 1)
        detail = f"{n} seqs, max_seq_len {max_seq_len}, {splits} splits"
        _ran("decode", detail)
        if splits > 1:
            _ran("split decode", detail)
    else:
        n = attn_metadata.num_actual_tokens
        out = output[:n].view(n, heads, hd)
        attn.prefill(query[:n].view(n, heads, hd), key_cache, value_cache, attn_metadata.block_table,
                     attn_metadata.query_start_loc, seq_lens, attn_metadata.max_query_len, impl.scale,
                     causal=True, window=window, out=out)
        detail = f"{n} tokens, max_query_len {attn_metadata.max_query_len}, max_seq_len {attn_metadata.max_seq_len}"
        _ran("prefill", detail)
        if attn_metadata.max_seq_len > attn_metadata.max_query_len:
            _ran("chunked prefill", detail)
    return True
