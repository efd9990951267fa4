"""GPU tests: the compute_70 PTX (the Volta code path) of the whole family (head dims 64/128/256/512, fp16 and
fp8 KV) against a float32 torch reference.

Skipped without torch CUDA. The PTX comes from $OVERLAY_KERNEL_CACHE when it already
holds a build of sm70-d512-attention (how the H200 run carries it: that machine's CUDA 13
cannot target compute_70), else it is built here with NVRTC 12 from the PyPI wheels.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU with torch CUDA"),
]

TOL = 2e-3
SCALE = 1.0 / math.sqrt(512)
HEAD_DIMS = [64, 128, 256, 512]


@pytest.fixture(scope="module")
def attn(tmp_path_factory):
    from manager.kernels import builder

    from tests.helpers import SHIPPED_OVERLAYS
    from tests.kernels.launcher import d512_launcher

    d512 = d512_launcher()

    env = os.environ.get("OVERLAY_KERNEL_CACHE")
    if env and (Path(env) / "index" / "sm70-d512-attention.json").exists():
        cache = Path(env)
    else:
        from tests.helpers.nvrtc12 import nvrtc12_lib

        cache = tmp_path_factory.mktemp("kcache")
        builder.build(SHIPPED_OVERLAYS, ["sm70-d512-attention"], cache=cache, nvrtc_path=str(nvrtc12_lib()), progress=False)
    d512._loaded.clear()
    a = d512.load(cache=cache, prefer="ptx", overlay_dir=SHIPPED_OVERLAYS / "sm70-d512-attention")
    assert all(o.arch == "compute_70" and o.kind == "ptx" for o in a.k.objects)
    return a


@pytest.mark.parametrize("hd", HEAD_DIMS)
@pytest.mark.parametrize("batch,ctx,hq,hk,bs,window,shared", [
    (1, 1, 8, 8, 16, 0, False),
    (1, 5000, 16, 2, 16, 0, False),
    (4, 2049, 16, 4, 32, 0, True),
    (8, 3000, 32, 16, 16, 700, False),
    (64, 256, 16, 2, 32, 0, False),
])
def test_decode_matches_fp32_reference(attn, hd, batch, ctx, hq, hk, bs, window, shared):
    from tests.kernels.d512_reference import make_paged, ref_decode

    g = torch.Generator().manual_seed(batch * 7 + ctx)
    lens = [ctx] + torch.randint(1, ctx + 1, (batch - 1,), generator=g).tolist()
    case = make_paged(lens, hk, bs, device="cuda", kv_shared=shared, seed=ctx, head_dim=hd)
    q = torch.randn((batch, hq, hd), generator=g).half().cuda()
    scale = 1.0 / math.sqrt(hd)
    out = attn.decode(q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, max(lens), scale,
                      window=window, kv_shared=shared)
    ref = ref_decode(q, case, scale, window)
    assert (out.float() - ref).abs().max().item() <= TOL


@pytest.mark.parametrize("hd", [128, 256, 512])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("shared", [False, True])
def test_fp8_cache_decode_and_prefill_match_the_dequantized_reference(attn, hd, fmt, shared):
    from tests.kernels.d512_reference import make_paged, ref_decode, ref_prefill

    lens = [3000, 700]
    case = make_paged(lens, 2, 16, device="cuda", kv_shared=shared, seed=hd, head_dim=hd, fmt=fmt)
    assert case.k_cache.element_size() == 1
    scale = 1.0 / math.sqrt(hd)
    q = torch.randn((2, 16, hd), device="cuda").half()
    out = attn.decode(q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, 3000, scale, window=512,
                      kv_shared=shared, k_scale=case.k_scale, v_scale=case.v_scale)
    assert (out.float() - ref_decode(q, case, scale, 512)).abs().max().item() <= TOL
    # the same bytes as uint8 with the format named (how a vLLM cache may arrive)
    out8 = attn.decode(q, case.k_cache.view(torch.uint8), case.v_cache.view(torch.uint8), case.block_tables,
                       case.seq_lens, 3000, scale, window=512, kv_shared=shared, k_scale=case.k_scale,
                       v_scale=case.v_scale, kv_format=fmt)
    assert torch.equal(out, out8)
    qp = torch.randn((sum(lens), 16, hd), device="cuda").half()
    cu = [0, 3000, 3700]
    outp = attn.prefill(qp, case.k_cache, case.v_cache, case.block_tables, torch.tensor(cu, device="cuda"),
                        case.seq_lens, 3000, scale, kv_shared=shared, k_scale=case.k_scale, v_scale=case.v_scale)
    assert (outp.float() - ref_prefill(qp, case, cu, scale)).abs().max().item() <= TOL


def test_decode_split_count_does_not_change_the_result(attn):
    from tests.kernels.d512_reference import make_paged

    case = make_paged([4000, 1200], 2, 16, device="cuda", seed=3)
    q = torch.randn((2, 16, 512), device="cuda").half()
    outs = [attn.decode(q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, 4000, SCALE, num_splits=s)
            for s in (1, 3, 16)]
    assert (outs[0].float() - outs[1].float()).abs().max().item() <= TOL
    assert (outs[0].float() - outs[2].float()).abs().max().item() <= TOL


@pytest.mark.parametrize("hd", HEAD_DIMS)
@pytest.mark.parametrize("qlens,ctxs,hq,hk,bs,causal,window,shared", [
    ([37], [0], 16, 2, 16, True, 0, False),
    ([100, 1, 250], [0, 5, 31], 16, 4, 32, True, 0, False),
    ([300, 77], [0, 0], 8, 8, 16, False, 0, False),
    ([600], [0], 16, 16, 16, True, 128, False),
    ([200, 90], [64, 0], 8, 2, 32, True, 0, True),
])
def test_prefill_matches_fp32_reference(attn, hd, qlens, ctxs, hq, hk, bs, causal, window, shared):
    from tests.kernels.d512_reference import make_paged, ref_prefill

    lens = [a + c for a, c in zip(qlens, ctxs)]
    case = make_paged(lens, hk, bs, device="cuda", kv_shared=shared, seed=sum(lens), head_dim=hd)
    cu = [0]
    for a in qlens:
        cu.append(cu[-1] + a)
    q = torch.randn((cu[-1], hq, hd), device="cuda").half()
    scale = 1.0 / math.sqrt(hd)
    out = attn.prefill(q, case.k_cache, case.v_cache, case.block_tables, torch.tensor(cu, device="cuda"),
                       case.seq_lens, max(qlens), scale, causal=causal, window=window, kv_shared=shared)
    ref = ref_prefill(q, case, cu, scale, causal, window)
    assert (out.float() - ref).abs().max().item() <= TOL
