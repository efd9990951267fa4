"""Python entry points of the sm70-d512-attention kernels (head_dim 512, fp16, paged KV cache).

The overlay writes this file beside its routed module (vllm/v1/attention/backends/
sm70_d512_kernels.py); tests and benchmarks load it from the overlay's files/ by path. The
generic part (NVRTC build, driver-API loading and launching) is overlay-manager's
`manager.kernels.runtime`, which the serving process finds on sys.path or $OVERLAY_MANAGER_HOME.

    attn = load()                       # built images from the kernel cache, current device
    attn.decode(q, k_cache, v_cache, block_tables, seq_lens, max_seq_len, scale)
    attn.prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, max_query_len, scale)

Caches are vLLM's [num_blocks, block_size, num_kv_heads, 512] fp16 tensors (any strides
with a contiguous last dimension); q/out are [tokens, num_q_heads, 512]. torch is imported
only when these functions run.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

from manager.errors import BuildError
from manager.kernels.runtime import KernelSet, load_overlay_kernels

OVERLAY_ID = "sm70-d512-attention"
HEAD_DIM = 512
MAX_SPLITS = 256   # MAX_SPLITS in paged_decode_d512.cu (the merge kernel's weight table)
MIN_KEYS_PER_SPLIT = 64   # two 32-key chunks
MERGE_COLS = 128   # columns per block of the split merge (MERGE_COLS in paged_decode_d512.cu)
PREFILL_ROWS = 32  # query rows per prefill block (BM in prefill_d512.cu; -DPREFILL_BM builds set prefill_rows)
_lock = threading.Lock()
_loaded: dict[tuple, "D512Attention"] = {}


def _cache_strides(k_cache: Any, v_cache: Any) -> tuple[int, int, int]:
    if k_cache.dim() != 4 or k_cache.shape[-1] != HEAD_DIM:
        raise BuildError(f"k_cache shape {tuple(k_cache.shape)}: expected [blocks, block_size, kv_heads, 512]")
    if tuple(k_cache.stride()) != tuple(v_cache.stride()) or tuple(k_cache.shape) != tuple(v_cache.shape):
        raise BuildError("k_cache and v_cache must have the same shape and strides")
    sb, st, sh, sd = k_cache.stride()
    if sd != 1 or any(s % 8 for s in (sb, st, sh)):
        raise BuildError(f"cache strides {k_cache.stride()}: need a contiguous head dim and 16-byte aligned rows")
    return sb, st, sh



def _check_shapes(kind: str, q, k_cache) -> tuple[int, int, int, int]:
    """(tokens or sequences, query heads, block size, KV heads), or BuildError naming the problem."""
    import torch

    n, num_q_heads, d = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    if d != HEAD_DIM or q.dtype != torch.float16 or k_cache.dtype != torch.float16:
        raise BuildError(f"{kind}: q and caches must be fp16 with head_dim 512")
    if num_q_heads % num_kv_heads:
        raise BuildError(f"{kind}: {num_q_heads} query heads do not group over {num_kv_heads} KV heads")
    return n, num_q_heads, block_size, num_kv_heads


class D512Attention:
    def __init__(self, kernels: KernelSet, num_sms: int, decode_blocks_per_sm: int = 1):
        self.k = kernels
        self.num_sms = num_sms
        self.slots = num_sms * max(1, decode_blocks_per_sm)
        self.last_splits = 1
        self.prefill_rows = PREFILL_ROWS

    def pick_splits(self, num_seqs: int, num_kv_heads: int, group: int, max_seq_len: int) -> int:
        """Split the context so that the decode grid fills one wave of resident blocks.

        As many splits as one wave holds (slots // blocks without splitting), each split keeping
        >= MIN_KEYS_PER_SPLIT keys; a grid that fills the GPU already is not split. Measured on the
        H200 (benchmarks/kernels.py --split-sweep, 2026-11-30): the fastest split count of every
        batch 1/4/8/32 x 4K/32K shape gives one wave of 128-132 blocks (64 splits at batch 1, 16 at
        batch 4), and 64-key splits beat 256-key ones at batch 1 x 4K (20.6 vs 30.2 us).
        """
        base = num_seqs * num_kv_heads * math.ceil(group / 16)
        limit = max(1, min(MAX_SPLITS, math.ceil(max_seq_len / MIN_KEYS_PER_SPLIT)))
        return max(1, min(limit, self.slots // base))

    def decode(self, q, k_cache, v_cache, block_tables, seq_lens, max_seq_len: int, scale: float,
               window: int = 0, kv_shared: bool = False, num_splits: int | None = None, out=None):
        import torch

        num_seqs, num_q_heads, block_size, num_kv_heads = _check_shapes("decode", q, k_cache)
        q = q.contiguous()
        sb, st, sh = _cache_strides(k_cache, v_cache)
        group = num_q_heads // num_kv_heads
        eff = min(max_seq_len, window) if window > 0 else max_seq_len
        splits = num_splits or self.pick_splits(num_seqs, num_kv_heads, group, eff)
        if not 1 <= splits <= MAX_SPLITS:
            raise BuildError(f"decode: {splits} context splits; the merge kernel takes 1..{MAX_SPLITS}")
        self.last_splits = splits  # what the last decode used (the route's marker line reports it)
        out = torch.empty_like(q) if out is None else out
        if splits > 1:
            part_o = torch.empty((splits, num_seqs, num_q_heads, HEAD_DIM), dtype=torch.float32, device=q.device)
            part_ml = torch.empty((splits, num_seqs, num_q_heads, 2), dtype=torch.float32, device=q.device)
        else:
            part_o = part_ml = None
        bt = block_tables.to(torch.int32).contiguous()
        sl = seq_lens.to(torch.int32).contiguous()
        grid = (num_kv_heads * math.ceil(group / 16), num_seqs, splits)
        self.k["paged_decode_d512"].launch(grid, [
            out, part_o, part_ml, q, k_cache, v_cache, bt, sl, num_seqs, num_q_heads, num_kv_heads,
            block_size, bt.shape[1], sb, st, sh, float(scale), int(window), splits, int(kv_shared)])
        if splits > 1:
            self.k["paged_decode_d512_reduce"].launch(
                (num_q_heads, num_seqs, HEAD_DIM // MERGE_COLS), [out, part_o, part_ml, num_seqs, num_q_heads, splits])
        return out

    def prefill(self, q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, max_query_len: int,
                scale: float, causal: bool = True, window: int = 0, kv_shared: bool = False, out=None):
        import torch

        total, num_q_heads, block_size, num_kv_heads = _check_shapes("prefill", q, k_cache)
        q = q.contiguous()
        sb, st, sh = _cache_strides(k_cache, v_cache)
        if block_size * st + num_kv_heads * sh >= 2**31:   # PREFILL_OFF32 in prefill_d512.cu
            raise BuildError(f"prefill: cache strides {k_cache.stride()}: the offset inside a block must stay below 2^31")
        out = torch.empty_like(q) if out is None else out
        num_seqs = seq_lens.shape[0]
        bt = block_tables.to(torch.int32).contiguous()
        grid = (math.ceil(max_query_len / self.prefill_rows), num_seqs, num_q_heads)
        self.k["prefill_d512"].launch(grid, [
            out, q, k_cache, v_cache, bt, cu_seqlens_q.to(torch.int32).contiguous(),
            seq_lens.to(torch.int32).contiguous(), num_q_heads, num_kv_heads, block_size, bt.shape[1],
            sb, st, sh, float(scale), int(causal), int(window), int(kv_shared)])
        return out


def load(cache: Path | None = None, prefer: str = "auto", overlay_dir: Path | None = None) -> D512Attention:
    """The kernels for torch's current device (loaded once per device, cache and preference)."""
    import torch

    dev = torch.cuda.current_device()
    key = (dev, str(cache), prefer, str(overlay_dir))
    with _lock:
        if key not in _loaded:
            torch.cuda.init()
            kernels = load_overlay_kernels(OVERLAY_ID, cache=cache, prefer=prefer, overlay_dir=overlay_dir)
            sms = torch.cuda.get_device_properties(dev).multi_processor_count
            _loaded[key] = D512Attention(kernels, sms, kernels["paged_decode_d512"].occupancy())
        return _loaded[key]
