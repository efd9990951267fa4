"""Float32 oracle of the sm70-w4-gemm kernel tests and benchmarks/kernels_w4.py: random packed 4-bit weights in the
checkpoints' layouts, their dequantized float32 values, and the MoE/linear results computed from those.

The packed bits are random (every nibble value occurs), the scales random within a range that keeps fp16 outputs
O(1); the float32 values come from the factory's unpackers (testing.checkpoints), so the oracle and the
kernels share only the layout definition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from testing.checkpoints import dequantize_nvfp4

FORMAT_GROUPS = (("int4", 32), ("int4", 128), ("int4zp", 32), ("int4zp", 128), ("fp4", 16))


@dataclass
class Weights:
    fmt: str
    group: int
    k: int
    w: Any            # int32 [E, N, K/8] or uint8 [E, N, K/2]
    scales: Any       # fp16 or float8_e4m3fn [E, N, G]
    zeros: Any        # int32 [E, ceil(N/8), G] or None
    gscale: Any       # float32 [E] (1 / weight_global_scale) or None
    deq: Any          # float32 [E, N, K]

    def bytes_per_expert(self) -> int:
        z = 0 if self.zeros is None else self.zeros[0].numel() * 4
        return self.w[0].numel() * self.w.element_size() + self.scales[0].numel() * self.scales.element_size() + z


def _unpack_nibbles(words: Any) -> Any:
    """int32 [..., K/8] -> int64 nibbles [..., K] (LSB first)."""
    p = words.to(torch.int64) & 0xFFFFFFFF
    return torch.stack([(p >> (4 * i)) & 0xF for i in range(8)], dim=-1).reshape(*words.shape[:-1], -1)


def make_weights(fmt: str, e: int, n: int, k: int, group: int, seed: int = 0, device: str = "cuda",
                 with_deq: bool = True) -> Weights:
    g = torch.Generator(device=device).manual_seed(seed)
    groups = -(-k // group)
    zeros = gscale = None
    if fmt in ("int4", "int4zp"):
        w = torch.randint(-2**31, 2**31 - 1, (e, n, k // 8), generator=g, device=device, dtype=torch.int64).to(torch.int32)
        scales = (torch.rand((e, n, groups), generator=g, device=device) * 0.01 + 0.004).half()
        if fmt == "int4zp":
            zeros = torch.randint(-2**31, 2**31 - 1, (e, -(-n // 8), groups), generator=g, device=device,
                                  dtype=torch.int64).to(torch.int32)
    elif fmt == "fp4":
        w = torch.randint(0, 256, (e, n, k // 2), generator=g, device=device, dtype=torch.int64).to(torch.uint8)
        scales = (torch.rand((e, n, k // 16), generator=g, device=device) * 3 + 0.5).to(torch.float8_e4m3fn)
        gscale = (torch.rand((e,), generator=g, device=device) * 0.004 + 0.002).float()
    else:
        raise ValueError(fmt)
    deq = dequant(fmt, w, scales, zeros, gscale, k, group) if with_deq else None
    return Weights(fmt, group, k, w, scales, zeros, gscale, deq)


def dequant(fmt: str, w: Any, scales: Any, zeros: Any, gscale: Any, k: int, group: int) -> Any:
    """float32 [E, N, K] from packed experts in the checkpoints' layouts (the factory's unpackers)."""
    if fmt == "fp4":
        return dequantize_nvfp4(w, scales, 1.0 / gscale)
    e, n = w.shape[0], w.shape[1]
    q = _unpack_nibbles(w).float()
    if fmt == "int4zp":
        zn = _unpack_nibbles(zeros.transpose(-1, -2)).transpose(-1, -2)[..., :n, :].float()   # [E, N, G]
    else:
        zn = torch.full((e, n, -(-k // group)), 8.0, device=w.device)
    idx = torch.arange(k, device=w.device) // group
    return (q - zn[..., idx]) * scales.float()[..., idx]


def route(tokens: int, num_experts: int, top_k: int, seed: int = 0, device: str = "cuda",
          only: int | None = None) -> tuple[Any, Any]:
    """(topk_weights float32, topk_ids int32) [tokens, top_k], softmax over random logits; `only`: route to the
    first `only` experts alone (the rest stay empty)."""
    g = torch.Generator(device=device).manual_seed(seed + 1)
    logits = torch.randn((tokens, num_experts), generator=g, device=device)
    if only is not None:
        logits[:, only:] = -1e9
    w, ids = torch.topk(torch.softmax(logits, dim=-1), top_k, dim=-1)
    return (w / w.sum(-1, keepdim=True)).float(), ids.to(torch.int32)


def ref_linear(x: Any, wt: Weights, expert: int = 0) -> Any:
    return x.float() @ wt.deq[expert].t()


def ref_moe(x: Any, w13: Weights, w2: Weights, topk_w: Any, topk_ids: Any, activation: str = "gelu_tanh") -> Any:
    """float32 [M, H]: sum_k topk_w * down(act(gate) * up), over the dequantized weights; the intermediate is rounded
    to fp16 as the kernel path keeps it (the only rounding the oracle repeats)."""
    m, top_k = topk_ids.shape
    xf = x.float()
    out = torch.zeros((m, w2.deq.shape[1]), device=x.device)
    inter = w13.deq.shape[1] // 2
    flat = topk_ids.flatten().long()
    for e in flat.unique().tolist():
        rows = (flat == e).nonzero().flatten()
        tok = rows // top_k
        y = xf[tok] @ w13.deq[e].t()
        gate, up = y[:, :inter].half().float(), y[:, inter:].half().float()
        if activation in ("gelu_tanh", "gelu"):   # "gelu": erf GELU (vLLM's gelu_and_mul)
            act = torch.nn.functional.gelu(gate, approximate="tanh" if activation == "gelu_tanh" else "none")
        else:
            act = torch.nn.functional.silu(gate)
        a = (act * up).half().float()
        out.index_add_(0, tok, (a @ w2.deq[e].t()) * topk_w.flatten()[rows].unsqueeze(1))
    return out


def rel_err(out: Any, ref: Any) -> float:
    """max |out - ref| / max |ref| (a scale-free error: the outputs' magnitude depends on K and the scales)."""
    return float((out.float() - ref).abs().max() / ref.abs().max().clamp(min=1e-6))
