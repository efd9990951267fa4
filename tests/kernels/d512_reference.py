"""Float32 PyTorch reference for the head_dim-512 kernels, and paged-cache test data.

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


def make_paged(seq_lens: list[int], num_kv_heads: int, block_size: int, device: str = "cuda",
               kv_shared: bool = False, seed: int = 0, spare_blocks: int = 3, head_dim: int = 512) -> PagedCase:
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
    return PagedCase(k, v, bt.to(device), torch.tensor(seq_lens, dtype=torch.int32, device=device), block_size)


def gather(cache: Any, block_table_row: Any, n: int) -> Any:
    """The first n tokens of one sequence from a paged cache: [n, kv_heads, D]."""
    bs = cache.shape[1]
    blocks = block_table_row[: math.ceil(n / bs)].long()
    return cache[blocks].reshape(-1, cache.shape[2], cache.shape[3])[:n]


def ref_decode(q: Any, case: PagedCase, scale: float, window: int = 0) -> Any:
    """q [num_seqs, Hq, D] -> fp32 [num_seqs, Hq, D]."""
    import torch

    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    hq = q.shape[1]
    for b, L in enumerate(case.seq_lens.tolist()):
        k = gather(case.k_cache, case.block_tables[b], L).float()
        v = gather(case.v_cache, case.block_tables[b], L).float()
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
        k = gather(case.k_cache, case.block_tables[b], L).float()
        v = gather(case.v_cache, case.block_tables[b], L).float()
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
