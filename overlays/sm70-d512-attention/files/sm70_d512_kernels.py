"""Python entry points of the sm70-d512-attention kernel family (head dims 64/128/256/512, fp16
queries, fp16 or fp8 e4m3/e5m2 paged KV cache).

The overlay writes this file beside its routed module (vllm/v1/attention/backends/
sm70_d512_kernels.py); tests and benchmarks load it from the overlay's files/ by path. The
generic part (NVRTC build, driver-API loading and launching) is overlay-manager's
`manager.kernels.runtime`, which the serving process finds on sys.path or $OVERLAY_MANAGER_HOME.

    attn = load()                       # built images from the kernel cache, current device
    attn.decode(q, k_cache, v_cache, block_tables, seq_lens, max_seq_len, scale)
    attn.prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, max_query_len, scale)

Caches are vLLM's [num_blocks, block_size, num_kv_heads, D] tensors (any strides with a
contiguous last dimension), fp16, or fp8 storage: torch.float8_e4m3fn / float8_e5m2 (or uint8
with `kv_format="e4m3" | "e5m2"`) with per-tensor scales `k_scale` / `v_scale` (fp32 device
tensors of one element, vLLM's layer._k_scale / _v_scale: stored value = x / scale);
q/out are [tokens, num_q_heads, D] fp16, D one of HEAD_DIMS. torch is imported only when
these functions run.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

from manager.errors import BuildError
from manager.kernels.runtime import KernelSet, load_overlay_kernels

OVERLAY_ID = "sm70-d512-attention"
HEAD_DIMS = (64, 128, 256, 512)
HEAD_DIM = 512     # the first member of the family (kept for callers of the D=512-only launcher)
FORMATS = ("fp16", "e4m3", "e5m2")   # KV storage; entry suffix "", "_e4m3", "_e5m2"
MAX_SPLITS = 256   # MAX_SPLITS in paged_decode.cu (the merge kernel's weight table)
# keys per decode chunk (DecodeCfg<HD>::CHUNK in paged_decode.cu) and prefill query rows per block
# (PrefillCfg<HD>::BM in prefill.cu)
DECODE_CHUNK = {64: 128, 128: 128, 256: 64, 512: 32}
PREFILL_BM = {64: 64, 128: 64, 256: 64, 512: 32}
MIN_KEYS_PER_SPLIT = 64   # two 32-key chunks at D=512; two chunks of DECODE_CHUNK in general
MERGE_COLS = 128   # columns per block of the split merge (min(128, D): MC in paged_decode.cu)
PREFILL_ROWS = 32  # query rows per D=512 prefill block (BM in prefill.cu; -DPREFILL_BM builds set prefill_rows)
_lock = threading.Lock()
_loaded: dict[tuple, "D512Attention"] = {}


def cache_format(cache: Any, fmt: str | None = None) -> str:
    """'fp16' | 'e4m3' | 'e5m2' for a cache tensor (uint8 storage needs `fmt`), else BuildError."""
    import torch

    fp8 = {"e4m3": getattr(torch, "float8_e4m3fn", None), "e5m2": getattr(torch, "float8_e5m2", None)}
    if fmt is not None:
        if fmt not in FORMATS:
            raise BuildError(f"kv format {fmt!r}: expected one of {', '.join(FORMATS)}")
        ok = (torch.float16,) if fmt == "fp16" else (torch.uint8, fp8[fmt])
        if cache.dtype not in ok:
            raise BuildError(f"kv format {fmt}: cache dtype {cache.dtype} does not hold it")
        return fmt
    if cache.dtype == torch.float16:
        return "fp16"
    for name, dt in fp8.items():
        if dt is not None and cache.dtype == dt:
            return name
    raise BuildError(f"cache dtype {cache.dtype}: the kernels take fp16, float8_e4m3fn or float8_e5m2 (uint8 with kv_format)")


def _suffix(fmt: str) -> str:
    return "" if fmt == "fp16" else f"_{fmt}"


def _cache_strides(k_cache: Any, v_cache: Any) -> tuple[int, int, int]:
    if k_cache.dim() != 4 or k_cache.shape[-1] not in HEAD_DIMS:
        raise BuildError(f"k_cache shape {tuple(k_cache.shape)}: expected [blocks, block_size, kv_heads, D], "
                         f"D in {HEAD_DIMS}")
    if tuple(k_cache.stride()) != tuple(v_cache.stride()) or tuple(k_cache.shape) != tuple(v_cache.shape):
        raise BuildError("k_cache and v_cache must have the same shape and strides")
    if k_cache.dtype != v_cache.dtype:
        raise BuildError(f"k_cache {k_cache.dtype} and v_cache {v_cache.dtype} differ")
    sb, st, sh, sd = k_cache.stride()
    if sd != 1 or any(s % 8 for s in (sb, st, sh)):
        raise BuildError(f"cache strides {k_cache.stride()}: need a contiguous head dim and 8-element aligned rows")
    return sb, st, sh


def _check_shapes(kind: str, q, k_cache) -> tuple[int, int, int, int, int]:
    """(tokens or sequences, query heads, block size, KV heads, head dim), or BuildError naming the problem."""
    import torch

    n, num_q_heads, d = q.shape
    _, block_size, num_kv_heads, dk = k_cache.shape
    if d not in HEAD_DIMS or dk != d:
        raise BuildError(f"{kind}: head dim {d} (cache {dk}): the kernels cover {HEAD_DIMS}")
    if q.dtype != torch.float16:
        raise BuildError(f"{kind}: q must be fp16, not {q.dtype}")
    if num_q_heads % num_kv_heads:
        raise BuildError(f"{kind}: {num_q_heads} query heads do not group over {num_kv_heads} KV heads")
    return n, num_q_heads, block_size, num_kv_heads, d


class SM70Attention:
    """The loaded family: decode/prefill pick the entry for the head dim of q and the cache's format."""

    def __init__(self, kernels: KernelSet, num_sms: int, decode_blocks_per_sm: int | None = None):
        self.k = kernels
        self.num_sms = num_sms
        self._occ: dict[int, int] = {}
        if decode_blocks_per_sm is not None:
            self._occ[512] = max(1, decode_blocks_per_sm)
        self.last_splits = 1
        self.prefill_rows = PREFILL_ROWS   # D=512 (a -DPREFILL_BM variant build may change it)

    def blocks_per_sm(self, head_dim: int = HEAD_DIM) -> int:
        if head_dim not in self._occ:
            self._occ[head_dim] = max(1, self.k[f"paged_decode_d{head_dim}"].occupancy())
        return self._occ[head_dim]

    @property
    def slots(self) -> int:   # resident D=512 decode blocks on the device (one wave)
        return self.num_sms * self.blocks_per_sm(HEAD_DIM)

    def pick_splits(self, num_seqs: int, num_kv_heads: int, group: int, max_seq_len: int,
                    head_dim: int = HEAD_DIM) -> int:
        """Split the context so that the decode grid fills one wave of resident blocks.

        As many splits as one wave holds (slots // blocks without splitting), each split keeping
        >= two chunks (MIN_KEYS_PER_SPLIT = 64 keys at D=512, 2 x DECODE_CHUNK in general); a grid
        that fills the GPU already is not split. Measured on the H200 at D=512 (benchmarks/kernels.py
        --split-sweep, 2026-11-30): the fastest split count of every batch 1/4/8/32 x 4K/32K shape
        gives one wave of 128-132 blocks (64 splits at batch 1, 16 at batch 4), and 64-key splits
        beat 256-key ones at batch 1 x 4K (20.6 vs 30.2 us).
        """
        base = num_seqs * num_kv_heads * math.ceil(group / 16)
        min_keys = max(MIN_KEYS_PER_SPLIT, 2 * DECODE_CHUNK[head_dim])
        limit = max(1, min(MAX_SPLITS, math.ceil(max_seq_len / min_keys)))
        slots = self.num_sms * self.blocks_per_sm(head_dim)
        return max(1, min(limit, slots // base))

    def _scales(self, fmt: str, k_scale, v_scale, device):
        if fmt == "fp16":
            return None, None
        import torch

        def one(s):
            if s is None:
                s = torch.ones(1, dtype=torch.float32, device=device)
            if not hasattr(s, "data_ptr"):
                s = torch.tensor([float(s)], dtype=torch.float32, device=device)
            if s.dtype != torch.float32 or s.numel() != 1:
                raise BuildError(f"fp8 KV scale: expected one fp32 element (per-tensor), got {s.dtype} x {s.numel()}")
            return s

        return one(k_scale), one(v_scale)

    def decode(self, q, k_cache, v_cache, block_tables, seq_lens, max_seq_len: int, scale: float,
               window: int = 0, kv_shared: bool = False, num_splits: int | None = None, out=None,
               k_scale=None, v_scale=None, kv_format: str | None = None):
        import torch

        num_seqs, num_q_heads, block_size, num_kv_heads, hd = _check_shapes("decode", q, k_cache)
        fmt = cache_format(k_cache, kv_format)
        q = q.contiguous()
        sb, st, sh = _cache_strides(k_cache, v_cache)
        ks, vs = self._scales(fmt, k_scale, v_scale, q.device)
        group = num_q_heads // num_kv_heads
        eff = min(max_seq_len, window) if window > 0 else max_seq_len
        splits = num_splits or self.pick_splits(num_seqs, num_kv_heads, group, eff, hd)
        if not 1 <= splits <= MAX_SPLITS:
            raise BuildError(f"decode: {splits} context splits; the merge kernel takes 1..{MAX_SPLITS}")
        self.last_splits = splits  # what the last decode used (the route's marker line reports it)
        out = torch.empty_like(q) if out is None else out
        if splits > 1:
            part_o = torch.empty((splits, num_seqs, num_q_heads, hd), dtype=torch.float32, device=q.device)
            part_ml = torch.empty((splits, num_seqs, num_q_heads, 2), dtype=torch.float32, device=q.device)
        else:
            part_o = part_ml = None
        bt = block_tables.to(torch.int32).contiguous()
        sl = seq_lens.to(torch.int32).contiguous()
        grid = (num_kv_heads * math.ceil(group / 16), num_seqs, splits)
        self.k[f"paged_decode_d{hd}{_suffix(fmt)}"].launch(grid, [
            out, part_o, part_ml, q, k_cache, v_cache, bt, sl, num_seqs, num_q_heads, num_kv_heads,
            block_size, bt.shape[1], sb, st, sh, float(scale), int(window), splits, int(kv_shared), ks, vs])
        if splits > 1:
            self.k[f"paged_decode_d{hd}_reduce"].launch(
                (num_q_heads, num_seqs, hd // min(MERGE_COLS, hd)), [out, part_o, part_ml, num_seqs, num_q_heads, splits])
        return out

    def prefill(self, q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, max_query_len: int,
                scale: float, causal: bool = True, window: int = 0, kv_shared: bool = False, out=None,
                k_scale=None, v_scale=None, kv_format: str | None = None):
        import torch

        total, num_q_heads, block_size, num_kv_heads, hd = _check_shapes("prefill", q, k_cache)
        fmt = cache_format(k_cache, kv_format)
        q = q.contiguous()
        sb, st, sh = _cache_strides(k_cache, v_cache)
        ks, vs = self._scales(fmt, k_scale, v_scale, q.device)
        if block_size * st + num_kv_heads * sh >= 2**31:   # chunk_offsets32 in prefill.cu
            raise BuildError(f"prefill: cache strides {k_cache.stride()}: the offset inside a block must stay below 2^31")
        out = torch.empty_like(q) if out is None else out
        num_seqs = seq_lens.shape[0]
        bt = block_tables.to(torch.int32).contiguous()
        rows = self.prefill_rows if hd == HEAD_DIM else PREFILL_BM[hd]
        grid = (math.ceil(max_query_len / rows), num_seqs, num_q_heads)
        self.k[f"prefill_d{hd}{_suffix(fmt)}"].launch(grid, [
            out, q, k_cache, v_cache, bt, cu_seqlens_q.to(torch.int32).contiguous(),
            seq_lens.to(torch.int32).contiguous(), num_q_heads, num_kv_heads, block_size, bt.shape[1],
            sb, st, sh, float(scale), int(causal), int(window), int(kv_shared), ks, vs])
        return out


D512Attention = SM70Attention   # the name of the D=512-only launcher


def load(cache: Path | None = None, prefer: str = "auto", overlay_dir: Path | None = None) -> SM70Attention:
    """The kernels for torch's current device (loaded once per device, cache and preference)."""
    import torch

    dev = torch.cuda.current_device()
    key = (dev, str(cache), prefer, str(overlay_dir))
    with _lock:
        if key not in _loaded:
            torch.cuda.init()
            kernels = load_overlay_kernels(OVERLAY_ID, cache=cache, prefer=prefer, overlay_dir=overlay_dir)
            sms = torch.cuda.get_device_properties(dev).multi_processor_count
            _loaded[key] = SM70Attention(kernels, sms)
        return _loaded[key]
