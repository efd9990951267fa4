"""GPU tests of the sm70-w4-gemm kernels: the compute_70 PTX (the Volta code path) against float32 over the
dequantized weights. Skipped without torch CUDA. The PTX comes from $OVERLAY_KERNEL_CACHE when it holds a build of
sm70-w4-gemm (how the H200 run carries it: CUDA 13 cannot target compute_70), else NVRTC 12 from the PyPI wheels."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU with torch CUDA"),
]

TOL_LINEAR = 5e-3   # max |err| / max |ref|
TOL_MOE = 1e-2      # the fp16 intermediate between the two GEMMs adds rounding


def _gemv_variants() -> list[str]:
    """The launcher's GEMV candidates (GEMV_VARIANTS), so a new entry is in every grid below without a second list."""
    from tests.kernels.w4_launcher import w4_launcher

    return list(w4_launcher().GEMV_VARIANTS)


@pytest.fixture(scope="module")
def w4(tmp_path_factory):
    from manager.kernels import builder

    from tests.kernels.w4_launcher import W4_DIR, w4_launcher

    mod = w4_launcher()
    env = os.environ.get("OVERLAY_KERNEL_CACHE")
    if env and (Path(env) / "index" / "sm70-w4-gemm.json").exists():
        cache = Path(env)
    else:
        from tests.helpers import SHIPPED_OVERLAYS
        from tests.helpers.nvrtc12 import nvrtc12_lib

        cache = tmp_path_factory.mktemp("kcache")
        builder.build(SHIPPED_OVERLAYS, ["sm70-w4-gemm"], cache=cache, nvrtc_path=str(nvrtc12_lib()), progress=False)
    mod._loaded.clear()
    k = mod.load(cache=cache, prefer="ptx", overlay_dir=W4_DIR)
    assert all(o.arch == "compute_70" and o.kind == "ptx" for o in k.k.objects)
    return k


@pytest.mark.parametrize("fmt,group", [("int4", 32), ("int4", 128), ("int4zp", 128), ("fp4", 16)])
@pytest.mark.parametrize("m,n,k,path,prefill", [(1, 1408, 704, "decode", None), (5, 100, 2816, "decode", None),
                                                (300, 2816, 704, "prefill", "wmma"),
                                                (300, 2816, 704, "prefill", "dequant"),
                                                (64, 96, 96, "prefill", None)])
def test_linear_matches_fp32_over_dequantized_weights(w4, fmt, group, m, n, k, path, prefill):
    from tests.kernels.w4_reference import make_weights, ref_linear, rel_err

    wt = make_weights(fmt, 1, n, k, group, seed=m + n + k)
    x = torch.randn((m, k), device="cuda").half()
    out = w4.linear(x, wt.w[0], wt.scales[0], fmt, group=group, zeros=None if wt.zeros is None else wt.zeros[0],
                    gscale=wt.gscale, path=path, prefill=prefill)
    assert out.shape == (m, n)
    assert rel_err(out, ref_linear(x, wt)) <= TOL_LINEAR


@pytest.mark.parametrize("fmt,group", [("int4", 16), ("int4", 32), ("int4", 128), ("int4zp", 32), ("int4zp", 128),
                                       ("fp4", 16)])
@pytest.mark.parametrize("e,n,k", [(1, 100, 704), (3, 40, 2816), (2, 8, 32)])
def test_dequantize_writes_each_weight_as_the_fp16_rounding_of_its_exact_value(w4, fmt, group, e, n, k):
    """w4_dequant_<fmt>: every value bit-equal to the float32 dequantization rounded once to fp16 (N not a multiple of
    8 with zero points, K = 704 with a partial last group at 128, K = 32: one thread per row)."""
    from tests.kernels.w4_reference import make_weights

    wt = make_weights(fmt, e, n, k, group, seed=e + n + k + group)
    out = w4.dequantize(wt.w, wt.scales, fmt, k=k, group=group, zeros=wt.zeros, gscale=wt.gscale)
    assert out.shape == (e, n, k) and out.dtype == torch.float16 and "w4_dequant_" + fmt in w4.ran
    if fmt == "fp4":   # e2m1 x (e4m3 x gscale) in fp32 here, e2m1 x (e4m3 / weight_global_scale) in the oracle
        torch.testing.assert_close(out.float(), wt.deq.half().float(), rtol=2.0 ** -10, atol=2.0 ** -24)
    else:              # (q - zero) x scale is exact in fp32: one rounding on both sides
        assert torch.equal(out, wt.deq.half())


def test_linear_prefill_takes_the_dequant_kernel_from_its_row_threshold(w4):
    from tests.kernels.w4_reference import make_weights, ref_linear, rel_err

    threshold = sys.modules[type(w4).__module__].DEQUANT_MIN_ROWS
    wt = make_weights("fp4", 1, 256, 512, 16, seed=12)
    for m in (threshold - 1, threshold):
        w4.ran.clear()
        x = torch.randn((m, 512), device="cuda").half()
        out = w4.linear(x, wt.w[0], wt.scales[0], "fp4", group=16, gscale=wt.gscale, path="prefill")
        assert rel_err(out, ref_linear(x, wt)) <= TOL_LINEAR
        assert w4.ran == ({"w4_dequant_fp4"} if m >= threshold else {"w4_gemm_fp4_prefill"})


@pytest.mark.parametrize("fmt,group", [("int4", 32), ("fp4", 16)])
@pytest.mark.parametrize("tokens,only,path", [(1, None, "decode"), (8, None, "decode"), (3, 2, "decode"),
                                              (200, None, "prefill"), (64, 8, "prefill")])
def test_moe_top8_of_128_matches_fp32(w4, fmt, group, tokens, only, path):
    """26B-A4B shapes scaled down in N (hidden 256, intermediate 704 = K of down, not a multiple of 128), 128 experts,
    top-8; `only` routes every token to the first experts so that the other experts stay empty."""
    from tests.kernels.w4_reference import make_weights, ref_moe, rel_err, route

    e, h, inter = 128, 256, 704
    w13 = make_weights(fmt, e, 2 * inter, h, group, seed=1)
    w2 = make_weights(fmt, e, h, inter, group, seed=2)
    topk_w, topk_ids = route(tokens, e, 8 if only is None else min(8, only), seed=tokens)
    x = torch.randn((tokens, h), device="cuda").half()
    out = w4.fused_moe(x, w13.w, w13.scales, w2.w, w2.scales, topk_w, topk_ids, fmt, group=group,
                       z13=w13.zeros, z2=w2.zeros, gscale13=w13.gscale, gscale2=w2.gscale, path=path)
    assert rel_err(out, ref_moe(x, w13, w2, topk_w, topk_ids)) <= TOL_MOE


@pytest.mark.parametrize("fmt,group", [("int4", 32), ("int4", 128), ("int4zp", 32), ("fp4", 16)])
@pytest.mark.parametrize("tokens,only", [(600, None), (520, 8)])
def test_moe_dequant_prefill_matches_fp32_and_launches_no_wmma_tile(w4, fmt, group, tokens, only):
    """The dequant MoE prefill (MOE_DEQUANT_MIN_ROWS routed rows and more) on the shapes above: the experts' fp16
    weights from w4_dequant_<fmt>, torch's batched GEMM, no WMMA prefill tile; `only`: 120 experts stay empty."""
    from tests.kernels.w4_launcher import w4_launcher
    from tests.kernels.w4_reference import make_weights, ref_moe, rel_err, route

    mod = w4_launcher()
    e, h, inter = 128, 256, 704
    w13 = make_weights(fmt, e, 2 * inter, h, group, seed=1)
    w2 = make_weights(fmt, e, h, inter, group, seed=2)
    topk_w, topk_ids = route(tokens, e, 8, seed=tokens, only=only)
    assert tokens * 8 >= mod.MOE_DEQUANT_MIN_ROWS
    x = torch.randn((tokens, h), device="cuda").half()
    w4.ran.clear()
    out = w4.fused_moe(x, w13.w, w13.scales, w2.w, w2.scales, topk_w, topk_ids, fmt, group=group,
                       z13=w13.zeros, z2=w2.zeros, gscale13=w13.gscale, gscale2=w2.gscale, path="prefill",
                       prefill="dequant")
    assert w4.ran == {f"w4_dequant_{fmt}"}
    assert rel_err(out, ref_moe(x, w13, w2, topk_w, topk_ids)) <= TOL_MOE


def test_moe_prefill_inside_a_cuda_graph_capture_runs_the_wmma_tile_and_replays_its_result(w4):
    from tests.kernels.w4_launcher import w4_launcher
    from tests.kernels.w4_reference import make_weights, ref_moe, rel_err, route

    mod = w4_launcher()
    e, h, inter, tokens = 128, 256, 704, 512
    w13 = make_weights("int4", e, 2 * inter, h, 32, seed=3)
    w2 = make_weights("int4", e, h, inter, 32, seed=4)
    topk_w, topk_ids = route(tokens, e, 8, seed=7)
    x = torch.randn((tokens, h), device="cuda").half()
    align = mod.moe_align(topk_ids, mod.align_block("prefill"), e)   # (vLLM's op in the engine; this one syncs)

    def layer():
        return w4.fused_moe(x, w13.w, w13.scales, w2.w, w2.scales, topk_w, topk_ids, "int4", group=32,
                            path="prefill", prefill="dequant", align=align)

    eager = layer()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        layer()
    torch.cuda.current_stream().wait_stream(s)
    w4.ran.clear()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = layer()
    g.replay()
    torch.cuda.synchronize()
    assert "w4_gemm_int4_prefill" in w4.ran and "w4_dequant_int4" not in w4.ran
    ref = ref_moe(x, w13, w2, topk_w, topk_ids)
    assert rel_err(out, ref) <= TOL_MOE and rel_err(eager, ref) <= TOL_MOE
    assert tokens * 8 >= mod.MOE_DEQUANT_MIN_ROWS


TOL_GEMV_LINEAR = 2e-3   # fp16 products summed over 4 per fp16 partial, fp32 across partials and groups


@pytest.mark.parametrize("fmt,group", [("int4", 16), ("int4", 32), ("int4", 128), ("int4zp", 32), ("int4zp", 128),
                                       ("fp4", 16)])
@pytest.mark.parametrize("m,n,k", [(1, 1408, 704), (3, 100, 2816), (8, 2816, 704), (5, 96, 3840), (13, 40, 1056)])
def test_gemv_decode_linear_matches_fp32_over_dequantized_weights(w4, fmt, group, m, n, k):
    """The GEMV decode path (decode="gemv"): K = 704 (a partial last group at 128), 3840 (two K chunks), M = 13 (two
    row blocks of 8), N not a multiple of the 16 rows of a block."""
    from tests.kernels.w4_reference import make_weights, ref_linear, rel_err

    wt = make_weights(fmt, 1, n, k, group, seed=3 * m + n + k)
    x = torch.randn((m, k), device="cuda").half()
    out = w4.linear(x, wt.w[0], wt.scales[0], fmt, group=group, zeros=None if wt.zeros is None else wt.zeros[0],
                    gscale=wt.gscale, path="decode", decode="gemv")
    assert out.shape == (m, n) and "w4_gemv_" + fmt in w4.ran
    assert rel_err(out, ref_linear(x, wt)) <= TOL_GEMV_LINEAR


@pytest.mark.parametrize("fmt,group", [("int4", 16), ("int4", 32), ("int4", 128), ("int4zp", 32), ("fp4", 16)])
@pytest.mark.parametrize("tokens,only,block", [(1, None, None), (4, None, None), (8, None, None), (3, 2, None),
                                               (12, 8, None), (12, 8, 16), (20, 8, 64)])
def test_gemv_moe_top8_of_128_matches_fp32(w4, fmt, group, tokens, only, block):
    """The GEMV decode MoE (gate_up with act(gate) * up fused, then down with the routing weight and the top-k sum):
    hidden 256, intermediate 704 (K of down), 128 experts, top-8; `only` routes every token to the first experts (the
    rest stay empty; with only=8 every expert holds `tokens` rows: more than the 8 rows a block stages); `block`: the
    alignment block when it is not the launcher's (16: the WMMA decode's, 12 rows in two passes; 64: 20 rows in three passes)."""
    from tests.kernels.w4_reference import make_weights, ref_moe, rel_err, route

    e, h, inter = 128, 256, 704
    w13 = make_weights(fmt, e, 2 * inter, h, group, seed=5)
    w2 = make_weights(fmt, e, h, inter, group, seed=6)
    topk_w, topk_ids = route(tokens, e, 8 if only is None else min(8, only), seed=tokens, only=only)
    x = torch.randn((tokens, h), device="cuda").half()
    for act in ("gelu_tanh", "gelu", "silu"):
        out = w4.fused_moe(x, w13.w, w13.scales, w2.w, w2.scales, topk_w, topk_ids, fmt, group=group,
                           z13=w13.zeros, z2=w2.zeros, gscale13=w13.gscale, gscale2=w2.gscale, activation=act,
                           path="decode", decode="gemv", block=block)
        assert out.shape == (tokens, h)
        assert rel_err(out, ref_moe(x, w13, w2, topk_w, topk_ids, activation=act)) <= TOL_MOE
    assert {"w4_gemv_" + fmt + "_act", "w4_gemv_" + fmt} <= w4.ran


def test_gemv_moe_agrees_with_the_wmma_decode_on_the_same_alignment(w4):
    from tests.kernels.w4_reference import make_weights, route

    e, h, inter = 128, 2816, 704
    w13 = make_weights("int4", e, 2 * inter, h, 32, seed=7, with_deq=False)
    w2 = make_weights("int4", e, h, inter, 32, seed=8, with_deq=False)
    topk_w, topk_ids = route(4, e, 8, seed=4)
    x = torch.randn((4, h), device="cuda").half()
    outs = [w4.fused_moe(x, w13.w, w13.scales, w2.w, w2.scales, topk_w, topk_ids, "int4", group=32, path="decode",
                         decode=d) for d in ("wmma", "gemv")]
    assert float((outs[0].float() - outs[1].float()).abs().max() / outs[0].float().abs().max()) <= TOL_MOE


@pytest.mark.parametrize("fmt,group", [("int4", 32), ("fp4", 16)])
def test_gemv_entries_are_bit_equal_where_no_atomics_sum(w4, fmt, group):
    """Every GEMV entry runs the same operations per output in the same order (lane segments lane, lane + 32, ...;
    the same word_dot sequence), whatever its rows per warp, chunk width, activation rows per pass or blocks per SM,
    so outputs written without atomics are bit-equal: a linear layer over several chunks (K = 3840, 3 rows) and the
    fused gate_up (act(gate) * up) of the MoE on 26B-A4B shapes. This is what carries the engine runs of c4 (int4)
    and of the default GEMV (fp4 MoE) over to auto's q4 / r1."""
    from tests.kernels.w4_launcher import w4_launcher
    from tests.kernels.w4_reference import make_weights, route

    mod = w4_launcher()
    variants = (None, *_gemv_variants())
    wt = make_weights(fmt, 1, 1536, 3840, group, seed=21, with_deq=False)
    x = torch.randn((3, 3840), device="cuda").half()
    outs = [w4.gemv(x, wt.w[0], wt.scales[0], fmt, k=3840, group=group, gscale=wt.gscale, variant=v) for v in variants]
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    e, h, inter = 128, 2816, 704
    w13 = make_weights(fmt, e, 2 * inter, h, group, seed=22, with_deq=False)
    _topk_w, topk_ids = route(8, e, 8, seed=5)
    x = torch.randn((8, h), device="cuda").half()
    sid, eid, npost = mod.moe_align(topk_ids, mod.GEMV_BLOCK_ROWS, e)
    outs = [w4.gemv(x, w13.w, w13.scales, fmt, k=h, group=group, gscale=w13.gscale, sorted_ids=sid, expert_ids=eid,
                    num_post=npost, num_valid=64, a_div=8, activation="gelu", variant=v) for v in variants]
    assert all(torch.equal(outs[0], o) for o in outs[1:])


@pytest.mark.parametrize("variant", _gemv_variants())
@pytest.mark.parametrize("fmt,group", [("int4", 32), ("int4", 128), ("fp4", 16)])
def test_gemv_candidate_matches_fp32_linear_and_moe(w4, fmt, group, variant):
    """The GEMV candidates ("_c4": 4 weight rows per warp, 1024-wide K chunks, 4 rows per pass; "_q1"/"_r1": 2 rows
    per warp, one row per pass, 1024/2048-wide chunks, four blocks per SM): a linear layer over two K chunks with
    7 rows (two or seven passes), and the MoE with 12 rows in one expert."""
    from tests.kernels.w4_reference import make_weights, ref_linear, ref_moe, rel_err, route

    wt = make_weights(fmt, 1, 72, 1056, group, seed=9)
    x = torch.randn((7, 1056), device="cuda").half()
    out = w4.gemm(x, wt.w[0], wt.scales[0], fmt, k=1056, group=group, gscale=wt.gscale, path="decode", decode="gemv",
                  variant=variant)
    assert rel_err(out, ref_linear(x, wt)) <= TOL_GEMV_LINEAR
    e, h, inter = 128, 256, 704
    w13 = make_weights(fmt, e, 2 * inter, h, group, seed=10)
    w2 = make_weights(fmt, e, h, inter, group, seed=11)
    for tokens, only in ((1, None), (8, None), (12, 8)):
        topk_w, topk_ids = route(tokens, e, 8, seed=tokens, only=only)
        x = torch.randn((tokens, h), device="cuda").half()
        out = w4.fused_moe(x, w13.w, w13.scales, w2.w, w2.scales, topk_w, topk_ids, fmt, group=group,
                           gscale13=w13.gscale, gscale2=w2.gscale, path="decode", decode="gemv", variant=variant)
        assert rel_err(out, ref_moe(x, w13, w2, topk_w, topk_ids)) <= TOL_MOE
    assert {f"w4_gemv_{fmt}_{variant}", f"w4_gemv_{fmt}_act_{variant}"} <= w4.ran


def _near(a, b) -> str:
    """'' when a equals b up to the fp16 rounding of an fp32 sum whose top-k atomics ran in another order, else what
    differs (for the assertion message). One fp16 unit of the larger of the two (the sum can round across a power of
    two), plus 2^-16 of the largest output: where the top-k partials cancel, their reordered fp32 sum differs by
    that much before rounding (the H100 runs of 13:26-13:29 UTC: the same launch twice, 1 output in 11264 off by up
    to 2^-9 at |b| in [2, 4), and by 1.5e-5 near zero with a largest output of 11)."""
    a, b = a.float(), b.float()
    bad = (a - b).abs() > torch.maximum(a.abs(), b.abs()) * 2.0 ** -10 + 2.0 ** -16 * float(b.abs().max())
    if not bool(bad.any()):
        return ""
    return (f"{int(bad.sum())} of {bad.numel()} differ, max |a - b| {float((a - b).abs().max()):.3g} at |b| max "
            f"{float(b.abs().max()):.3g}")


@pytest.mark.parametrize("decode,variant", [("wmma", None), ("gemv", None), ("gemv", "q4"), ("gemv", "r1"),
                                            ("gemv", "c4")])
@pytest.mark.parametrize("fmt,group", [("int4", 32), ("fp4", 16)])
def test_moe_decode_with_spare_row_blocks_past_num_post_equals_the_exact_alignment(w4, fmt, group, decode, variant):
    """sorted_ids with room for every expert's padding past num_post (numel + E x (bm - 1) ids, what vLLM's
    moe_align_block_size allocates from num_experts routed rows up; the spare ids out of range, expert 0 in the spare
    expert_ids): the kernels skip the spare row blocks, so the result is the exact alignment's, on 26B-A4B shapes at
    1 / 4 / 8 tokens (the GEMVs up to the order of their top-k fp32 atomics; the WMMA decode up to its K split, which
    follows the launched row blocks); a second launch on the exact layout bounds what the atomics' order alone
    changes."""
    from tests.kernels.w4_launcher import w4_launcher
    from tests.kernels.w4_reference import make_weights, route

    mod = w4_launcher()
    e, h, inter = 128, 2816, 704
    w13 = make_weights(fmt, e, 2 * inter, h, group, seed=33, with_deq=False)
    w2 = make_weights(fmt, e, h, inter, group, seed=34, with_deq=False)
    bm = mod.align_block("decode", decode)
    for tokens in (1, 4, 8):
        topk_w, topk_ids = route(tokens, e, 8, seed=40 + tokens)
        x = torch.randn((tokens, h), device="cuda").half()
        sid, eid, npost = mod.moe_align(topk_ids, bm, e)
        nv = topk_ids.numel()
        room = nv + e * (bm - 1)
        padded = (torch.cat([sid, sid.new_full((room - sid.numel(),), nv)]),
                  torch.cat([eid, eid.new_zeros((room // bm - eid.numel(),))]), npost)
        outs = [w4.fused_moe(x, w13.w, w13.scales, w2.w, w2.scales, topk_w, topk_ids, fmt, group=group,
                             gscale13=w13.gscale, gscale2=w2.gscale, path="decode", decode=decode, variant=variant,
                             align=a) for a in ((sid, eid, npost), (sid, eid, npost), padded)]
        assert not _near(outs[1], outs[0]), f"{tokens} tokens, exact twice: {_near(outs[1], outs[0])}"
        if decode == "wmma":
            # the WMMA decode splits K by the launched row blocks (pick_split), which the exact layout has fewer of,
            # so its fp32 partial sums group differently: within half an fp16 unit of the largest output
            # (H100, 2026-12-07 13:25 UTC: one of 11264 outputs off by 2^-10 at a largest |output| of 8.2)
            diff, top = (outs[2].float() - outs[0].float()).abs().max(), outs[0].float().abs().max()
            assert float(diff) <= 2.0 ** -11 * float(top), f"{tokens} tokens, padded: {float(diff):.3g} at {float(top):.3g}"
        else:
            assert not _near(outs[2], outs[0]), f"{tokens} tokens, padded: {_near(outs[2], outs[0])}"


def _direct_variants() -> list[str]:
    from tests.kernels.w4_launcher import w4_launcher

    return list(w4_launcher().DIRECT_VARIANTS)


@pytest.mark.parametrize("variant", _direct_variants())
@pytest.mark.parametrize("fmt,group", [("int4", 16), ("int4", 32), ("int4", 128), ("fp4", 16)])
def test_router_direct_moe_matches_fp32(w4, fmt, group, variant):
    """The router-direct MoE decode (gate_up one routed row per block from topk_ids, down with the top-k sum inside
    the block): hidden 256, intermediate 704 (K of down: lanes 22-31 idle) and 1056 (lane 0 takes two segments),
    top-8 / top-2 / top-10 of 128 experts (fewer rows than the block's 8 warps, and more), empty experts, every
    token on the same 8 experts, against float32 over the dequantized weights."""
    from tests.kernels.w4_launcher import w4_launcher
    from tests.kernels.w4_reference import make_weights, ref_moe, rel_err, route

    e, h = 128, 256
    for inter in (704, 1056):
        w13 = make_weights(fmt, e, 2 * inter, h, group, seed=51)
        w2 = make_weights(fmt, e, h, inter, group, seed=52)
        for tokens, top_k, only in ((1, 8, None), (4, 8, None), (8, 8, None), (3, 2, None), (5, 10, None),
                                    (12, 8, 8)):
            if variant.split("+")[1] in w4_launcher().MOE_DOWN_PIPE and (top_k > 8 or inter > 1024):
                continue   # the pipelined tiles take top_k <= 8 and K <= 1024 (the launcher refuses the rest)
            topk_w, topk_ids = route(tokens, e, top_k, seed=60 + tokens, only=only)
            x = torch.randn((tokens, h), device="cuda").half()
            out = w4.fused_moe(x, w13.w, w13.scales, w2.w, w2.scales, topk_w, topk_ids, fmt, group=group,
                               gscale13=w13.gscale, gscale2=w2.gscale, path="decode", decode="gemv", variant=variant,
                               activation="gelu")
            assert out.shape == (tokens, h)
            err = rel_err(out, ref_moe(x, w13, w2, topk_w, topk_ids, activation="gelu"))
            assert err <= TOL_MOE, f"K={inter}, {tokens} tokens, top-{top_k}: {err:.3g}"
    up_variant, tile = variant.split("+")
    assert {f"w4_gemv_{fmt}_act_{up_variant}", f"w4_moe_down_{fmt}_{tile}"} <= w4.ran


@pytest.mark.parametrize("tile,k", [("d8", 2080), ("d16", 2080), ("n16", 2080), ("p8", 992), ("p16", 992),
                                    ("q16", 992), ("f8", 992), ("f16", 992), ("f16", 32)])
@pytest.mark.parametrize("fmt,group", [("int4", 32), ("fp4", 16)])
def test_moe_down_covers_columns_past_the_last_whole_tile(w4, fmt, group, tile, k):
    """w4_moe_down on its own: N = 200 (not a multiple of 16 or 32: the last tile masks its columns) and K = 2080
    (three 1024-wide passes, the last of one segment), or for the tiles that take K <= 1024 992 (31 segments) and 32
    (one segment: one pass takes every column of a flat tile), against float32 of sum_j topk_w[t, j] a[t, j] W[e]^T."""
    from tests.kernels.w4_reference import make_weights, rel_err, route

    e, n, tokens = 16, 200, 3
    w2 = make_weights(fmt, e, n, k, group, seed=53)
    topk_w, topk_ids = route(tokens, e, 4, seed=54)
    a = torch.randn((tokens * 4, k), device="cuda").half()
    out = w4.moe_down(a, w2.w, w2.scales, fmt, k=k, group=group, topk_ids=topk_ids, topk_w=topk_w, gscale=w2.gscale,
                      tile=tile)
    ref = torch.zeros((tokens, n), device="cuda")
    for t in range(tokens):
        for j in range(4):
            ref[t] += float(topk_w[t, j]) * (a[t * 4 + j].float() @ w2.deq[int(topk_ids[t, j])].float().T)
    assert rel_err(out, ref) <= TOL_GEMV_LINEAR


@pytest.mark.parametrize("fmt,group", [("int4", 32), ("fp4", 16)])
def test_router_direct_gate_up_is_bit_equal_to_the_aligned_gemv_and_its_down_is_deterministic(w4, fmt, group):
    """On 26B-A4B shapes at 1 / 4 / 8 tokens: the router-direct gate_up runs the same entry per output as the aligned
    one (only the expert's source differs), so act(gate) * up is bit-equal; its down sums in a fixed order, so two
    launches are bit-equal; and the whole layer equals the aligned q4 / r1 layer up to the fp16 rounding of a
    reordered fp32 sum (_near)."""
    from tests.kernels.w4_launcher import w4_launcher
    from tests.kernels.w4_reference import make_weights, route

    mod = w4_launcher()
    e, h, inter = 128, 2816, 704
    w13 = make_weights(fmt, e, 2 * inter, h, group, seed=55, with_deq=False)
    w2 = make_weights(fmt, e, h, inter, group, seed=56, with_deq=False)
    up_variant = "q4" if fmt == "int4" else "r1"
    for tokens in (1, 4, 8):
        topk_w, topk_ids = route(tokens, e, 8, seed=70 + tokens)
        x = torch.randn((tokens, h), device="cuda").half()
        nv = topk_ids.numel()
        sid, eid, npost = mod.moe_align(topk_ids, mod.GEMV_BLOCK_ROWS, e)
        aligned = w4.gemv(x, w13.w, w13.scales, fmt, k=h, group=group, gscale=w13.gscale, sorted_ids=sid,
                          expert_ids=eid, num_post=npost, num_valid=nv, a_div=8, activation="gelu", variant=up_variant)
        direct = w4.gemv(x, w13.w, w13.scales, fmt, k=h, group=group, gscale=w13.gscale,
                         expert_ids=topk_ids.to(torch.int32).flatten(), num_valid=nv, a_div=8, activation="gelu",
                         block=1, variant=up_variant)
        assert torch.equal(aligned, direct), f"{tokens} tokens"
        for tile in mod.MOE_DOWN_TILES:
            variant = f"{up_variant}+{tile}"
            outs = [w4.fused_moe(x, w13.w, w13.scales, w2.w, w2.scales, topk_w, topk_ids, fmt, group=group,
                                 gscale13=w13.gscale, gscale2=w2.gscale, path="decode", decode="gemv",
                                 variant=v, activation="gelu") for v in (variant, variant, up_variant)]
            assert torch.equal(outs[0], outs[1]), f"{tokens} tokens, {variant}: two launches differ"
            assert not _near(outs[0], outs[2]), f"{tokens} tokens, {variant}: {_near(outs[0], outs[2])}"
