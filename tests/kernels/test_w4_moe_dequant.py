"""CPU tests of the sm70-w4-gemm launcher's dequant MoE prefill (files/sm70_w4_kernels.py moe_dequant): when it is
chosen, and that its gather / padded batched GEMM / weighted scatter computes the MoE block of the float32 oracle.
The one CUDA kernel it launches (w4_dequant_<fmt>) is replaced here by the oracle's own dequantizer, rounded to fp16
as the kernel rounds; the kernel itself is held to the same oracle by the GPU tests."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tests.kernels.w4_launcher import w4_launcher
from tests.kernels.w4_reference import dequant, make_weights, ref_moe, rel_err, route

H, I = 96, 64


def _kernels(mod, monkeypatch, calls):
    k = mod.W4Kernels({}, num_sms=132)

    def fake_dequantize(w, scales, fmt, *, k, group, zeros=None, gscale=None):
        calls.append((fmt, w.shape[0], k))
        return dequant(fmt, w, scales, zeros, gscale, k, group).half()

    monkeypatch.setattr(k, "dequantize", fake_dequantize)
    return k


@pytest.mark.parametrize("fmt,group", [("int4", 32), ("int4zp", 32), ("fp4", 16)])
@pytest.mark.parametrize("scratch_experts", [1, 3, 16])
def test_dequant_prefill_matches_the_float32_moe_block_for_every_chunking(monkeypatch, fmt, group, scratch_experts):
    mod = w4_launcher()
    e, top_k, tokens = 7, 3, 40
    # chunks of `scratch_experts` experts' gate_up weights (the last chunk partial for 3)
    monkeypatch.setattr(mod, "MOE_DEQUANT_SCRATCH", scratch_experts * 2 * I * H * 2)
    monkeypatch.setattr(mod, "MOE_DEQUANT_MIN_ROWS", 1)
    calls: list = []
    k = _kernels(mod, monkeypatch, calls)
    w13 = make_weights(fmt, e, 2 * I, H, group, seed=3, device="cpu")
    w2 = make_weights(fmt, e, H, I, group, seed=4, device="cpu")
    tw, ti = route(tokens, e, top_k, seed=5, device="cpu", only=5)   # experts 5 and 6 stay empty
    x = (torch.randn((tokens, H), generator=torch.Generator().manual_seed(6)) * 0.5).half()
    out = k.fused_moe(x, w13.w, w13.scales, w2.w, w2.scales, tw, ti, fmt, group=group, z13=w13.zeros, z2=w2.zeros,
                      gscale13=w13.gscale, gscale2=w2.gscale, activation="silu", path="prefill", prefill="dequant")
    assert out.dtype == torch.float16 and out.shape == (tokens, H)
    assert rel_err(out, ref_moe(x, w13, w2, tw, ti, activation="silu")) < 5e-3
    chunks = -(-e // min(scratch_experts, e))
    assert len(calls) == 2 * chunks                                # gate_up and down once per chunk of experts
    assert sum(c[1] for c in calls if c[2] == H) == e              # every expert dequantized once per projection


def test_dequant_prefill_gives_a_token_routed_nowhere_zeros_and_runs_no_kernel_for_no_rows(monkeypatch):
    mod = w4_launcher()
    monkeypatch.setattr(mod, "MOE_DEQUANT_MIN_ROWS", 0)
    calls: list = []
    k = _kernels(mod, monkeypatch, calls)
    w13 = make_weights("int4", 2, 2 * I, H, 32, seed=1, device="cpu")
    w2 = make_weights("int4", 2, H, I, 32, seed=2, device="cpu")
    ti = torch.zeros((0, 2), dtype=torch.int32)
    out = k.moe_dequant(torch.zeros((0, H), dtype=torch.float16), w13.w, w13.scales, w2.w, w2.scales,
                        torch.zeros((0, 2)), ti, "int4", group=32)
    assert out.shape == (0, H) and calls == []
    # a routing weight of zero on every row: the output is exactly zero
    tw, ti = route(3, 2, 2, device="cpu")
    x = torch.randn((3, H)).half()
    out = k.moe_dequant(x, w13.w, w13.scales, w2.w, w2.scales, torch.zeros_like(tw), ti, "int4", group=32)
    assert out.abs().max() == 0


def test_moe_prefill_takes_dequant_from_its_row_threshold_unless_wmma_is_asked_for(monkeypatch):
    mod = w4_launcher()
    monkeypatch.delenv(mod.PREFILL_ENV, raising=False)
    n = mod.MOE_DEQUANT_MIN_ROWS
    assert mod.moe_prefill_choice(n) == mod.MOE_PREFILL_DEFAULT
    assert mod.moe_prefill_choice(n, "dequant") == "dequant" and mod.moe_prefill_choice(n - 1, "dequant") == "wmma"
    assert mod.moe_prefill_choice(n, "wmma") == "wmma"
    monkeypatch.setattr(mod, "MOE_PREFILL_DEFAULT", "dequant")
    assert mod.moe_prefill_choice(n) == "dequant" and mod.moe_prefill_choice(n - 1) == "wmma"
    monkeypatch.setenv(mod.PREFILL_ENV, "wmma")
    assert mod.moe_prefill_choice(n) == "wmma" and mod.needs_align("prefill", "int4", n)
    monkeypatch.setenv(mod.PREFILL_ENV, "dequant")
    # the dequant prefill reads topk_ids as they come: no moe_align_block_size layout before it
    assert not mod.needs_align("prefill", "int4", n) and mod.needs_align("prefill", "int4", n - 1)


def test_moe_prefill_keeps_the_wmma_tile_inside_a_cuda_graph_capture(monkeypatch):
    mod = w4_launcher()
    monkeypatch.setenv(mod.PREFILL_ENV, "dequant")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    n = mod.MOE_DEQUANT_MIN_ROWS
    assert mod.moe_prefill_choice(n) == "wmma" and mod.needs_align("prefill", "fp4", n)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert mod.moe_prefill_choice(n) == "dequant"
