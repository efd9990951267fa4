"""Every attention layer on compute capability 7.0 (V100) through the sm70-d512-attention kernel family.

Called from TritonAttentionImpl.forward (the backend vLLM selects on sm70, where
FlashAttention and FlashInfer do not run) once the KV cache holds the step's tokens, for
every head dim. Returns True when it wrote `output`; False leaves the step to Triton, with
one log line per distinct reason ("sm70 attention: head_dim-D layers stay on Triton: <why>"):
another GPU, a head dim outside 64/128/256/512, a cache format the kernels do not read
(bf16, int8, per-token-head fp8), ALiBi, soft-cap, sinks, a chunk lookback, multimodal
prefix ranges, cascade, a right-hand window, or kernels that are not built/loadable.

KV formats: fp16, and fp8 storage ("fp8" / "fp8_e4m3" -> e4m3, "fp8_e5m2" -> e5m2) with
vLLM's per-tensor scales (layer._k_scale / _v_scale, read by the kernels on the device, so
CUDA graphs see scale updates); the format comes from the layer's kv_cache_dtype, not from
the dtype of the view (vLLM views every fp8 cache as the platform's fp8 type).

The kernels come from the `overlay build` cache ($OVERLAY_KERNEL_CACHE, the compose volume);
the launcher is the overlay's sm70_d512_kernels module beside this one, on top of the
overlay-manager package's kernel runtime (`manager.kernels.runtime`), found on sys.path or
under $OVERLAY_MANAGER_HOME. The switch is $OVERLAY_SM70_ATTENTION (the old name
$OVERLAY_D512 is read when the new one is unset, for the whole family): unset = auto =
compute capability 7.0 only, `off` disables the route, `force` enables it on any GPU (a test
switch). The first decode, split decode, prefill and chunked prefill of each head dim that run
on the kernels are each logged once ("head_dim-D attention: <kind> ran ... pid N"): the marker
that they ran in the engine's worker.
"""

from __future__ import annotations

import os
import sys

import torch

from vllm.logger import init_logger

logger = init_logger(__name__)

ENV = "OVERLAY_SM70_ATTENTION"
ENV_OLD = "OVERLAY_D512"
HEAD_DIMS = (64, 128, 256, 512)   # the launcher's HEAD_DIMS (checked by the overlay's tests)
# vLLM's kv_cache_dtype strings -> the kernels' KV formats
KV_FORMATS = {"auto": "fp16", "float16": "fp16", "half": "fp16", "fp8": "e4m3", "fp8_e4m3": "e4m3",
              "fp8_e5m2": "e5m2"}

_state: dict = {}


def mode() -> str:
    """auto | off | force, from $OVERLAY_SM70_ATTENTION, else $OVERLAY_D512 (unset: auto)."""
    raw = os.environ.get(ENV) or os.environ.get(ENV_OLD) or "auto"
    m = raw.strip().lower()
    if m not in ("auto", "off", "force"):
        _fallback(f"{ENV}={raw!r} is not auto, off or force; using auto", key="bad-mode")
        m = "auto"
    return m


def _fallback(why: str, key=None, quiet: bool = False) -> None:
    """One log line per distinct reason (info when the route is merely off or not on sm70)."""
    seen = _state.setdefault("fallbacks", set())
    k = key or why
    if k not in seen:
        seen.add(k)
        (logger.info if quiet else logger.warning)("sm70 attention: %s", why)


def _kernels():
    if "attn" in _state:
        return _state["attn"]
    attn = None
    m = mode()
    try:
        if m == "off":
            _state["why"], _state["quiet"] = f"disabled ({ENV}/{ENV_OLD}=off)", True
        elif m == "force" or torch.cuda.get_device_capability() == (7, 0):
            home = os.environ.get("OVERLAY_MANAGER_HOME")
            if home and home not in sys.path:
                sys.path.append(home)
            from vllm.v1.attention.backends import sm70_d512_kernels as family

            cache = os.environ.get("OVERLAY_KERNEL_CACHE")
            attn = family.load(cache=cache or None)
            logger.info("sm70 attention (head dims %s): sm70-d512-attention kernels (%s)",
                        "/".join(str(d) for d in HEAD_DIMS), ", ".join(f"{o.arch} {o.kind}" for o in attn.k.objects))
        else:
            _state["quiet"] = True
            _state["why"] = (f"compute capability {'.'.join(map(str, torch.cuda.get_device_capability()))} "
                             f"is not 7.0 ({ENV}=force routes any GPU)")
    except Exception as exc:  # noqa: BLE001 - any failure falls back to Triton
        _state["why"] = f"sm70-d512-attention kernels unavailable ({exc}); using Triton"
        attn = None
    _state["attn"] = attn
    return attn


def route_reason(impl, layer, query, key_cache, attn_metadata) -> str | None:
    """Why this layer stays on Triton (None: the kernels take it). Cheap attribute checks only."""
    hd = impl.head_size
    if hd not in HEAD_DIMS:
        return f"head dim {hd} (the kernels cover {'/'.join(map(str, HEAD_DIMS))})"
    if query.dtype != torch.float16:
        return f"query dtype {query.dtype} (the kernels take fp16)"
    kv_dtype = getattr(impl, "kv_cache_dtype", "auto")
    fmt = KV_FORMATS.get(kv_dtype)
    if fmt is None or getattr(impl, "_is_per_token_head_quant", False):
        return f"kv_cache_dtype {kv_dtype!r} (the kernels read fp16, fp8 / fp8_e4m3 and fp8_e5m2 with per-tensor scales)"
    if fmt == "fp16" and key_cache.dtype != torch.float16:
        return f"KV cache dtype {key_cache.dtype} (the kernels take fp16 or fp8)"
    if fmt != "fp16":
        if key_cache.element_size() != 1:
            return f"kv_cache_dtype {kv_dtype!r} but a {key_cache.dtype} cache"
        if getattr(layer, "_q_scale_float", 1.0) != 1.0:
            return "a query scale other than 1.0"
    if getattr(impl, "alibi_slopes", None) is not None:
        return "ALiBi"
    if getattr(impl, "logits_soft_cap", 0):
        return "logits soft-cap"
    if getattr(impl, "sinks", None) is not None:
        return "attention sinks"
    if getattr(impl, "chunk_lookback", -1) not in (-1, None):
        return "chunk lookback"
    if getattr(attn_metadata, "mm_prefix_range_tensor", None) is not None:
        return "multimodal prefix ranges"
    if getattr(attn_metadata, "use_cascade", False):
        return "cascade attention"
    left, right = getattr(impl, "sliding_window", (-1, -1)) or (-1, -1)
    if right not in (-1, 0):
        return f"a right-hand window ({right})"
    return None


def _ran(hd: int, kind: str, detail: str) -> None:
    seen = _state.setdefault("ran", set())
    if (hd, kind) not in seen:
        seen.add((hd, kind))
        logger.info("head_dim-%d attention: %s ran on sm70-d512-attention kernels in pid %d (%s)",
                    hd, kind, os.getpid(), detail)


def _capturing(query) -> bool:
    """Is this call being captured into a CUDA graph? Asked of the query's device, not of
    torch.cuda.is_available(): vLLM sets PYTORCH_NVML_BASED_CUDA_CHECK=1 (vllm/env_override.py), which makes
    is_available() an NVML query on every call (38 us per call on a CPU host, benchmarks/route_cost.py)."""
    return bool(query.is_cuda) and torch.cuda.is_current_stream_capturing()


def sm70_attention_forward(impl, query, key_cache, value_cache, output, attn_metadata, layer=None) -> bool:
    hd = impl.head_size
    attn = _kernels()   # first: off / not sm70 / not loadable decide before any per-layer reason
    if attn is None:
        why = _state.get("why", "kernels unavailable")
        _fallback(f"head_dim-{hd} layers stay on Triton: {why}", key=(hd, why), quiet=_state.get("quiet", False))
        return False
    why = route_reason(impl, layer, query, key_cache, attn_metadata)
    if why is not None:
        _fallback(f"head_dim-{hd} layers stay on Triton: {why}", key=(hd, why))
        return False
    fmt = KV_FORMATS[getattr(impl, "kv_cache_dtype", "auto")]
    fp8 = {} if fmt == "fp16" else dict(kv_format=fmt, k_scale=getattr(layer, "_k_scale", None),
                                        v_scale=getattr(layer, "_v_scale", None))
    left = (getattr(impl, "sliding_window", (-1, -1)) or (-1, -1))[0]
    window = left + 1 if left >= 0 else 0
    heads = impl.num_heads
    seq_lens = attn_metadata.seq_lens
    if attn_metadata.max_query_len == 1:
        n = seq_lens.shape[0]
        out = output[:n].view(n, heads, hd)
        max_seq_len = attn_metadata.max_seq_len
        if _capturing(query):
            # A captured decode graph replays for every context length, but the split count is fixed
            # at capture (where vLLM's dummy batches have seq_len 1): size it for the longest context
            # the block table can hold. Empty splits are neutral in the merge, so shorter ones stay exact.
            max_seq_len = max(max_seq_len, attn_metadata.block_table.shape[1] * key_cache.shape[1])
        attn.decode(query[:n].view(n, heads, hd), key_cache, value_cache, attn_metadata.block_table, seq_lens,
                    max_seq_len, impl.scale, window=window, out=out, **fp8)
        splits = getattr(attn, "last_splits", 1)
        detail = f"{n} seqs, max_seq_len {max_seq_len}, {splits} splits, kv {fmt}"
        _ran(hd, "decode", detail)
        if splits > 1:
            _ran(hd, "split decode", detail)
    else:
        n = attn_metadata.num_actual_tokens
        out = output[:n].view(n, heads, hd)
        attn.prefill(query[:n].view(n, heads, hd), key_cache, value_cache, attn_metadata.block_table,
                     attn_metadata.query_start_loc, seq_lens, attn_metadata.max_query_len, impl.scale,
                     causal=True, window=window, out=out, **fp8)
        detail = (f"{n} tokens, max_query_len {attn_metadata.max_query_len}, "
                  f"max_seq_len {attn_metadata.max_seq_len}, kv {fmt}")
        _ran(hd, "prefill", detail)
        if attn_metadata.max_seq_len > attn_metadata.max_query_len:
            _ran(hd, "chunked prefill", detail)
    return True


def sm70_d512_forward(impl, query, key_cache, value_cache, output, attn_metadata, layer=None) -> bool:
    """The D=512-only route's name (kept for callers of the first overlay version)."""
    return sm70_attention_forward(impl, query, key_cache, value_cache, output, attn_metadata, layer)
