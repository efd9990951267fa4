"""Correctness grid and benchmarks for the sm70-d512-attention kernel family (head dims 64/128/256/512,
fp16 and fp8 KV; run on a GPU).

    python3 benchmarks/kernels.py --cache DIR [--prefer ptx] [--sm90-nvrtc auto] --out DIR
        [--bench-head-dims 512,256] [--old DIR] [--fp8-bench] [--sdpa EFFICIENT_ATTENTION] [--triton]

1. loads the built images from DIR (`overlay build` output; `--prefer ptx` loads the
   compute_70 PTX so the Volta code path runs, JIT-compiled by the driver);
2. compares decode and prefill against a float32 PyTorch reference over a shape grid
   (max abs error, limit 2e-3);
3. decode: achieved KV-read bandwidth vs the card's peak at batch 1/8/32 x context 4K/32K;
   prefill: TFLOPS against torch SDPA (fastest backend that accepts head_dim 512);
4. optionally builds the same sources natively (NVRTC 13, sm_90) and repeats 2-3.
5. the grid covers every head dim of the family, fp8 e4m3/e5m2 storage, K=V-shared caches and windows
   (FAMILY_DECODE_GRID, FAMILY_PREFILL_GRID); `--old DIR` (a build of the D=512-only kernels plus their
   launcher file, `sm70_d512_kernels.py`, in DIR) checks that the D=512 members give bit-identical
   outputs and times both in the same run; the card's device-to-device copy bandwidth is measured as
   the decode anchor (`copy_GBps`).
Writes results.json and results.md under --out. `--dry-run` checks the grid and the
reference on CPU with tiny shapes (no GPU needed).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # manager, and tests.kernels.d512_reference: the float32 torch oracle of the kernel tests

from tests.kernels.d512_reference import make_paged, ref_decode, ref_prefill  # noqa: E402

TOL = 2e-3
PEAK_BW = {"H200": 4.8e12, "H100": 3.35e12, "V100": 0.9e12}

# (batch, max ctx, q heads, kv heads, block size, window, kv_shared, forced splits)
DECODE_GRID = [
    (1, 1, 8, 8, 16, 0, False, None),
    (1, 17, 16, 2, 16, 0, False, None),
    (1, 1000, 16, 4, 32, 0, False, None),
    (1, 32768, 16, 2, 16, 0, False, None),
    (1, 32768, 16, 2, 32, 1024, False, None),
    (2, 32768, 32, 16, 16, 0, False, 7),
    (4, 4097, 16, 16, 32, 0, True, None),
    (8, 8000, 16, 2, 16, 0, False, 1),
    (8, 8000, 16, 4, 32, 512, True, None),
    (16, 2048, 32, 16, 16, 0, False, None),
    (32, 4096, 16, 2, 32, 0, False, None),
    (64, 512, 8, 8, 16, 0, False, None),
    (64, 1024, 16, 2, 16, 0, False, None),
    (3, 300, 32, 2, 16, 0, False, None),   # group of 16 (one full WMMA tile)
    (2, 700, 32, 1, 16, 100, False, None),  # group of 32 (two tiles per KV head)
    (1, 262144, 16, 2, 16, 0, False, None),  # Gemma-4's longest context
    (2, 262144, 16, 2, 32, 0, True, None),
]

# (query lens, context lens before the queries, q heads, kv heads, block size, causal, window, kv_shared)
PREFILL_GRID = [
    ([1], [0], 8, 8, 16, True, 0, False),
    ([37], [0], 16, 2, 16, True, 0, False),
    ([100, 1, 250, 64], [0, 5, 0, 31], 16, 4, 32, True, 0, False),
    ([2048], [0], 16, 2, 16, True, 0, False),
    ([1024, 333], [0, 0], 16, 2, 32, False, 0, False),
    ([3000], [0], 16, 16, 16, True, 1024, False),
    ([512, 700], [100, 0], 8, 2, 16, True, 0, True),
    ([64], [32704], 16, 2, 16, True, 0, False),       # chunked prefill at 32K context
    ([128], [32640], 16, 2, 32, True, 4096, False),
    ([8192], [0], 8, 1, 16, True, 0, False),
    ([33, 65, 97, 1, 2, 3, 4, 5] * 8, [0] * 64, 8, 2, 16, True, 0, False),  # batch 64
    ([48], [262096], 16, 2, 16, True, 0, False),      # chunked prefill at 256K context
    ([300, 77], [0, 40], 16, 2, 24, True, 0, False),   # block 24: not a power of two (division path)
]


# The other head dims, fp8 storage, K=V sharing and windows:
# (head dim, kv format, batch, max ctx, q heads, kv heads, block size, window, kv_shared, forced splits)
FAMILY_DECODE_GRID = [
    (hd, "fp16", *row) for hd in (64, 128, 256) for row in [
        (1, 1, 8, 8, 16, 0, False, None),
        (1, 1000, 16, 4, 32, 0, False, None),
        (1, 32768, 16, 2, 16, 1024, False, None),   # Gemma-4's sliding layers: window 1024
        (4, 4097, 16, 16, 32, 0, True, None),
        (8, 8000, 16, 2, 16, 0, False, 1),
        (3, 300, 32, 2, 16, 0, False, None),
        (2, 700, 32, 1, 16, 100, False, None),
        (64, 1024, 16, 2, 16, 0, False, None),
        (2, 32768, 32, 16, 16, 0, False, 7),
    ]
] + [(256, "fp16", 1, 262144, 16, 2, 16, 0, False, None)] + [
    (hd, fmt, *row) for hd in (256, 512) for fmt in ("e4m3", "e5m2") for row in [
        (4, 4097, 16, 2, 16, 0, False, None),
        (8, 8000, 16, 4, 32, 512, True, None),
        (1, 32768, 16, 2, 16, 0, False, None),
    ]
] + [(hd, "e4m3", 3, 300, 32, 2, 16, 0, False, None) for hd in (64, 128)]

# (head dim, kv format, query lens, context lens, q heads, kv heads, block size, causal, window, kv_shared)
FAMILY_PREFILL_GRID = [
    (hd, "fp16", *row) for hd in (64, 128, 256) for row in [
        ([1], [0], 8, 8, 16, True, 0, False),
        ([37], [0], 16, 2, 16, True, 0, False),
        ([100, 1, 250, 64], [0, 5, 0, 31], 16, 4, 32, True, 0, False),
        ([1024, 333], [0, 0], 16, 2, 32, False, 0, False),
        ([3000], [0], 16, 16, 16, True, 1024, False),
        ([512, 700], [100, 0], 8, 2, 16, True, 0, True),
        ([64], [32704], 16, 2, 16, True, 0, False),
        ([33, 65, 97, 1, 2, 3, 4, 5] * 8, [0] * 64, 8, 2, 16, True, 0, False),
        ([300, 77], [0, 40], 16, 2, 24, True, 0, False),
    ]
] + [
    (hd, fmt, *row) for hd in (256, 512) for fmt in ("e4m3", "e5m2") for row in [
        ([2048], [0], 16, 2, 16, True, 0, False),
        ([512, 700], [100, 0], 8, 2, 16, True, 1024, True),
    ]
] + [(hd, "e4m3", [300, 77], [0, 40], 16, 2, 24, True, 0, False) for hd in (64, 128)]


def _err(out, ref) -> float:
    return float((out.float() - ref).abs().max().item())


def _kw(case) -> dict:
    """The fp8 arguments of a case for the family's launcher (none for fp16)."""
    return {} if case.fmt == "fp16" else dict(k_scale=case.k_scale, v_scale=case.v_scale)


def correctness(attn, device: str, quick: bool = False, only: str | None = None, decode: bool = True,
                prefill: bool = True, family: bool = True, old=None) -> list[dict]:
    """Every grid row against the float32 reference; with `old` (the D=512-only launcher on its own
    build) the D=512 fp16 rows are also run there and compared bit for bit."""
    import torch

    rows = []
    dgrid = [(512, "fp16", *r) for r in DECODE_GRID] + (FAMILY_DECODE_GRID if family else [])
    pgrid = [(512, "fp16", *r) for r in PREFILL_GRID] + (FAMILY_PREFILL_GRID if family else [])
    if quick:
        dgrid = (dgrid[:4] + [r for r in FAMILY_DECODE_GRID if r[3] == 1000 or r[1] != "fp16"][:6] if family
                 else dgrid[:4])
        pgrid = (pgrid[:3] + [r for r in FAMILY_PREFILL_GRID if r[2] == [37] or r[1] != "fp16"][:6] if family
                 else pgrid[:3])
    for i, (hd, fmt, batch, ctx, hq, hk, bs, window, shared, splits) in enumerate(dgrid if decode else []):
        if only and only not in str(dgrid[i]):
            continue
        scale = 1.0 / math.sqrt(hd)
        g = torch.Generator().manual_seed(100 + i)
        lens = [ctx] + [int(x) for x in torch.randint(1, ctx + 1, (batch - 1,), generator=g)]
        case = make_paged(lens, hk, bs, device=device, kv_shared=shared, seed=i, head_dim=hd, fmt=fmt)
        q = torch.randn((batch, hq, hd), generator=g).to(torch.float16).to(device)
        out = attn.decode(q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, max(lens), scale,
                          window=window, kv_shared=shared, num_splits=splits, **_kw(case))
        torch.cuda.synchronize()
        ref = ref_decode(q, case, scale, window)
        e = _err(out, ref)
        eff = min(max(lens), window or 10**9)
        rows.append(dict(kind="decode", head_dim=hd, kv=fmt, batch=batch, ctx=ctx, q_heads=hq, kv_heads=hk, block=bs,
                         window=window, kv_shared=shared,
                         splits=splits or attn.pick_splits(batch, hk, hq // hk, eff, hd),
                         max_abs_err=e, ok=bool(e <= TOL and not math.isnan(e))))
        if old is not None and hd == 512 and fmt == "fp16":
            o2 = old.decode(q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, max(lens), scale,
                            window=window, kv_shared=shared, num_splits=splits)
            torch.cuda.synchronize()
            rows[-1]["identical_to_old"] = bool(torch.equal(o2, out))
        print(f"decode {rows[-1]}", flush=True)
        del case, q, out, ref
    for i, (hd, fmt, qlens, ctxs, hq, hk, bs, causal, window, shared) in enumerate(pgrid if prefill else []):
        if only and only not in str(pgrid[i]):
            continue
        scale = 1.0 / math.sqrt(hd)
        g = torch.Generator().manual_seed(200 + i)
        lens = [a + c for a, c in zip(qlens, ctxs, strict=False)]
        case = make_paged(lens, hk, bs, device=device, kv_shared=shared, seed=50 + i, head_dim=hd, fmt=fmt)
        cu = [0]
        for a in qlens:
            cu.append(cu[-1] + a)
        q = torch.randn((cu[-1], hq, hd), generator=g).to(torch.float16).to(device)
        cu_t = torch.tensor(cu, dtype=torch.int32, device=device)
        out = attn.prefill(q, case.k_cache, case.v_cache, case.block_tables, cu_t, case.seq_lens, max(qlens), scale,
                           causal=causal, window=window, kv_shared=shared, **_kw(case))
        torch.cuda.synchronize()
        ref = ref_prefill(q, case, cu, scale, causal, window)
        e = _err(out, ref)
        rows.append(dict(kind="prefill", head_dim=hd, kv=fmt, seqs=len(qlens), max_q=max(qlens), max_ctx=max(lens),
                         q_heads=hq, kv_heads=hk, block=bs, causal=causal, window=window, kv_shared=shared,
                         max_abs_err=e, ok=bool(e <= TOL and not math.isnan(e))))
        if old is not None and hd == 512 and fmt == "fp16":
            o2 = old.prefill(q, case.k_cache, case.v_cache, case.block_tables, cu_t, case.seq_lens, max(qlens), scale,
                             causal=causal, window=window, kv_shared=shared)
            torch.cuda.synchronize()
            rows[-1]["identical_to_old"] = bool(torch.equal(o2, out))
        print(f"prefill {rows[-1]}", flush=True)
        del case, q, out, ref
    return rows


def copy_bandwidth(device: str, nbytes: int = 4 << 30) -> dict:
    """Device-to-device copy (torch), bytes read + written per second: the decode anchor."""
    import torch

    src = torch.empty(nbytes // 2, dtype=torch.float16, device=device).normal_()
    dst = torch.empty_like(src)
    ts = [_time(lambda: dst.copy_(src), iters=10, warmup=2) for _ in range(5)]
    t = sorted(ts)[len(ts) // 2]
    del src, dst
    torch.cuda.empty_cache()
    return dict(bytes=nbytes, median_s=t, copy_GBps=2 * nbytes / t / 1e9, read_GBps_equiv=2 * nbytes / t / 1e9)


def _time(fn, iters: int = 20, warmup: int = 3) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters / 1e3


def _graph_time(run, copies: int) -> tuple[float, str]:
    """Seconds per call from one CUDA graph of `copies` calls (no Python launch cost), else eager."""
    import torch

    try:
        graph = torch.cuda.CUDAGraph()
        run()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            for _ in range(copies):
                run()
        return _time(graph.replay, iters=max(5, 80 // copies)) / copies, "graph"
    except Exception as exc:  # noqa: BLE001
        print(f"graph capture failed: {exc}", flush=True)
        return _time(run, iters=max(20, copies * 4)), "eager"


def split_candidates(ctx: int) -> list[int]:
    """Split counts worth timing for one context length (each split keeps >= one 32-key chunk)."""
    cands = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
    return [s for s in cands if s <= max(1, ctx // 32)]


class TritonAnchor:
    """vLLM's own Triton attention (`unified_attention`, the kernel the routed module replaces) on the
    same paged caches, set up the way vLLM 0.20.0's TritonAttentionMetadataBuilder does for decode
    (3-D kernel with 16 softmax segments below its sequence threshold) and prefill (2-D kernel)."""

    SEGMENTS = 16   # NUM_PAR_SOFTMAX_SEGMENTS in vllm/v1/attention/backends/triton_attn.py (0.20.0)

    def __init__(self):
        from vllm.v1.attention.ops.triton_unified_attention import unified_attention

        import vllm

        self.fn = unified_attention
        self.version = vllm.__version__

    def decode(self, q, case, bt, lens, max_len: int, scale: float, kv_shared: bool, work: dict):
        import torch

        batch, hq, d = q.shape
        hk = case.k_cache.shape[2]
        threshold = 128 // hk   # MIN_LAUNCH_GRID_SIZE_2D // num_kv_heads (then the nearest capture size)
        if "segm" not in work:
            dev = q.device
            work["segm"] = (torch.empty((threshold, hq, self.SEGMENTS, d), dtype=torch.float32, device=dev),
                            torch.empty((threshold, hq, self.SEGMENTS), dtype=torch.float32, device=dev),
                            torch.empty((threshold, hq, self.SEGMENTS), dtype=torch.float32, device=dev))
            work["cu"] = torch.arange(batch + 1, dtype=torch.int32, device=dev)
            work["descale"] = torch.ones((batch, hk), dtype=torch.float32, device=dev)
            work["out"] = torch.empty_like(q)
        so, sm, se = work["segm"]
        v = case.k_cache if kv_shared else case.v_cache
        self.fn(q=q, k=case.k_cache, v=v, out=work["out"], cu_seqlens_q=work["cu"], max_seqlen_q=1,
                seqused_k=lens, max_seqlen_k=max_len, softmax_scale=scale, causal=True, window_size=(-1, -1),
                block_table=bt, softcap=0, q_descale=None, k_descale=work["descale"], v_descale=work["descale"],
                seq_threshold_3D=threshold, num_par_softmax_segments=self.SEGMENTS, softmax_segm_output=so,
                softmax_segm_max=sm, softmax_segm_expsum=se)
        return work["out"]

    def prefill(self, q, case, cu, max_q: int, scale: float, work: dict):
        import torch

        batch = case.seq_lens.shape[0]
        hk = case.k_cache.shape[2]
        if "out" not in work:
            work["out"] = torch.empty_like(q)
            work["descale"] = torch.ones((batch, hk), dtype=torch.float32, device=q.device)
        self.fn(q=q, k=case.k_cache, v=case.v_cache, out=work["out"], cu_seqlens_q=cu, max_seqlen_q=max_q,
                seqused_k=case.seq_lens, max_seqlen_k=int(case.seq_lens.max()), softmax_scale=scale, causal=True,
                window_size=(-1, -1), block_table=case.block_tables, softcap=0, q_descale=None,
                k_descale=work["descale"], v_descale=work["descale"])
        return work["out"]


def bench_decode(attn, device: str, peak: float, hq: int = 16, hk: int = 2, bs: int = 16,
                 sweep: bool = False, triton: TritonAnchor | None = None, head_dim: int = 512, fmt: str = "fp16",
                 batches=(1, 4, 8, 32), ctxs=(4096, 32768), shareds=(False, True), old=None,
                 copy_GBps: float | None = None) -> list[dict]:
    """Per decode step, from CUDA graphs over rotating cache copies (working set >= 256 MB).

    sweep: also time every split count of `split_candidates` (and the split-reduce kernel alone);
    triton: also time vLLM's Triton attention on the same caches (and check it agrees with ours);
    old: also time the D=512-only kernels (head_dim 512, fp16); copy_GBps: the measured copy bandwidth,
    for `over_copy` = kernel time / (bytes read at that bandwidth).
    """
    import torch

    rows = []
    hd = head_dim
    scale = 1.0 / math.sqrt(hd)
    esize = 2 if fmt == "fp16" else 1
    for batch in batches:
        for ctx in ctxs:
            for shared in shareds:
                kv_bytes = batch * ctx * hk * hd * esize * (1 if shared else 2)
                # rotate over enough disjoint copies that the working set is >= 4x the 60 MB L2
                copies = max(1, math.ceil(256e6 / kv_bytes))
                case = make_paged([ctx] * (batch * copies), hk, bs, device=device, kv_shared=shared, seed=7,
                                  head_dim=hd, fmt=fmt)
                tables = [case.block_tables[c * batch:(c + 1) * batch] for c in range(copies)]
                lens = case.seq_lens[:batch]
                q = torch.randn((batch, hq, hd), device=device).to(torch.float16)
                it = [0]
                kw = _kw(case)

                def run(splits=None, impl=attn, kw=kw):
                    bt = tables[it[0] % copies]
                    it[0] += 1
                    return impl.decode(q, case.k_cache, case.v_cache, bt, lens, ctx, scale, kv_shared=shared,
                                       num_splits=splits, **kw)

                t_eager = _time(run, iters=max(20, copies * 4))
                t, how = _graph_time(run, copies)
                auto = attn.pick_splits(batch, hk, hq // hk, ctx, hd)
                row = dict(head_dim=hd, kv=fmt, batch=batch, ctx=ctx, q_heads=hq, kv_heads=hk, kv_shared=shared,
                           splits=auto, us=t * 1e6, timing=how, eager_us=t_eager * 1e6, kv_read_GBps=kv_bytes / t / 1e9,
                           frac_peak=kv_bytes / t / peak)
                if copy_GBps:
                    row["over_copy"] = t / (kv_bytes / (copy_GBps * 1e9))
                    row["frac_copy"] = kv_bytes / t / (copy_GBps * 1e9)
                if old is not None and hd == 512 and fmt == "fp16":
                    to, _ = _graph_time(lambda: run(impl=old, kw={}), copies)
                    row.update(old_us=to * 1e6, old_over_new=to / t)
                if sweep:
                    per = {}
                    for sp in split_candidates(ctx):
                        ts, _ = _graph_time(lambda sp=sp: run(sp), copies)
                        per[sp] = ts * 1e6
                    best = min(per, key=per.get)
                    row.update(sweep_us=per, best_splits=best, best_us=per[best],
                               best_frac_peak=kv_bytes / (per[best] / 1e6) / peak)
                if triton is not None and fmt == "fp16":
                    work: dict = {}
                    try:
                        bt0 = tables[0]
                        ref = attn.decode(q, case.k_cache, case.v_cache, bt0, lens, ctx, scale,
                                          kv_shared=shared).float()
                        tri = triton.decode(q, case, bt0, lens, ctx, scale, shared, work).float()
                        row["triton_vs_ours_max_abs"] = float((tri - ref).abs().max())

                        def run_t():
                            bt = tables[it[0] % copies]
                            it[0] += 1
                            triton.decode(q, case, bt, lens, ctx, scale, shared, work)

                        tt, _ = _graph_time(run_t, copies)
                        row.update(triton_us=tt * 1e6, triton_frac_peak=kv_bytes / tt / peak, ours_over_triton=tt / t)
                    except Exception as exc:  # noqa: BLE001 - the anchor failing is data
                        row["triton_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                rows.append(row)
                print(f"bench decode {row}", flush=True)
                del case, tables, q
                torch.cuda.empty_cache()
    return rows


def _sdpa_best(q, k, v, backends=("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    results = {}
    rep = q.shape[1] // k.shape[1]
    kr, vr = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    for name in backends:
        be = getattr(SDPBackend, name, None)
        if be is None:
            continue
        for tag, fn in (
            ("gqa", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)),
            ("repeat_kv", lambda: F.scaled_dot_product_attention(q, kr, vr, is_causal=True)),
        ):
            try:
                with sdpa_kernel([be]):
                    fn()
                    torch.cuda.synchronize()
                    results[f"{name}/{tag}"] = _time(fn, iters=5, warmup=1)
            except Exception as exc:  # noqa: BLE001 - a backend refusing D=512 is data
                results[f"{name}/{tag}"] = f"refused: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    timed = {k: v for k, v in results.items() if isinstance(v, float)}
    best = min(timed, key=timed.get) if timed else None
    return best, results


def bench_prefill(attn, device: str, hq: int = 16, hk: int = 2, bs: int = 16, sdpa: bool = True,
                  repeats: int = 1, triton: TritonAnchor | None = None, head_dim: int = 512, old=None,
                  sdpa_backends=("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"),
                  shapes=((1, 2048), (1, 8192), (4, 4096), (1, 16384))) -> list[dict]:
    """Times are the median over `repeats` measurements, each the mean of 5 launches after 2 warm-ups."""
    import statistics

    import torch

    rows = []
    hd = head_dim
    scale = 1.0 / math.sqrt(hd)
    for batch, L in shapes:
        case = make_paged([L] * batch, hk, bs, device=device, seed=9, head_dim=hd)
        q = torch.randn((batch * L, hq, hd), device=device).to(torch.float16)
        cu = torch.arange(0, batch * L + 1, L, dtype=torch.int32, device=device)
        fn = lambda: attn.prefill(q, case.k_cache, case.v_cache, case.block_tables, cu, case.seq_lens, L, scale)  # noqa: E731
        t = statistics.median(_time(fn, iters=5, warmup=2) for _ in range(max(1, repeats)))
        flops = 4 * hd * hq * batch * L * (L + 1) / 2
        row = dict(head_dim=hd, batch=batch, seq=L, q_heads=hq, kv_heads=hk, repeats=repeats, ours_ms=t * 1e3,
                   ours_tflops=flops / t / 1e12)
        if old is not None and hd == 512:
            fo = lambda: old.prefill(q, case.k_cache, case.v_cache, case.block_tables, cu, case.seq_lens, L, scale)  # noqa: E731
            to = statistics.median(_time(fo, iters=5, warmup=2) for _ in range(max(1, repeats)))
            row.update(old_ms=to * 1e3, old_over_new=to / t)
        if sdpa:
            from tests.kernels.d512_reference import gather

            k = torch.stack([gather(case.k_cache, case.block_tables[b], L)
                             for b in range(batch)]).transpose(1, 2).contiguous()
            v = torch.stack([gather(case.v_cache, case.block_tables[b], L)
                             for b in range(batch)]).transpose(1, 2).contiguous()
            qs = q.view(batch, L, hq, hd).transpose(1, 2).contiguous()
            best, res = _sdpa_best(qs, k, v, sdpa_backends)
            if best and repeats > 1:  # the chosen backend again, median like ours
                import torch.nn.functional as F
                from torch.nn.attention import SDPBackend, sdpa_kernel

                be, tag = best.split("/")
                kk, vv = (k, v) if tag == "gqa" else (k.repeat_interleave(hq // hk, dim=1),
                                                      v.repeat_interleave(hq // hk, dim=1))
                with sdpa_kernel([getattr(SDPBackend, be)]):
                    f2 = lambda: F.scaled_dot_product_attention(qs, kk, vv, is_causal=True, enable_gqa=(tag == "gqa"))  # noqa: E731
                    res[best] = statistics.median(_time(f2, iters=5, warmup=1) for _ in range(repeats))
                del kk, vv
            row["sdpa_backends"] = {n: (r * 1e3 if isinstance(r, float) else r) for n, r in res.items()}
            if best:
                row["sdpa_best"] = best
                row["sdpa_ms"] = res[best] * 1e3
                row["sdpa_tflops"] = flops / res[best] / 1e12
                row["speedup_vs_sdpa"] = res[best] / t
            del k, v, qs
        if triton is not None:
            work: dict = {}
            try:
                ours = fn().float()
                tri = triton.prefill(q, case, cu, L, scale, work).float()
                row["triton_vs_ours_max_abs"] = float((tri - ours).abs().max())
                tt = statistics.median(_time(lambda: triton.prefill(q, case, cu, L, scale, work), iters=5, warmup=2)
                                       for _ in range(max(1, repeats)))
                row.update(triton_ms=tt * 1e3, triton_tflops=flops / tt / 1e12, ours_over_triton=tt / t)
            except Exception as exc:  # noqa: BLE001 - the anchor failing is data
                row["triton_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        rows.append(row)
        print(f"bench prefill {row}", flush=True)
        del case, q
        torch.cuda.empty_cache()
    return rows


def md_tables(res: dict) -> str:
    lines = []
    for variant, v in res.get("variants", {}).items():
        lines.append(f"### {variant}\n")
        if "error" in v:
            lines.append(f"error: {v['error']}\n")
            continue
        corr = v.get("correctness", [])
        if corr:
            worst = max(r["max_abs_err"] for r in corr)
            lines.append(f"Correctness: {sum(r['ok'] for r in corr)}/{len(corr)} cases within {TOL}; "
                         f"worst max abs error {worst:.2e}\n")
            lines.append("| kind | shape | max abs err | ok |\n|---|---|---|---|")
            for r in corr:
                shape = ", ".join(f"{k}={r[k]}" for k in r if k not in ("kind", "max_abs_err", "ok"))
                lines.append(f"| {r['kind']} | {shape} | {r['max_abs_err']:.2e} | {'yes' if r['ok'] else 'NO'} |")
            lines.append("")
        nan = float("nan")
        dec = v.get("decode", [])
        if dec:
            lines.append("Decode (16 query heads over 2 KV heads, block 16; "
                         f"copy anchor {res.get('copy', {}).get('copy_GBps', nan):.0f} GB/s):\n")
            lines.append("| D | kv | batch | context | K=V shared | splits | time (us) | KV read (GB/s) | of peak | "
                         "time / read at copy bw | "
                         "old D=512 (us) | Triton (us) | Triton / ours |\n"
                         "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
            for r in dec:
                lines.append(f"| {r.get('head_dim', 512)} | {r.get('kv', 'fp16')} | {r['batch']} | {r['ctx']} | "
                             f"{r['kv_shared']} | {r['splits']} | "
                             f"{r['us']:.1f} | {r['kv_read_GBps']:.0f} | {100 * r['frac_peak']:.1f} % | "
                             f"{r.get('over_copy', nan):.2f} | "
                             f"{r.get('old_us', nan):.1f} | {r.get('triton_us', nan):.1f} | "
                             f"{r.get('ours_over_triton', nan):.2f} |")
            lines.append("")
        pre = v.get("prefill", [])
        if pre:
            lines.append("| D | batch x seq | ours (ms) | ours TFLOPS | old D=512 (ms) | SDPA best | SDPA (ms) | "
                         "SDPA TFLOPS | ours / SDPA | "
                         "Triton (ms) | Triton / ours |\n|---|---|---|---|---|---|---|---|---|---|---|")
            for r in pre:
                lines.append(f"| {r.get('head_dim', 512)} | {r['batch']} x {r['seq']} | {r['ours_ms']:.2f} | "
                             f"{r['ours_tflops']:.1f} | "
                             f"{r.get('old_ms', nan):.2f} | {r.get('sdpa_best', '-')} | "
                             f"{r.get('sdpa_ms', nan):.2f} | {r.get('sdpa_tflops', nan):.1f} | "
                             f"{r.get('speedup_vs_sdpa', nan):.2f}x | {r.get('triton_ms', nan):.2f} | "
                             f"{r.get('ours_over_triton', nan):.2f} |")
            lines.append("")
    return "\n".join(lines) + "\n"


def dry_run() -> None:
    """CPU: the reference agrees with itself (decode == one-token causal prefill) on tiny shapes."""
    import torch

    case = make_paged([5, 40], 2, 16, device="cpu", head_dim=64)
    q = torch.randn((2, 8, 64)).to(torch.float16)
    dec = ref_decode(q, case, 0.125)
    cu = [0, 1, 2]
    pre = ref_prefill(q, case, cu, 0.125, causal=True)
    assert torch.allclose(dec, pre, atol=1e-5), (dec - pre).abs().max()
    for fmt in ("e4m3", "e5m2"):   # fp8 cases: the reference dequantizes (stored x / scale, times scale)
        c8 = make_paged([5, 40], 2, 16, device="cpu", head_dim=64, fmt=fmt)
        d8 = ref_decode(q, c8, 0.125)
        assert torch.isfinite(d8).all() and c8.k_cache.element_size() == 1
    nd = len(DECODE_GRID) + len(FAMILY_DECODE_GRID)
    npf = len(PREFILL_GRID) + len(FAMILY_PREFILL_GRID)
    print(f"dry run ok: {nd} decode and {npf} prefill grid cases")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", required=False)
    ap.add_argument("--prefer", default="ptx")
    ap.add_argument("--variant", action="append", default=[], metavar="LABEL@DIR",
                    help="another PTX build to measure (correctness quick grid + decode bench)")
    ap.add_argument("--sm90-nvrtc", default=None, help="'auto' or a libnvrtc path: also build and test sm_90 natively")
    ap.add_argument("--out", default=".")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--bench", default="all", choices=("all", "decode", "prefill"),
                    help="which benchmarks to run (default all)")
    ap.add_argument("--repeats", type=int, default=1, help="prefill timings: median over this many measurements")
    ap.add_argument("--variant-full", action="store_true",
                    help="--variant builds get the full prefill correctness grid and the prefill benchmark (no SDPA)")
    ap.add_argument("--only", default=None, help="substring of a grid row's shape to run (e.g. 262144)")
    ap.add_argument("--full-grid", action="store_true", help="every variant runs the whole correctness grid")
    ap.add_argument("--variant-grid", default="quick", choices=("quick", "decode"),
                    help="--variant builds: the quick grid, or the whole decode grid (no prefill cases)")
    ap.add_argument("--split-sweep", action="store_true",
                    help="decode: time every split count per shape, and the split-reduce kernel alone")
    ap.add_argument("--triton", action="store_true",
                    help="second anchor: vLLM's Triton unified_attention on the same paged caches (needs vllm)")
    ap.add_argument("--bench-head-dims", default="512", help="comma list: head dims to benchmark (e.g. 512,256,128,64)")
    ap.add_argument("--small-dims-short", action="store_true",
                    help="head dims below 256: decode only at batch 8/32 x 32K, prefill at 1 x 8192")
    ap.add_argument("--fp8-bench", action="store_true", help="decode: also fp8 e4m3 caches at batch 8/32 x 32K")
    ap.add_argument("--decode-batches", default="1,4,8,32", help="decode benchmark batches (comma list)")
    ap.add_argument("--decode-ctxs", default="4096,32768", help="decode benchmark contexts (comma list)")
    ap.add_argument("--old", default=None, metavar="DIR",
                    help="a build of the D=512-only kernels (DIR/cache) and their launcher (DIR/sm70_d512_kernels.py)")
    ap.add_argument("--sdpa", default="FLASH_ATTENTION,EFFICIENT_ATTENTION,CUDNN_ATTENTION,MATH",
                    help="comma list of SDPA backends to try as the prefill anchor")
    ap.add_argument("--no-family-grid", action="store_true", help="only the D=512 fp16 grid")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    if a.dry_run:
        dry_run()
        return 0
    import torch

    from manager.kernels import builder
    from tests.kernels.launcher import d512_launcher

    d512 = d512_launcher()

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_BW.items() if k in name), 4.8e12)
    res: dict = {"device": name, "torch": torch.__version__, "peak_bw": peak, "variants": {}}
    try:
        import subprocess

        res["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                       capture_output=True, text=True).stdout.strip()
    except Exception:  # noqa: BLE001
        pass
    res["copy"] = copy_bandwidth("cuda")
    print(f"copy {res['copy']}", flush=True)
    old = None
    if a.old:
        import importlib.util

        spec = importlib.util.spec_from_file_location("sm70_d512_kernels_old", Path(a.old) / "sm70_d512_kernels.py")
        old_mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old_mod)
        old = old_mod.load(cache=Path(a.old) / "cache", prefer="ptx")
        res["old"] = {"objects": [o.__dict__ for o in old.k.objects]}
    bench_dims = [int(x) for x in a.bench_head_dims.split(",") if x]
    sdpa_backends = tuple(x for x in a.sdpa.split(",") if x)
    variants = [("compute_70 PTX (NVRTC 12, driver JIT)", Path(a.cache), a.prefer, False)]
    for spec in a.variant:
        label, d = spec.rsplit("@", 1)
        variants.append((label, Path(d), "ptx", True))
    if a.sm90_nvrtc:
        try:
            c90 = Path("/tmp/kc90")
            r = builder.build(ROOT / "overlays", ["sm70-d512-attention"], archs=["sm_90"], cache=c90,
                              nvrtc_path=None if a.sm90_nvrtc == "auto" else a.sm90_nvrtc)
            res["sm90_build"] = {"compiler": r.compiler, "compiled": r.compiled}
            variants.append((f"sm_90 cubin ({r.compiler.split(' (')[0]})", c90, "cubin", False))
        except Exception as exc:  # noqa: BLE001
            res["sm90_build"] = {"error": f"{type(exc).__name__}: {exc}"}
            print(traceback.format_exc(), flush=True)
    triton = None
    if a.triton:
        try:
            triton = TritonAnchor()
            res["triton_anchor"] = {"vllm": triton.version, "kernel": "vllm.v1.attention.ops.triton_unified_attention"}
        except Exception as exc:  # noqa: BLE001
            res["triton_anchor"] = {"error": f"{type(exc).__name__}: {exc}"}
            print(traceback.format_exc(), flush=True)
    def save() -> None:   # after every stage: a run stopped by its time limit keeps what it measured
        (out / "results.json").write_text(json.dumps(res, indent=2, default=str))

    for label, cache, prefer, extra in variants:
        v: dict = {}
        res["variants"][label] = v
        try:
            d512._loaded.clear()
            # --variant builds use the entry specs recorded in their own index (their shared_bytes may differ)
            attn = d512.load(cache=cache, prefer=prefer,
                             overlay_dir=None if extra else ROOT / "overlays" / "sm70-d512-attention")
            launch = cache / "launch.json"   # kernel_variants.py rows= (a -DPREFILL_BM build)
            if extra and launch.is_file():
                attn.prefill_rows = int(json.loads(launch.read_text())["prefill_rows"])
            v["prefill_rows"] = attn.prefill_rows
            v["objects"] = [o.__dict__ for o in attn.k.objects]
            v["decode_blocks_per_sm"] = attn.slots // attn.num_sms
            full = extra and a.variant_full
            fam = not a.no_family_grid
            try:
                if a.full_grid:
                    v["correctness"] = correctness(attn, "cuda", only=a.only, family=fam,
                                                   old=old if not extra else None)
                elif extra and a.variant_grid == "decode":
                    v["correctness"] = correctness(attn, "cuda", only=a.only, prefill=False)
                else:
                    v["correctness"] = correctness(attn, "cuda", quick=(a.quick or extra) and not full, only=a.only,
                                                   decode=not full, family=fam, old=old if not extra else None)
            except Exception as exc:  # noqa: BLE001 - the benchmarks still run (unless the context is lost)
                v["correctness_error"] = f"{type(exc).__name__}: {exc}"
                print(traceback.format_exc(), flush=True)
            save()
            anchor = triton if not extra else None
            if not a.no_bench:
                cbw = res["copy"]["copy_GBps"]
                if a.bench in ("all", "decode"):
                    v["decode"] = []
                    for hd in bench_dims:
                        short = a.small_dims_short and hd < 256
                        v["decode"] += bench_decode(attn, "cuda", peak, sweep=a.split_sweep, triton=anchor, head_dim=hd,
                                                    batches=(8, 32) if short
                                                    else tuple(int(x) for x in a.decode_batches.split(",")),
                                                    ctxs=(32768,) if short
                                                    else tuple(int(x) for x in a.decode_ctxs.split(",")),
                                                    shareds=(False,) if short else (False, True),
                                                    old=old if not extra else None, copy_GBps=cbw)
                        if a.fp8_bench and hd >= 256:
                            v["decode"] += bench_decode(attn, "cuda", peak, head_dim=hd, fmt="e4m3", batches=(8, 32),
                                                        ctxs=(32768,), shareds=(False, True), copy_GBps=cbw)
                        save()
                if a.bench in ("all", "prefill") and (not extra or a.variant_full):
                    v["prefill"] = []
                    for hd in bench_dims:
                        short = a.small_dims_short and hd < 256
                        v["prefill"] += bench_prefill(attn, "cuda", sdpa=(prefer != "cubin" and not extra),
                                                      repeats=a.repeats,
                                                      triton=anchor, head_dim=hd, old=old if not extra else None,
                                                      sdpa_backends=sdpa_backends,
                                                      shapes=((1, 8192),) if short
                                                      else ((1, 2048), (1, 8192), (4, 4096), (1, 16384)))
                        save()
        except Exception as exc:  # noqa: BLE001
            v["error"] = f"{type(exc).__name__}: {exc}"
            print(traceback.format_exc(), flush=True)
        (out / "results.json").write_text(json.dumps(res, indent=2, default=str))
    (out / "results.md").write_text(md_tables(res))
    print(md_tables(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
