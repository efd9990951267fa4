"""Float32 PyTorch reference for the SM70 attention kernel family (any head dim; fp16 or fp8 KV), and paged-cache test data.

Used by the GPU tests (tests/kernels/test_d512_on_gpu.py) and `benchmarks/kernels.py` (which puts the
repository root on sys.path); runs on CPU too (small shapes). Test and benchmark code: the library never imports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass
class PagedCase:
    """Random paged KV cache plus block tables for `seq_lens` (unit-scale fp16 data)."""

    k_cache: Any
    v_cache: Any
    block_tables: Any   # int32 [num_seqs, max_blocks]
    seq_lens: Any       # int32 [num_seqs]
    block_size: int
    fmt: str = "fp16"    # fp16 | e4m3 | e5m2 (fp8 storage: stored value = x / scale, vLLM's per-tensor convention)
    k_scale: Any = None  # fp32 one-element device tensors (fp8 only)
    v_scale: Any = None


FP8_SCALES = {"e4m3": (0.02, 0.03), "e5m2": (0.0011, 0.0007)}   # (K, V): unit-normal data stays in range


def make_paged(seq_lens: list[int], num_kv_heads: int, block_size: int, device: str = "cuda",
               kv_shared: bool = False, seed: int = 0, spare_blocks: int = 3, head_dim: int = 512,
               fmt: str = "fp16") -> PagedCase:
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    need = [math.ceil(n / block_size) for n in seq_lens]
    total = sum(need) + spare_blocks
    perm = torch.randperm(total, generator=g)  # scattered physical blocks
    max_blocks = max(need)
    bt = torch.zeros((len(seq_lens), max_blocks), dtype=torch.int32)
    pos = 0
    for i, n in enumerate(need):
        bt[i, :n] = perm[pos:pos + n].to(torch.int32)
        pos += n
    shape = (total, block_size, num_kv_heads, head_dim)
    gd = torch.Generator(device=device).manual_seed(seed)
    k = torch.randn(shape, generator=gd, dtype=torch.float16, device=device)
    v = k if kv_shared else torch.randn(shape, generator=gd, dtype=torch.float16, device=device)
    bt, sl = bt.to(device), torch.tensor(seq_lens, dtype=torch.int32, device=device)
    if fmt == "fp16":
        return PagedCase(k, v, bt, sl, block_size)
    dt = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fmt]
    ks, vs = FP8_SCALES[fmt]
    if kv_shared:
        vs = ks
    kq = (k.float() / ks).to(dt)
    vq = kq if kv_shared else (v.float() / vs).to(dt)
    scale = lambda x: torch.tensor([x], dtype=torch.float32, device=device)
    return PagedCase(kq, vq, bt, sl, block_size, fmt, scale(ks), scale(vs))


def gather(cache: Any, block_table_row: Any, n: int) -> Any:
    """The first n tokens of one sequence from a paged cache: [n, kv_heads, D]."""
    bs = cache.shape[1]
    blocks = block_table_row[: math.ceil(n / bs)].long()
    return cache[blocks].reshape(-1, cache.shape[2], cache.shape[3])[:n]


def _kv(case: PagedCase, b: int, n: int) -> tuple[Any, Any]:
    """Sequence b's first n keys and values as fp32, dequantized with the case's scales for fp8."""
    k = gather(case.k_cache, case.block_tables[b], n).float()
    v = gather(case.v_cache, case.block_tables[b], n).float()
    if case.fmt != "fp16":
        k, v = k * case.k_scale.float(), v * case.v_scale.float()
    return k, v


def ref_decode(q: Any, case: PagedCase, scale: float, window: int = 0) -> Any:
    """q [num_seqs, Hq, D] -> fp32 [num_seqs, Hq, D]."""
    import torch

    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    hq = q.shape[1]
    for b, L in enumerate(case.seq_lens.tolist()):
        k, v = _kv(case, b, L)
        if window > 0:
            k, v = k[max(0, L - window):], v[max(0, L - window):]
        hk = k.shape[1]
        qb = q[b].float().view(hk, hq // hk, -1)
        s = torch.einsum("hgd,thd->hgt", qb, k) * scale
        p = torch.softmax(s, dim=-1)
        out[b] = torch.einsum("hgt,thd->hgd", p, v).reshape(hq, -1)
    return out


def ref_prefill(q: Any, case: PagedCase, cu_seqlens: list[int], scale: float, causal: bool = True,
                window: int = 0, q_chunk: int = 2048) -> Any:
    """q [total_q, Hq, D] -> fp32 [total_q, Hq, D]; query i of a sequence sits at seq_len - q_len + i."""
    import torch

    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    hq = q.shape[1]
    for b, L in enumerate(case.seq_lens.tolist()):
        q0, q1 = cu_seqlens[b], cu_seqlens[b + 1]
        k, v = _kv(case, b, L)
        hk = k.shape[1]
        g = hq // hk
        keys = torch.arange(L, device=q.device)
        for c0 in range(q0, q1, q_chunk):
            c1 = min(q1, c0 + q_chunk)
            pos = torch.arange(c0 - q0, c1 - q0, device=q.device) + (L - (q1 - q0))
            mask = torch.ones((c1 - c0, L), dtype=torch.bool, device=q.device)
            if causal:
                mask &= keys[None, :] <= pos[:, None]
            if window > 0:
                mask &= (pos[:, None] - keys[None, :]) < window
            for h in range(hk):
                qh = q[c0:c1, h * g:(h + 1) * g].float().transpose(0, 1)        # [g, m, D]
                s = torch.einsum("gmd,td->gmt", qh, k[:, h]) * scale
                s = s.masked_fill(~mask[None], float("-inf"))
                p = torch.softmax(s, dim=-1)
                out[c0:c1, h * g:(h + 1) * g] = torch.einsum("gmt,td->gmd", p, v[:, h]).transpose(0, 1)
    return out
