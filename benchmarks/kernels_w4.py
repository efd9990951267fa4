"""Correctness grid and benchmarks for the sm70-w4-gemm kernels (run on a GPU).

    python3 benchmarks/kernels_w4.py --cache DIR [--prefer ptx] --out DIR [--quick]

1. loads the built images from DIR (`overlay build sm70-w4-gemm` output; `--prefer ptx` runs the compute_70 PTX
   through the driver JIT, the Volta code path);
2. correctness: linear and MoE against float32 over the dequantized weights (tests/kernels/w4_reference.py) for every
   format x group, K = 704, top-8 of 128, empty experts (max |err| / max |ref|);
3. device copy bandwidth (the same run's achievable HBM figure);
4. MoE decode (1/4/8 tokens, Gemma-4 26B-A4B: hidden 2816, 128 experts, top-8, intermediate 704): kernel time of
   gate_up + down (CUDA-graph replay; `us_eager` = launched from Python), bytes of the activated experts' packed
   weights + scales, % of HBM peak and of the copy;
5. MoE prefill (2048 and 8192 tokens) TFLOPS against one torch fp16 GEMM of the same FLOPs on dequantized weights (the
   cuBLAS ceiling a grouped GEMM can reach);
6. linear decode / prefill (12B-like 3840 -> 15360) against torch fp16 GEMM on dequantized weights;
7. with `--vllm-anchors` (vLLM importable): the whole MoE layer (alignment, gate_up, SiLU-and-mul, down, top-k
   sum) of vLLM's `fused_experts` W4A16 through its Triton kernel (`fused_moe_kernel_gptq_awq`) and through its
   `moe_wna16` CUDA kernel (the dispatcher's `should_moe_wna16_use_cuda` pinned to False / True), against this
   overlay's `fused_moe` on the same packed weights and vLLM's own `moe_align_block_size` (int4 symmetric, groups 32
   and 128; 1/4/8/2048/8192 tokens).
   `--only-anchors` runs the copy bandwidth and step 7 alone.
8. decode kernels side by side (`decode`): the WMMA decode against the GEMV decode (`decode="gemv"`) on the same
   weights and alignment rules (each path's own block size) — MoE 1/4/8 tokens (int4 g32, int4 g128, fp4 g16;
   gate_up + down kernels, and the whole fused_moe layer) and the 3840 -> 15360 linear at M = 1/4/8 (int4 g128,
   fp4 g16): µs, % of HBM peak and of the copy bandwidth (packed weights + scales of the activated experts), the ratio
   wmma / gemv, the GEMV result's error against the WMMA one, and a streaming-read anchor of the same byte count (a
   torch sum over a buffer of that size: what a pure read of those bytes takes in this run). The MoE rows also time
   each arm's whole fused_moe layer as SEQ_LAYERS layers in one CUDA graph (`<arm>_seq_us`, per layer; own routing
   per layer, weights cycling over SEQ_SETS full sets) beside the read timed the same way (`stream_seq_us`): a decode
   step's view, without the graph launch that a single-layer replay pays and without L2 reuse between layers.
   Each GEMV's gate_up and down are also timed apart (`<arm>_seq_up_us` / `_seq_down_us`) beside reads of each
   projection's bytes and of both one after the other (`stream_seq_two_us`).
   The router-direct arms (`gemv_<variant>+<tile>`, the launcher's DIRECT_VARIANTS) take no alignment: gate_up one
   routed row per block straight from topk_ids, down `w4_moe_down` with the top-k sum inside the block (their seq
   down figure is that one launch; the aligned GEMVs' carries the zeroing and the fp16 conversion).
   `--decode-arms` keeps a subset of the arms.
   `--only-decode` runs the copy bandwidth and step 8 alone (well under a minute of GPU time).
9. linear prefill kernels side by side (`prefill`): the WMMA prefill tile against "dequant" (w4_dequant_<fmt> to an
   fp16 weight, then torch's fp16 GEMM; the launcher's default from DEQUANT_MIN_ROWS rows) at M = 64 ... 8192 on
   three layer shapes (3840 -> 15360, 15360 -> 3840, 2816 -> 4096; int4 g128, fp4 g16), with the anchor the issue
   names: torch's fp16 GEMM on a dense fp16 weight of the same shape (cuBLAS), its TFLOPS beside the card's dense
   fp16 tensor peak, and the dequantization alone (µs, and % of HBM peak for its bytes: packed weights + scales read,
   N x K x 2 written). `--only-prefill` runs the copy bandwidth and step 9 alone.
10. MoE prefill kernels side by side (`moe_prefill`, 26B-A4B shapes, 256 ... 8192 tokens; int4 g32 / g128, fp4 g16):
   the WMMA tile after the alignment (CUDA-graph and eager) against moe_dequant (eager: it reads the routing's
   counts on the host), beside one torch fp16 GEMM pair of the same FLOPs, and moe_dequant's two parts timed apart
   (every expert dequantized; the two batched GEMMs at the routing's padded count). `--only-moe-prefill` runs the copy
   bandwidth and step 10 alone. With step 7 the prefill rows also time moe_dequant and vLLM's Triton kernel eager.
Writes results.json and results.md under --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from tests.kernels.w4_launcher import W4_DIR, w4_launcher  # noqa: E402
from tests.kernels.w4_reference import FORMAT_GROUPS, make_weights, ref_linear, ref_moe, rel_err, route  # noqa: E402

PEAK_BW = {"H200": 4.8e12, "H100": 3.35e12, "V100": 0.9e12}
H, E, TOPK, INTER = 2816, 128, 8, 704


def timed_eager(fn, iters=20, warm=3):
    """Median of per-call CUDA-event times, launched from Python each time (includes host launch gaps)."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(ts)


def timed(fn, iters=20, warm=3):
    """Median GPU time of `fn` captured once into a CUDA graph and replayed (the kernels' own time, as vLLM's
    CUDA-graph decode sees it); falls back to timed_eager when capture fails."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warm):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
    except Exception as exc:  # noqa: BLE001
        print(f"graph capture failed ({exc}); eager timing", file=sys.stderr)
        return timed_eager(fn, iters, warm)
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(ts)


def grid(k, quick):
    rows = []
    lin = [(1, 1408, 704, "decode"), (7, 2816, 704, "decode"), (16, 100, 2816, "decode"),
           (100, 1408, 2816, "prefill"), (2048, 2816, 704, "prefill"), (33, 96, 96, "prefill")]
    for fmt, group in FORMAT_GROUPS:
        for m, n, kk, path in (lin[:3] + lin[3:5] if quick else lin):
            wt = make_weights(fmt, 1, n, kk, group, seed=m + n)
            x = torch.randn((m, kk), device="cuda").half()
            out = k.linear(x, wt.w[0], wt.scales[0], fmt, group=group,
                           zeros=None if wt.zeros is None else wt.zeros[0], gscale=wt.gscale, path=path)
            rows.append(dict(kind="linear", fmt=fmt, group=group, m=m, n=n, k=kk, path=path,
                             err=rel_err(out, ref_linear(x, wt))))
    for fmt, group in FORMAT_GROUPS:
        w13 = make_weights(fmt, E, 2 * INTER, H, group, seed=11)
        w2 = make_weights(fmt, E, H, INTER, group, seed=12)
        for tokens, only, path in [(1, None, "decode"), (4, None, "decode"), (8, None, "decode"),
                                   (5, 3, "decode"), (256, None, "prefill"), (100, 8, "prefill")]:
            tw, ti = route(tokens, E, TOPK if only is None else min(TOPK, only), seed=tokens)
            x = torch.randn((tokens, H), device="cuda").half()
            out = k.fused_moe(x, w13.w, w13.scales, w2.w, w2.scales, tw, ti, fmt, group=group, z13=w13.zeros,
                              z2=w2.zeros, gscale13=w13.gscale, gscale2=w2.gscale, path=path)
            rows.append(dict(kind="moe", fmt=fmt, group=group, tokens=tokens, experts_used=int(ti.unique().numel()),
                             path=path, err=rel_err(out, ref_moe(x, w13, w2, tw, ti))))
        del w13, w2
        torch.cuda.empty_cache()
    return rows


def copy_bw():
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    t = timed_eager(lambda: b.copy_(a), iters=10)   # one 1 GiB copy: host gaps are negligible
    return 2 * a.numel() / t


def bench_moe(k, mod, peak, copy):
    rows = []
    for fmt, group in (("int4", 32), ("int4", 128), ("fp4", 16)):
        w13 = make_weights(fmt, E, 2 * INTER, H, group, seed=21, with_deq=False)
        w2 = make_weights(fmt, E, H, INTER, group, seed=22, with_deq=False)
        per_expert = w13.bytes_per_expert() + w2.bytes_per_expert()
        for tokens in (1, 4, 8, 2048, 8192):
            path = "decode" if tokens <= 8 else "prefill"
            tw, ti = route(tokens, E, TOPK, seed=tokens)
            align = mod.moe_align(ti, mod.TILES[path][0], E)
            x = torch.randn((tokens, H), device="cuda").half()
            nv = tokens * TOPK
            a = torch.randn((nv, INTER), device="cuda").half()
            sid, eid, npost = align

            def run():
                k.gemm(x, w13.w, w13.scales, fmt, k=H, group=group, zeros=w13.zeros, gscale=w13.gscale,
                       sorted_ids=sid, expert_ids=eid, num_post=npost, num_valid=nv, a_div=TOPK, path=path)
                k.gemm(a, w2.w, w2.scales, fmt, k=INTER, group=group, zeros=w2.zeros, gscale=w2.gscale,
                       sorted_ids=sid, expert_ids=eid, num_post=npost, topk_w=tw, num_valid=nv, path=path,
                       out_div=TOPK)

            t = timed(run)
            t_eager = timed_eager(run)
            t_full = timed(lambda: k.fused_moe(x, w13.w, w13.scales, w2.w, w2.scales, tw, ti, fmt, group=group,
                                               gscale13=w13.gscale, gscale2=w2.gscale, path=path, align=align))
            used = int(ti.unique().numel())
            nbytes = used * per_expert + (x.numel() + a.numel()) * 2
            flops = 2 * nv * (2 * INTER * H + H * INTER)
            row = dict(fmt=fmt, group=group, tokens=tokens, path=path, experts_used=used, us=t * 1e6,
                       us_eager=t_eager * 1e6,
                       us_fused_moe=t_full * 1e6, bytes=nbytes, gbps=nbytes / t / 1e9,
                       pct_peak=100 * nbytes / t / peak, pct_copy=100 * nbytes / t / copy, tflops=flops / t / 1e12)
            if tokens >= 2048:
                # Anchor: one cuBLAS fp16 GEMM pair with the same FLOPs (tokens*top_k rows through one expert's shape).
                b13 = torch.randn((2 * INTER, H), device="cuda").half()
                b2 = torch.randn((H, INTER), device="cuda").half()
                xa = torch.randn((nv, H), device="cuda").half()
                aa = torch.randn((nv, INTER), device="cuda").half()
                ta = timed(lambda: (xa @ b13.t(), aa @ b2.t()))
                row.update(anchor_torch_fp16_us=ta * 1e6, anchor_tflops=flops / ta / 1e12, vs_anchor=ta / t)
            rows.append(row)
        del w13, w2
        torch.cuda.empty_cache()
    return rows


def bench_linear(k, peak, copy):
    rows = []
    kk, n = 3840, 15360
    for fmt, group in (("int4", 128), ("fp4", 16)):
        wt = make_weights(fmt, 1, n, kk, group, seed=31, with_deq=False)
        wd = torch.randn((n, kk), device="cuda").half()
        nbytes = wt.bytes_per_expert()
        for m in (1, 8, 2048):
            x = torch.randn((m, kk), device="cuda").half()
            path = "decode" if m <= 16 else "prefill"
            t = timed(lambda: k.linear(x, wt.w[0], wt.scales[0], fmt, group=group, gscale=wt.gscale, path=path))
            ta = timed(lambda: x @ wd.t())
            rows.append(dict(fmt=fmt, group=group, m=m, n=n, k=kk, path=path, us=t * 1e6, anchor_torch_fp16_us=ta * 1e6,
                             vs_anchor=ta / t, gbps=nbytes / t / 1e9, pct_peak=100 * nbytes / t / peak,
                             pct_copy=100 * nbytes / t / copy, tflops=2 * m * n * kk / t / 1e12))
    return rows


# dense fp16 tensor-core peak (datasheet, no sparsity), the compute limit beside the cuBLAS anchor
PEAK_FP16 = {"H100": 989e12, "H200": 989e12, "V100": 125e12}


def bench_prefill(k, mod, peak):
    rows = []
    name = torch.cuda.get_device_name()
    tpeak = next((v for key, v in PEAK_FP16.items() if key in name), None)
    for n, kk in ((15360, 3840), (3840, 15360), (4096, 2816)):
        for fmt, group in (("int4", 128), ("fp4", 16)):
            wt = make_weights(fmt, 1, n, kk, group, seed=41, with_deq=False)
            wd = torch.randn((n, kk), device="cuda").half() * 0.02
            td = timed(lambda: k.dequantize(wt.w[0], wt.scales[0], fmt, k=kk, group=group,
                                            gscale=wt.gscale))
            moved = wt.bytes_per_expert() + n * kk * 2
            for m in (64, 128, 256, 512, 2048, 8192):
                x = torch.randn((m, kk), device="cuda").half()
                tw = timed(lambda: k.linear(x, wt.w[0], wt.scales[0], fmt, group=group, gscale=wt.gscale,
                                            path="prefill", prefill="wmma"))
                tq = timed(lambda: k.linear(x, wt.w[0], wt.scales[0], fmt, group=group, gscale=wt.gscale,
                                            path="prefill", prefill="dequant"))
                ta = timed(lambda: x @ wd.t())
                a = k.linear(x, wt.w[0], wt.scales[0], fmt, group=group, gscale=wt.gscale, path="prefill",
                             prefill="wmma")
                b = k.linear(x, wt.w[0], wt.scales[0], fmt, group=group, gscale=wt.gscale, path="prefill",
                             prefill="dequant")
                flops = 2 * m * n * kk
                row = dict(n=n, k=kk, fmt=fmt, group=group, m=m, wmma_us=tw * 1e6, dequant_us=tq * 1e6,
                           dequant_only_us=td * 1e6, dequant_only_pct_peak=100 * moved / td / peak,
                           anchor_fp16_us=ta * 1e6, anchor_tflops=flops / ta / 1e12,
                           wmma_vs_anchor=ta / tw, dequant_vs_anchor=ta / tq, dequant_over_wmma=tw / tq,
                           default=mod.prefill_choice(m), err_dequant_vs_wmma=rel_err(b, a.float()))
                if tpeak:
                    row["anchor_pct_tensor_peak"] = 100 * flops / ta / tpeak
                rows.append(row)
                print(json.dumps({a_: (round(b_, 4) if isinstance(b_, float) else b_) for a_, b_ in row.items()}),
                      flush=True)
            del wt, wd
            torch.cuda.empty_cache()
    return rows


def bench_moe_prefill(k, mod, peak):
    """The MoE prefill kernels side by side on 26B-A4B shapes: the WMMA tile after the alignment (its launches
    CUDA-graph timed and eager, the layout made beforehand as vLLM's op makes it) against moe_dequant (eager only:
    it reads the routing's counts on the host), TFLOPS, the ratio, their outputs' difference, and the anchor that
    bounds both: one torch fp16 GEMM pair of the same FLOPs (tokens x top_k rows through one expert's shape)."""
    rows = []
    name = torch.cuda.get_device_name()
    tpeak = next((v for key, v in PEAK_FP16.items() if key in name), None)
    for fmt, group in (("int4", 32), ("int4", 128), ("fp4", 16)):
        w13 = make_weights(fmt, E, 2 * INTER, H, group, seed=61, with_deq=False)
        w2 = make_weights(fmt, E, H, INTER, group, seed=62, with_deq=False)
        for tokens in (256, 512, 1024, 2048, 8192):
            tw, ti = route(tokens, E, TOPK, seed=tokens)
            x = (torch.randn((tokens, H), device="cuda") * 0.5).half()
            align = mod.moe_align(ti, mod.align_block("prefill"), E)

            def run(kind, align=align, tw=tw, ti=ti, x=x):
                return k.fused_moe(x, w13.w, w13.scales, w2.w, w2.scales, tw, ti, fmt, group=group,
                                   gscale13=w13.gscale, gscale2=w2.gscale, activation="gelu", path="prefill",
                                   align=align, prefill=kind)

            a, b = run("wmma"), run("dequant")
            t_w = timed(lambda: run("wmma"))
            t_we = timed_eager(lambda: run("wmma"))
            t_d = timed_eager(lambda: run("dequant"))
            nv = tokens * TOPK
            # moe_dequant's two parts apart (graph-timed), for a V100 estimate that scales them by different rules:
            # the dequantization of every expert (bytes: packed read, fp16 written) and the two batched GEMMs at
            # the routing's padded count C (FLOPs)
            cap = int(torch.bincount(ti.flatten().long(), minlength=E).max())
            t_dq = timed(lambda: (k.dequantize(w13.w, w13.scales, fmt, k=H, group=group, gscale=w13.gscale),
                                  k.dequantize(w2.w, w2.scales, fmt, k=INTER, group=group, gscale=w2.gscale)))
            xb = torch.randn((E, cap, H), device="cuda").half()
            ab = torch.randn((E, cap, INTER), device="cuda").half()
            wb13 = torch.randn((E, 2 * INTER, H), device="cuda").half()
            wb2 = torch.randn((E, H, INTER), device="cuda").half()
            t_bmm = timed(lambda: (torch.bmm(xb, wb13.transpose(1, 2)), torch.bmm(ab, wb2.transpose(1, 2))))
            del xb, ab, wb13, wb2
            dq_bytes = E * (w13.bytes_per_expert() + w2.bytes_per_expert() + 3 * INTER * H * 2)
            flops = 2 * nv * 3 * INTER * H
            bmm_flops = 2 * E * cap * 3 * INTER * H   # the padding rows multiply too
            xa = torch.randn((nv, H), device="cuda").half()
            aa = torch.randn((nv, INTER), device="cuda").half()
            b13 = torch.randn((2 * INTER, H), device="cuda").half()
            b2 = torch.randn((H, INTER), device="cuda").half()
            ta = timed(lambda: (xa @ b13.t(), aa @ b2.t()))
            row = dict(fmt=fmt, group=group, tokens=tokens, rows=nv, experts_used=int(ti.unique().numel()),
                       busiest_expert_rows=cap,
                       wmma_us=t_w * 1e6, wmma_eager_us=t_we * 1e6, dequant_eager_us=t_d * 1e6,
                       wmma_over_dequant=t_w / t_d, wmma_eager_over_dequant=t_we / t_d,
                       wmma_tflops=flops / t_w / 1e12, dequant_tflops=flops / t_d / 1e12,
                       anchor_fp16_us=ta * 1e6, anchor_tflops=flops / ta / 1e12,
                       default=mod.moe_prefill_choice(nv), err_dequant_vs_wmma=rel_err(b, a.float()),
                       dequant_only_us=t_dq * 1e6, dequant_only_bytes=dq_bytes,
                       dequant_only_pct_peak=100 * dq_bytes / t_dq / peak, bmm_only_us=t_bmm * 1e6,
                       bmm_padded_flops=bmm_flops, bmm_tflops=bmm_flops / t_bmm / 1e12)
            if tpeak:
                row["anchor_pct_tensor_peak"] = 100 * flops / ta / tpeak
            rows.append(row)
            print(json.dumps({a_: (round(b_, 4) if isinstance(b_, float) else b_) for a_, b_ in row.items()}),
                  flush=True)
            del xa, aa, b13, b2
        del w13, w2
        torch.cuda.empty_cache()
    return rows


def bench_variants(k, mod, peak):
    """The tile candidates (VARIANTS) against the defaults: correctness at K=704, occupancy (blocks per SM), time of a
    12B-like linear (M=1 decode, M=2048 prefill) and of the 26B-A4B MoE pair (1 and 8 tokens decode, 2048 prefill)."""
    rows = []
    for fmt, group in (("int4", 128), ("fp4", 16)):
        wl = make_weights(fmt, 1, 15360, 3840, group, seed=41, with_deq=False)
        w13 = make_weights(fmt, E, 2 * INTER, H, group, seed=42, with_deq=False)
        w2 = make_weights(fmt, E, H, INTER, group, seed=43, with_deq=False)
        wc = make_weights(fmt, 1, 700, 704, group, seed=44)
        xc = torch.randn((3, 704), device="cuda").half()
        x1 = torch.randn((1, 3840), device="cuda").half()
        x2k = torch.randn((2048, 3840), device="cuda").half()
        for variant, path in ((None, "decode"), ("v2", "decode"), ("v3", "decode"), ("v4", "decode"),
                              ("v5", "decode"), ("v6", "decode"), (None, "prefill"), ("p2", "prefill"),
                              ("p3", "prefill")):
            name = f"w4_gemm_{fmt}_{path}" + (f"_{variant}" if variant else "")
            row = dict(fmt=fmt, group=group, path=path, variant=variant or "default", occupancy=k.k[name].occupancy())
            xm = xc if path == "decode" else torch.randn((200, 704), device="cuda").half()
            out = k.gemm(xm, wc.w, wc.scales, fmt, k=704, group=group, gscale=wc.gscale, path=path, variant=variant)
            row["err_k704"] = rel_err(out, ref_linear(xm, wc))
            xl = x1 if path == "decode" else x2k
            t = timed(lambda: k.gemm(xl, wl.w, wl.scales, fmt, k=3840, group=group, gscale=wl.gscale, path=path,
                                     variant=variant))
            row.update(linear_us=t * 1e6, linear_m=xl.shape[0], linear_pct_peak=100 * wl.bytes_per_expert() / t / peak,
                       linear_tflops=2 * xl.shape[0] * 15360 * 3840 / t / 1e12)
            for tokens in ((1, 8) if path == "decode" else (2048,)):
                tw, ti = route(tokens, E, TOPK, seed=tokens)
                sid, eid, npost = mod.moe_align(ti, 16 if path == "decode" else 64, E)
                x = torch.randn((tokens, H), device="cuda").half()
                nv = tokens * TOPK
                a = torch.randn((nv, INTER), device="cuda").half()

                def run():
                    k.gemm(x, w13.w, w13.scales, fmt, k=H, group=group, gscale=w13.gscale, sorted_ids=sid,
                           expert_ids=eid, num_post=npost, num_valid=nv, a_div=TOPK, path=path, variant=variant)
                    k.gemm(a, w2.w, w2.scales, fmt, k=INTER, group=group, gscale=w2.gscale, sorted_ids=sid,
                           expert_ids=eid, num_post=npost, topk_w=tw, num_valid=nv, path=path, out_div=TOPK,
                           variant=variant)

                t = timed(run)
                used = int(ti.unique().numel())
                nbytes = used * (w13.bytes_per_expert() + w2.bytes_per_expert())
                row[f"moe_{tokens}_us"] = t * 1e6
                row[f"moe_{tokens}_pct_peak"] = 100 * nbytes / t / peak
                row[f"moe_{tokens}_tflops"] = 2 * nv * 3 * INTER * H / t / 1e12
            rows.append(row)
        del w13, w2, wl
        torch.cuda.empty_cache()
    return rows


def _stream_anchor(nbytes):
    """CUDA-graph median of a torch sum over `nbytes` of float32: the time to read that many bytes once."""
    buf = torch.randn((max(1, nbytes // 4),), device="cuda")
    return timed(lambda: buf.sum())


# The decode arms of bench_decode, (decode kernel, GEMV variant): WMMA, the default GEMV and the GEMV candidates.
# --decode-arms keeps a subset (labels).
DECODE_ARMS = (("wmma", None), ("gemv", None), ("gemv", "c4"), ("gemv", "q1"), ("gemv", "r1"), ("gemv", "q4"),
               ("gemv", "q4+d8"), ("gemv", "q4+d16"), ("gemv", "q4+n16"), ("gemv", "r1+d8"), ("gemv", "r1+d16"),
               ("gemv", "r1+n16"), ("gemv", "q4+p8"), ("gemv", "q4+p16"), ("gemv", "q4+q16"), ("gemv", "r1+p8"),
               ("gemv", "r1+p16"), ("gemv", "r1+q16"), ("gemv", "q4+f8"), ("gemv", "q4+f16"), ("gemv", "r1+f8"),
               ("gemv", "r1+f16"))
ARM_FILTER: set[str] | None = None


def _arms(mod):
    """DECODE_ARMS that this launcher has (an older tree's launcher, run as the same run's baseline, lacks new ones)
    and --decode-arms keeps; WMMA is always kept (the ratios' denominator)."""
    return [(d, v) for d, v in DECODE_ARMS if (v is None or v in mod.GEMV_VARIANTS
                                               or v in getattr(mod, "DIRECT_VARIANTS", ()))
            and (ARM_FILTER is None or d == "wmma" or _arm_label(d, v) in ARM_FILTER)]


def _arm_label(dec, var):
    return dec + (f"_{var}" if var else "")


def _direct_parts(var):
    """(gate_up GEMV variant, down tile) of a router-direct arm ("q4+p16"), None for an aligned GEMV arm (a variant
    without "+", or None: the default GEMV)."""
    if not var or "+" not in var:
        return None
    up_var, tile = var.split("+")
    return up_var, tile


def _finish_decode_row(row, outs, pct):
    """The streaming-read anchor of the row's bytes, the wmma / gemv ratios and the GEMV errors; prints the row."""
    row["stream_us"] = _stream_anchor(row["bytes"]) * 1e6
    pct(row, "stream", row["bytes"])
    for label in [lab for lab in outs if lab != "wmma"]:
        row[f"wmma_over_{label}"] = row["wmma_us"] / row[f"{label}_us"]
        if "wmma_layer_us" in row:
            row[f"wmma_over_{label}_layer"] = row["wmma_layer_us"] / row[f"{label}_layer_us"]
        row[f"err_{label}_vs_wmma"] = rel_err(outs[label], outs["wmma"])
    print(json.dumps({a: (round(b, 4) if isinstance(b, float) else b) for a, b in row.items()}), flush=True)
    return row


# A decode step is one CUDA graph of every layer: the "seq" figures time SEQ_LAYERS MoE layers captured back to back
# in one graph (per layer: the total / SEQ_LAYERS), each layer with its own routing and with weights cycling over
# SEQ_SETS full sets of 128 experts (>= 3 other layers' bytes between two uses of a set, more than the 50 MB L2 of an
# H100/H200 at one token), so no layer reads another's weights from L2 and no layer pays the graph's launch.
SEQ_LAYERS, SEQ_SETS = 8, 4


def _seq_decode_row(k, mod, row, fmt, group, tokens, sets, per_expert, peak):
    """Per-layer µs of each decode arm's whole fused_moe layer and of a plain read, SEQ_LAYERS layers in one graph
    (per_expert: packed bytes + scales of one expert, the same in every set)."""
    layers = []
    for i in range(SEQ_LAYERS):
        tw, ti = route(tokens, E, TOPK, seed=1000 * tokens + i)
        w13, w2 = sets[i % len(sets)]
        layers.append((torch.randn((tokens, H), device="cuda").half(), tw, ti, w13, w2,
                       int(ti.unique().numel()) * per_expert))
    total = sum(lay[-1] for lay in layers)
    for dec, var in _arms(mod):
        label = _arm_label(dec, var)
        calls = []
        for x, tw, ti, w13, w2, _b in layers:
            align = mod.moe_align(ti, mod.align_block("decode", dec), E)

            def one(x=x, tw=tw, ti=ti, w13=w13, w2=w2, align=align, dec=dec, var=var):
                return k.fused_moe(x, w13.w, w13.scales, w2.w, w2.scales, tw, ti, fmt, group=group,
                                   gscale13=w13.gscale, gscale2=w2.gscale, path="decode", align=align,
                                   decode=dec, variant=var)
            calls.append(one)
        row[f"{label}_seq_us"] = timed(lambda calls=calls: [c() for c in calls]) / SEQ_LAYERS * 1e6
        row[f"{label}_seq_pct_peak"] = 100 * total / (row[f"{label}_seq_us"] * 1e-6 * SEQ_LAYERS) / peak
    bufs = [torch.empty((max(1, lay[-1] // 4),), device="cuda").normal_() for lay in layers]
    row["stream_seq_us"] = timed(lambda: [b.sum() for b in bufs]) / SEQ_LAYERS * 1e6
    row["stream_seq_pct_peak"] = 100 * total / (row["stream_seq_us"] * 1e-6 * SEQ_LAYERS) / peak
    row["seq_bytes_per_layer"] = total // SEQ_LAYERS
    del bufs
    _seq_projection_rows(k, mod, row, fmt, group, tokens, layers, peak)


def _seq_projection_rows(k, mod, row, fmt, group, tokens, layers, peak):
    """Each two-launch GEMV arm's gate_up and down launches timed apart (SEQ_LAYERS of one projection in one graph,
    per layer) beside plain reads of each projection's bytes and a read of gate_up's bytes followed by a read of
    down's (the two dependent launches a two-launch layer needs at least): which projection loses the time."""
    nv = tokens * TOPK
    w13_0, w2_0 = layers[0][3], layers[0][4]
    up_e, down_e = w13_0.bytes_per_expert(), w2_0.bytes_per_expert()
    used = [int(lay[2].unique().numel()) for lay in layers]
    up_b, down_b = sum(u * up_e for u in used), sum(u * down_e for u in used)
    acts = [torch.randn((nv, INTER), device="cuda").half() for _ in layers]
    # one alignment per layer: every GEMV arm takes the same block (align_block("decode", "gemv"))
    aligns = [mod.moe_align(lay[2], mod.align_block("decode", "gemv"), E) for lay in layers]
    gemv = [(d, v) for d, v in _arms(mod) if d == "gemv"]
    for dec, var in gemv:
        label = _arm_label(dec, var)
        ups, downs = [], []
        for (x, tw, ti, w13, w2, _b), a, (sid, eid, npost) in zip(layers, acts, aligns, strict=True):
            parts = _direct_parts(var)
            if parts:   # router-direct: gate_up one routed row per block from topk_ids, down w4_moe_down
                up_var, tile = parts
                ids = ti.to(torch.int32).contiguous()
                ups.append(lambda x=x, w13=w13, ids=ids, v=up_var: k.direct_gate_up(
                    x, w13.w, w13.scales, fmt, group=group, topk_ids=ids, gscale=w13.gscale, variant=v))
                downs.append(lambda a=a, w2=w2, tw=tw, ids=ids, t=tile: k.moe_down(
                    a, w2.w, w2.scales, fmt, k=INTER, group=group, topk_ids=ids, topk_w=tw, gscale=w2.gscale, tile=t))
                continue
            common = dict(group=group, sorted_ids=sid, expert_ids=eid, num_post=npost, num_valid=nv, variant=var)
            ups.append(lambda x=x, w13=w13, c=common: k.gemv(
                x, w13.w, w13.scales, fmt, k=H, gscale=w13.gscale, a_div=TOPK, activation="gelu_tanh", **c))
            downs.append(lambda a=a, w2=w2, tw=tw, c=common: k.gemv(
                a, w2.w, w2.scales, fmt, k=INTER, gscale=w2.gscale, topk_w=tw, out_div=TOPK, **c))
        for proj, calls, nbytes in (("up", ups, up_b), ("down", downs, down_b)):
            t = timed(lambda calls=calls: [c() for c in calls]) / SEQ_LAYERS
            row[f"{label}_seq_{proj}_us"] = t * 1e6
            row[f"{label}_seq_{proj}_pct_peak"] = 100 * nbytes / SEQ_LAYERS / t / peak
    ub = [torch.empty((max(1, u * up_e // 4),), device="cuda").normal_() for u in used]
    db = [torch.empty((max(1, u * down_e // 4),), device="cuda").normal_() for u in used]
    row["stream_seq_up_us"] = timed(lambda: [b.sum() for b in ub]) / SEQ_LAYERS * 1e6
    row["stream_seq_down_us"] = timed(lambda: [b.sum() for b in db]) / SEQ_LAYERS * 1e6
    pairs = list(zip(ub, db, strict=True))
    row["stream_seq_two_us"] = timed(lambda: [(u.sum(), d.sum()) for u, d in pairs]) / SEQ_LAYERS * 1e6
    row["stream_seq_two_pct_peak"] = 100 * (up_b + down_b) / SEQ_LAYERS / (row["stream_seq_two_us"] * 1e-6) / peak


def bench_decode(k, mod, peak, copy):
    """WMMA decode vs GEMV decode: MoE 1/4/8 tokens and the 3840 -> 15360 linear at M = 1/4/8, same weights."""
    rows = []

    def pct(row, label, nbytes):
        t = row[f"{label}_us"] * 1e-6
        row[f"{label}_pct_peak"] = 100 * nbytes / t / peak
        row[f"{label}_pct_copy"] = 100 * nbytes / t / copy

    for fmt, group in (("int4", 32), ("int4", 128), ("fp4", 16)):
        w13 = make_weights(fmt, E, 2 * INTER, H, group, seed=61, with_deq=False)
        w2 = make_weights(fmt, E, H, INTER, group, seed=62, with_deq=False)
        per_expert = w13.bytes_per_expert() + w2.bytes_per_expert()
        sets = [(w13, w2)] + [(make_weights(fmt, E, 2 * INTER, H, group, seed=61 + 2 * i, with_deq=False),
                               make_weights(fmt, E, H, INTER, group, seed=62 + 2 * i, with_deq=False))
                              for i in range(1, SEQ_SETS)]
        for tokens in (1, 4, 8):
            tw, ti = route(tokens, E, TOPK, seed=tokens)
            x = torch.randn((tokens, H), device="cuda").half()
            nv = tokens * TOPK
            a = torch.randn((nv, INTER), device="cuda").half()
            used = int(ti.unique().numel())
            nbytes = used * per_expert
            row = dict(kind="moe", fmt=fmt, group=group, tokens=tokens, experts_used=used, bytes=nbytes)
            outs = {}
            for dec, var in _arms(mod):
                label = _arm_label(dec, var)
                align = mod.moe_align(ti, mod.align_block("decode", dec), E)
                sid, eid, npost = align
                if dec == "wmma":
                    def kernels(sid=sid, eid=eid, npost=npost):
                        k.gemm(x, w13.w, w13.scales, fmt, k=H, group=group, gscale=w13.gscale, sorted_ids=sid,
                               expert_ids=eid, num_post=npost, num_valid=nv, a_div=TOPK, path="decode", decode="wmma")
                        k.gemm(a, w2.w, w2.scales, fmt, k=INTER, group=group, gscale=w2.gscale, sorted_ids=sid,
                               expert_ids=eid, num_post=npost, topk_w=tw, num_valid=nv, path="decode",
                               out_div=TOPK, decode="wmma")
                elif _direct_parts(var):   # router-direct: no alignment at all
                    def kernels(var=var):
                        k.moe_direct(x, w13.w, w13.scales, w2.w, w2.scales, tw, ti, fmt, group=group,
                                     variant=var, gscale13=w13.gscale, gscale2=w2.gscale)
                else:
                    def kernels(sid=sid, eid=eid, npost=npost, var=var):
                        k.gemv(x, w13.w, w13.scales, fmt, k=H, group=group, gscale=w13.gscale, sorted_ids=sid,
                               expert_ids=eid, num_post=npost, num_valid=nv, a_div=TOPK, activation="gelu_tanh",
                               variant=var)
                        k.gemv(a, w2.w, w2.scales, fmt, k=INTER, group=group, gscale=w2.gscale, sorted_ids=sid,
                               expert_ids=eid, num_post=npost, topk_w=tw, num_valid=nv, out_div=TOPK, variant=var)

                def layer(dec=dec, align=align, var=var):
                    return k.fused_moe(x, w13.w, w13.scales, w2.w, w2.scales, tw, ti, fmt, group=group,
                                       gscale13=w13.gscale, gscale2=w2.gscale, path="decode", align=align,
                                       decode=dec, variant=var)

                outs[label] = layer().float()
                row[f"{label}_us"] = timed(kernels) * 1e6
                row[f"{label}_layer_us"] = timed(layer) * 1e6
                pct(row, label, nbytes)
            try:   # not yet run on a GPU: a failure here must not cost the row its single-layer figures
                _seq_decode_row(k, mod, row, fmt, group, tokens, sets, per_expert, peak)
            except Exception:  # noqa: BLE001
                row["seq_error"] = traceback.format_exc()[-1500:]
                print(row["seq_error"], file=sys.stderr)
            rows.append(_finish_decode_row(row, outs, pct))
        del w13, w2, sets
        torch.cuda.empty_cache()
    kk, n = 3840, 15360
    for fmt, group in (("int4", 128), ("fp4", 16)):
        wt = make_weights(fmt, 1, n, kk, group, seed=63, with_deq=False)
        nbytes = wt.bytes_per_expert()
        for m in (1, 4, 8):
            x = torch.randn((m, kk), device="cuda").half()
            row = dict(kind="linear", fmt=fmt, group=group, m=m, n=n, k=kk, bytes=nbytes)
            outs = {}
            for dec, var in [(d, v) for d, v in _arms(mod) if "+" not in (v or "")]:   # router-direct: MoE only
                label = _arm_label(dec, var)

                def lin(dec=dec, var=var):
                    return k.gemm(x, wt.w[0], wt.scales[0], fmt, k=kk, group=group, gscale=wt.gscale, path="decode",
                                  decode=dec, variant=var)

                outs[label] = lin().float()
                row[f"{label}_us"] = timed(lin) * 1e6
                pct(row, label, nbytes)
            rows.append(_finish_decode_row(row, outs, pct))
        del wt
        torch.cuda.empty_cache()
    return rows


def bench_vllm_anchors(k, mod, peak, copy):
    """Issue 29's anchors on 26B-A4B shapes: vLLM 0.20's W4A16 MoE (Triton and moe_wna16 CUDA) vs ours, same weights.

    The int4 layout is the same bytes for both (compressed-tensors int32 [E, N, K/8] LSB first = vLLM's uint8
    [E, N, K/2], low nibble first; symmetric value = nibble - 8; fp16 scales [E, N, ceil(K/g)]). Every timing is the
    whole layer from topk ids and weights (CUDA-graph replay medians); `err_vs_triton` checks that the three agree."""
    import vllm
    from vllm.model_executor.layers.fused_moe import fused_moe as fm
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import int4_w4a16_moe_quant_config
    from vllm.model_executor.layers.fused_moe.moe_align_block_size import moe_align_block_size

    rows = []
    orig = fm.should_moe_wna16_use_cuda
    for group in (32, 128):
        w13 = make_weights("int4", E, 2 * INTER, H, group, seed=51, with_deq=False)
        w2 = make_weights("int4", E, H, INTER, group, seed=52, with_deq=False)
        v13, v2 = w13.w.view(torch.uint8), w2.w.view(torch.uint8)   # [E, N, K/2]
        qc = int4_w4a16_moe_quant_config(w13.scales, w2.scales, None, None, block_shape=[0, group])
        per_expert = w13.bytes_per_expert() + w2.bytes_per_expert()
        for tokens in (1, 4, 8, 2048, 8192):
            path = "decode" if tokens <= 8 else "prefill"
            tw, ti = route(tokens, E, TOPK, seed=tokens)
            x = (torch.randn((tokens, H), device="cuda") * 0.5).half()
            bm = mod.align_block(path)

            def ours(prefill="wmma"):
                return k.fused_moe(x, w13.w, w13.scales, w2.w, w2.scales, tw, ti, "int4", group=group,
                                   activation="silu", path=path, align=moe_align_block_size(ti, bm, E),
                                   prefill=prefill)

            def vllm_moe():
                return fm.fused_experts(x, v13, v2, tw, ti, activation=MoEActivation.SILU, quant_config=qc)

            row = dict(fmt="int4", group=group, tokens=tokens, path=path, experts_used=int(ti.unique().numel()))
            outs = {}
            for label, use_cuda in (("triton", False), ("moe_wna16", True)):
                fm.should_moe_wna16_use_cuda = (lambda use: (lambda *a, **kw: use))(use_cuda)
                try:
                    outs[label] = vllm_moe().float()
                    row[f"vllm_{label}_us"] = timed(vllm_moe) * 1e6
                    if label == "triton" and path == "prefill":   # beside moe_dequant, launched the same way
                        row["vllm_triton_eager_us"] = timed_eager(vllm_moe) * 1e6
                except Exception as exc:  # noqa: BLE001
                    row[f"vllm_{label}_error"] = f"{type(exc).__name__}: {exc}"[:300]
                finally:
                    fm.should_moe_wna16_use_cuda = orig
            outs["ours"] = ours().float()
            row["ours_us"] = timed(ours) * 1e6
            if path == "prefill":
                # moe_dequant reads the routing's counts on the host, so it is timed launched from Python (no
                # graph), beside vLLM's Triton kernel timed the same way
                outs["ours_dequant"] = ours("dequant").float()
                row["ours_dequant_eager_us"] = timed_eager(lambda: ours("dequant")) * 1e6
                for label in ("vllm_triton_eager", "vllm_triton"):
                    if row.get(f"{label}_us"):
                        row[f"{label}_us_over_ours_dequant"] = row[f"{label}_us"] / row["ours_dequant_eager_us"]
            ref = outs.get("triton")
            if ref is not None:
                for label in ("ours", "ours_dequant", "moe_wna16"):
                    if label in outs:
                        row[f"err_{label}_vs_triton"] = float((outs[label] - ref).abs().max() / ref.abs().max())
            nbytes = row["experts_used"] * per_expert
            flops = 2 * tokens * TOPK * 3 * INTER * H
            for label in ("ours", "vllm_triton", "vllm_moe_wna16"):
                t = row.get(f"{label}_us")
                if t:
                    row[f"{label}_pct_peak"] = 100 * nbytes / (t * 1e-6) / peak
                    row[f"{label}_pct_copy"] = 100 * nbytes / (t * 1e-6) / copy
                    row[f"{label}_tflops"] = flops / (t * 1e-6) / 1e12
            for label in ("vllm_triton", "vllm_moe_wna16"):
                if row.get(f"{label}_us"):
                    row[f"{label}_us_over_ours"] = row[f"{label}_us"] / row["ours_us"]
            rows.append(row)
            print(json.dumps({a: (round(b, 4) if isinstance(b, float) else b) for a, b in row.items()}), flush=True)
        del w13, w2, v13, v2
        torch.cuda.empty_cache()
    return {"vllm": vllm.__version__, "rows": rows}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", required=True)
    ap.add_argument("--prefer", default="ptx")
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--vllm-anchors", action="store_true",
                    help="also vLLM's W4A16 fused_moe (Triton, moe_wna16) anchors")
    ap.add_argument("--only-anchors", action="store_true", help="copy bandwidth and the vLLM anchors only")
    ap.add_argument("--only-decode", action="store_true",
                    help="copy bandwidth and the WMMA-vs-GEMV decode comparison only")
    ap.add_argument("--only-prefill", action="store_true",
                    help="copy bandwidth and the WMMA-vs-dequant linear prefill comparison only")
    ap.add_argument("--only-moe-prefill", action="store_true",
                    help="copy bandwidth and the WMMA-vs-dequant MoE prefill comparison only")
    ap.add_argument("--decode-arms", default=None,
                    help="comma-separated decode arm labels to keep (e.g. gemv_q4,gemv_r1); WMMA always runs")
    args = ap.parse_args()
    global ARM_FILTER
    ARM_FILTER = set(args.decode_arms.split(",")) if args.decode_arms else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    mod = w4_launcher()
    k = mod.load(cache=Path(args.cache), prefer=args.prefer, overlay_dir=W4_DIR)
    name = torch.cuda.get_device_name()
    peak = next((v for key, v in PEAK_BW.items() if key in name), 4.8e12)
    res = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), device=name, torch=torch.__version__,
               cuda=torch.version.cuda, objects=[o.__dict__ for o in k.k.objects], peak_bw=peak)
    try:
        import subprocess
        res["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                       capture_output=True, text=True).stdout.strip()
    except Exception as exc:  # noqa: BLE001
        res["driver"] = f"unknown ({exc})"
    steps = [("grid", lambda: grid(k, args.quick)), ("copy_bw", copy_bw),
             ("moe", lambda: bench_moe(k, mod, peak, res["copy_bw"])),
             ("linear", lambda: bench_linear(k, peak, res["copy_bw"])),
             ("variants", lambda: bench_variants(k, mod, peak)),
             ("decode", lambda: bench_decode(k, mod, peak, res["copy_bw"])),
             ("prefill", lambda: bench_prefill(k, mod, peak)),
             ("moe_prefill", lambda: bench_moe_prefill(k, mod, peak))]
    if args.only_anchors:
        steps = steps[1:2]
    elif args.only_decode or args.only_prefill or args.only_moe_prefill:
        steps = [steps[1]] + [s for s in steps if (s[0] == "decode" and args.only_decode)
                              or (s[0] == "prefill" and args.only_prefill)
                              or (s[0] == "moe_prefill" and args.only_moe_prefill)]
    if args.vllm_anchors or args.only_anchors:
        steps.append(("vllm_anchors", lambda: bench_vllm_anchors(k, mod, peak, res["copy_bw"])))
    for key, fn in steps:
        t0 = time.time()
        try:
            res[key] = fn()
        except Exception:  # noqa: BLE001
            res[key + "_error"] = traceback.format_exc()[-3000:]
            print(res[key + "_error"], file=sys.stderr)
            if key == "copy_bw":
                res["copy_bw"] = peak
        print(f"{key}: {time.time() - t0:.1f}s", file=sys.stderr, flush=True)
        (out / "results.json").write_text(json.dumps(res, indent=1, default=str))
    md = [f"# sm70-w4-gemm on {name} ({res['date']}, driver {res['driver']}, torch {res['torch']})", "",
          f"copy bandwidth: {res['copy_bw'] / 1e9:.0f} GB/s (peak {peak / 1e12:.1f} TB/s)", ""]
    if "grid" in res:
        worst = max(res["grid"], key=lambda r: r["err"])
        md += [f"grid: {len(res['grid'])} cases, worst rel err {worst['err']:.2e} ({worst})", ""]
        md += [json.dumps(r) for r in res["grid"]]
    for key in ("moe", "linear", "variants", "decode", "prefill", "moe_prefill"):
        md += ["", f"## {key}"] + [json.dumps({a: (round(b, 3) if isinstance(b, float) else b) for a, b in r.items()})
                                   for r in res.get(key, [])]
    if "vllm_anchors" in res:
        md += ["", f"## vLLM {res['vllm_anchors']['vllm']} W4A16 MoE anchors (whole layer, us)"]
        md += [json.dumps({a: (round(b, 3) if isinstance(b, float) else b) for a, b in r.items()})
               for r in res["vllm_anchors"]["rows"]]
    (out / "results.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
