"""Python entry points of the sm70-w4-gemm kernels: fp16 activations x 4-bit weights (W4A16 int4, NVFP4).

The overlay writes this file into vLLM (vllm/model_executor/layers/quantization/sm70_w4_kernels.py); tests and
benchmarks load it from the overlay's files/ by path. The generic part (driver-API loading and launching) is
overlay-manager's `manager.kernels.runtime`, which the serving process finds on sys.path or $OVERLAY_MANAGER_HOME.

    k = load()                                           # built images from the kernel cache, current device
    y = k.linear(x, w, scales, "int4", group=32)         # x [M, K] fp16 -> y [M, N] fp16
    y = k.fused_moe(x, w13, s13, w2, s2, topk_weights, topk_ids, "fp4", gscale13=g13, gscale2=g2)

Weights are the checkpoints' tensors as loaded (no repack), per expert e a row-major [N, K] matrix packed along K:
  "int4"   compressed-tensors pack-quantized, symmetric: int32 [E, N, K/8] (value = nibble - 8), scales fp16 [E, N, G]
  "int4zp" the same with zero points int32 [E, ceil(N/8), G] packed along N
  "fp4"    nvfp4-pack-quantized: uint8 [E, N, K/2], scales float8_e4m3fn [E, N, K/16], gscale float32 [E] =
           1 / weight_global_scale (value = e2m1 * e4m3 * gscale)
K must be a multiple of 32; G = ceil(K / group). torch is imported only when these functions run.

Decode has two kernels: "wmma" (16-row WMMA tiles, split K) and "gemv" (one warp streams whole weight rows, no
tensor cores, activations of up to GEMV_BLOCK_ROWS rows per block; gate_up fused with act(gate) * up). `decode=` on
gemm/linear/fused_moe picks one, else $OVERLAY_W4_DECODE (wmma | gemv | auto), else "auto" (the default since the
H200 engine run of 2026-12-06): per call what the kernel benchmarks measured fastest among the choices the engine
runs kept within the tolerance rule, or that compute bit-equal outputs or the same sums in another fp32 order
(AUTO_DECODE, AUTO_DECODE_ONE, AUTO_DECODE_FEW, AUTO_LINEAR; decode_choice): for MoE steps of up to AUTO_FEW_ROWS
routed rows the router-direct decode (gate_up on the one-row-per-pass GEMV `q4` for int4, `r1` for fp4, straight
from topk_ids; down `w4_moe_down` with the top-k sum in the block: tile `p8` up to AUTO_ONE_ROWS rows, `p16` above),
above that the GEMV `c4` candidate for int4 and the default GEMV for fp4; `c4` for int4 linears of up to
AUTO_LINEAR_MAX_ROWS rows, WMMA for fp4 linears (their GEMV exceeded the rule in the engine), for linears above
AUTO_LINEAR_MAX_ROWS rows and for int4 with zero points (not measured). The MoE alignment block (rows per expert
block of moe_align_block_size) the chosen path wants: align_block(path, decode, fmt).

Prefill of a linear layer has two kernels too: "dequant" (the default from DEQUANT_MIN_ROWS rows: w4_dequant_<fmt>
writes the layer's weight as fp16, N x K x 2 bytes held only for the call, and torch's fp16 GEMM — cuBLAS, tensor
cores on sm_70 — multiplies; vLLM's AWQ linear does the same from 256 rows) and "wmma" (the 64 x 128 WMMA tile on
the packed weights, no extra memory). `prefill=` on linear picks one, else $OVERLAY_W4_PREFILL, else "dequant";
prefill_choice(rows, prefill) says which runs. A MoE prefill of at least MOE_DEQUANT_MIN_ROWS routed rows takes the
same choice (moe_prefill_choice; without either, MOE_PREFILL_DEFAULT): "dequant" runs moe_dequant (the experts'
fp16 weights a chunk at a time, torch's batched fp16 GEMM over each expert's rows padded to the busiest expert's
count), "wmma" the WMMA tile after moe_align_block_size; inside a CUDA graph capture always the tile (moe_dequant
reads the counts on the host).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from manager.errors import BuildError
from manager.kernels.runtime import KernelSet, load_overlay_kernels

OVERLAY_ID = "sm70-w4-gemm"
FORMATS = ("int4", "int4zp", "fp4")
# (rows, columns) of one block's tile per path: BM/BN of the W4_ENTRY lines in csrc/w4_gemm.cu.
TILES = {"decode": (16, 64), "prefill": (64, 128)}
CHUNK_K = {"decode": 128, "prefill": 64}   # BK: a split of K is a multiple of it
# Tile candidates (entry suffix -> path, (BM, BN), BK), int4 and fp4 only; `variant=` on gemm() picks one.
VARIANTS = {"v2": ("decode", (16, 64), 128), "v3": ("decode", (16, 32), 256), "v4": ("decode", (16, 16), 512),
            "v5": ("decode", (16, 64), 256), "v6": ("decode", (16, 64), 256),
            "p2": ("prefill", (64, 128), 64), "p3": ("prefill", (64, 128), 64)}
# Split K on the decode path until the grid holds about this many blocks per multiprocessor.
DECODE_BLOCKS_PER_SM = 4
# Up to this many routed (token, expert) rows per expert on average the 16-row decode tile is used.
DECODE_MAX_ROWS_PER_EXPERT = 16
ACTIVATIONS = ("gelu", "gelu_tanh", "silu")
DECODE_KERNELS = ("wmma", "gemv", "auto")
DECODE_ENV = "OVERLAY_W4_DECODE"
# The GEMV entries (W4_GEMV_ENTRY in csrc/w4_gemm.cu): rows staged per pass, weight rows per block (8 warps x 2),
# and the act codes of the fused gate_up epilogue.
GEMV_BLOCK_ROWS = 8
GEMV_ROWS_PER_BLOCK = 16
GEMV_MAX_BLOCK = 64   # s_rows in the kernel: the largest alignment block it takes
GEMV_ACT = {"silu": 1, "gelu": 2, "gelu_tanh": 3}
# GEMV candidates (entry suffix -> weight rows per block), int4 and fp4: "c4" = 4 rows per warp, 1024-wide K chunks;
# "q1" / "r1" = 2 rows per warp, 1024- / 2048-wide chunks, one activation row per pass, 4 blocks per SM (64 registers);
# "q4" = 4 rows per warp, 1024-wide chunks, one row per pass, 3 blocks per SM (80 registers).
GEMV_VARIANTS = {"c4": 32, "q1": 16, "r1": 16, "q4": 32}
# The router-direct MoE decode, fused_moe(variant="<GEMV variant>+<down tile>", e.g. "q4+d16"): gate_up runs the GEMV
# variant with one routed row per block, its expert read from topk_ids (no moe_align_block_size layout at all); down
# runs w4_moe_down_<fmt>_<tile>: block (token, tile columns), the token's top-k rows summed inside the block in a
# fixed order, fp16 out (no fp32 buffer, no atomics, no conversion launch). int4 and fp4.
# Tiles (output columns per block; the kernel's columns in flight per warp and blocks per SM are in the entry lines):
# d8 / d16 four columns in flight at three blocks per SM (fp4 d8: eight at two), n16 two at four.
MOE_DOWN_TILES = {"d8": 8, "d16": 16, "n16": 16, "p8": 8, "p16": 16, "q16": 16, "f8": 8, "f16": 16}
# Tiles that hold one routed row per warp and a row's K in one pass of 32 segments, so top_k <= 8 and K <= 1024
# (26B-A4B's down: top-8, K = 704): the pipelined ones (w4_moe_down_pipe: the next column group loads while the current
# one is reduced; one 32-value segment per lane) and the flat ones (w4_moe_down_flat: the tile's columns x segments
# spread over all 32 lanes, so no lane idles at K = 704). moe_direct runs the unpipelined tile of the same width
# (MOE_DOWN_PIPE's value) for other shapes.
MOE_DOWN_PIPE = {"p8": "d8", "p16": "n16", "q16": "n16", "f8": "d8", "f16": "n16"}


def pipe_takes(top_k: int, k: int) -> bool:
    """Whether the pipelined and flat down tiles (MOE_DOWN_PIPE) take this shape: top_k <= 8 and K <= 1024."""
    return top_k <= 8 and k <= 1024


DIRECT_VARIANTS = tuple(f"{v}+{d}" for v in GEMV_VARIANTS for d in MOE_DOWN_TILES)
# decode="auto": (kernel, GEMV variant) per format, from benchmarks/kernels_w4.py --only-decode on an H100
# (docs/kernels.md, "Ninth lease": MoE 1/4/8 tokens on 26B-A4B shapes, linear 3840 -> 15360 at M = 1/4/8). int4: c4
# 1.30-1.48x the WMMA decode (MoE), 1.25-2.16x (linear M <= 4); fp4: the default GEMV 1.00-1.30x (MoE), 1.10-1.78x
# (linear M <= 4); linears at M = 8 are 0.63-0.76x on either GEMV, so they stay on WMMA; int4zp was not measured.
AUTO_DECODE = {"int4": ("gemv", "c4"), "fp4": ("gemv", None), "int4zp": ("wmma", None)}
# MoE steps of up to AUTO_FEW_ROWS routed rows (tokens x top_k; 8 tokens of 26B-A4B's top-8): the one-row-per-pass
# GEMVs, measured on an H100 on 2026-12-07 (docs/kernels.md, "Eleventh lease"; same run as c4 and the default GEMV,
# MoE 1/4/8 tokens on 26B-A4B shapes): int4 q1 0.87/0.95/0.98x c4's time (g32), fp4 r1 0.85/0.82/0.80x the default
# GEMV's. An expert block of r rows streams its weights r times (from L2 on the H100), so more routed rows keep
# AUTO_DECODE. int4 then moved to q4 (docs/kernels.md, "Thirteenth lease", H100, 8 MoE layers in one CUDA graph):
# 0.94/0.97/0.95x q1's time at 1/4/8 tokens (g32; g128 0.96/0.97/0.94x); fp4 q4 loses to r1, so fp4 keeps r1.
# Their outputs are bit-equal to c4's and the default GEMV's (GPU test), whose engine runs stayed within the rule.
# Then the router-direct decode (docs/kernels.md, "Fifteenth lease", H100, 8 MoE layers in one CUDA graph, g32; its
# pipelined down tiles, 17:00 UTC): int4 q4+p8 0.82x q4's time at 1 token, q4+p16 0.82 / 0.81x at 4 / 8; fp4 r1+p8
# 0.82x r1's at 1 token, r1+p16 0.80 / 0.77x at 4 / 8. Its gate_up is bit-equal to the aligned one, its down the same
# sums in one fixed fp32 order (GPU tests: equal to the aligned layer up to the fp16 rounding of a reordered fp32 sum,
# and deterministic).
AUTO_DECODE_FEW = {"int4": ("gemv", "q4+p16"), "fp4": ("gemv", "r1+p16")}
AUTO_FEW_ROWS = 64
AUTO_DECODE_ONE = {"int4": ("gemv", "q4+p8"), "fp4": ("gemv", "r1+p8")}
AUTO_ONE_ROWS = 8   # one token of a top-8 router
# Linears (no sorted_ids) of up to AUTO_LINEAR_MAX_ROWS rows. fp4 stays on WMMA: in the H200 engine run of 2026-12-06
# (engine_gpu.py phase w, docs/kernels.md "Tenth lease") the ct-nvfp4-dense checkpoint with fp4 GEMV linears had a
# teacher-forced max error of 0.309 against 0.278 allowed (WMMA: 0.230); its fp16 partial sums of 4 products are
# the suspect (not isolated). int4 GEMV linears stayed within (ct-w4a16-dense: 0.088 of 0.122).
AUTO_LINEAR = {"int4": ("gemv", "c4"), "fp4": ("wmma", None), "int4zp": ("wmma", None)}
AUTO_LINEAR_MAX_ROWS = 4
DECODE_DEFAULT = "auto"
PREFILL_KERNELS = ("dequant", "wmma")
PREFILL_ENV = "OVERLAY_W4_PREFILL"
# From this many rows a linear prefill dequantizes the weight and runs the fp16 GEMM (vLLM's AWQ threshold,
# awq.py FP16_MATMUL_HEURISTIC_CONDITION: 256 tokens); benchmarks/kernels_w4.py measures both kernels around it.
DEQUANT_MIN_ROWS = 256
DEQUANT_THREADS = 256
# A MoE prefill of at least MOE_DEQUANT_MIN_ROWS routed rows (tokens x top_k) takes "dequant" too (moe_dequant): the
# experts' weights dequantized to fp16 a chunk of experts at a time (at most MOE_DEQUANT_SCRATCH bytes of gate_up or
# down weights live at once, transient), each expert's routed rows gathered into a batch padded to the busiest
# expert's count, and torch's batched fp16 GEMM (cuBLAS, tensor cores on sm_70) multiplies. Reading the routing's
# counts is one host synchronization, so a launch inside a CUDA graph capture keeps the WMMA tile.
MOE_DEQUANT_MIN_ROWS = 4096
MOE_DEQUANT_SCRATCH = 256 << 20
# The MoE prefill kernel without `prefill=` or $OVERLAY_W4_PREFILL: the WMMA tile until a GPU run has timed
# moe_dequant against it (benchmarks/kernels_w4.py --only-moe-prefill).
MOE_PREFILL_DEFAULT = "wmma"
_lock = threading.Lock()
_loaded: dict[tuple, "W4Kernels"] = {}


def moe_align(topk_ids: Any, block: int, num_experts: int) -> tuple[Any, Any, Any]:
    """vLLM's moe_align_block_size layout in torch: (sorted_ids, expert_ids, num_post) int32 on topk_ids' device.

    Each expert's (token, k) ids, padded with numel to a multiple of `block`; expert_ids names the expert of
    every block; num_post = the padded total ([1] tensor). vLLM's own op gives the same layout (with extra
    padding blocks past num_post, which the kernels skip); this fallback needs one host sync.
    """
    import torch

    flat = topk_ids.flatten().to(torch.int64)
    numel = flat.numel()
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block - 1) // block * block
    cnt_off = torch.cumsum(counts, 0) - counts
    pad_off = torch.cumsum(padded, 0) - padded
    total = int(padded.sum().item())
    order = torch.argsort(flat, stable=True)
    se = flat[order]
    dst = pad_off[se] + (torch.arange(numel, device=flat.device) - cnt_off[se])
    sorted_ids = torch.full((max(total, block),), numel, dtype=torch.int32, device=flat.device)
    sorted_ids[dst] = order.to(torch.int32)
    expert_ids = torch.repeat_interleave(torch.arange(num_experts, device=flat.device, dtype=torch.int32),
                                         (padded // block).to(torch.int64))
    if expert_ids.numel() == 0:
        expert_ids = torch.full((1,), -1, dtype=torch.int32, device=flat.device)
    num_post = torch.tensor([total], dtype=torch.int32, device=flat.device)
    return sorted_ids, expert_ids, num_post


def decode_kernel(decode: str | None = None) -> str:
    """The decode kernel: `decode`, else $OVERLAY_W4_DECODE, else DECODE_DEFAULT; BuildError for another name."""
    name = decode or os.environ.get(DECODE_ENV) or DECODE_DEFAULT
    if name not in DECODE_KERNELS:
        raise BuildError(f"decode kernel {name!r} (${DECODE_ENV} or decode=): expected one of "
                         f"{', '.join(DECODE_KERNELS)}")
    return name


def decode_choice(decode: str | None, fmt: str, rows: int | None = None, moe: bool = True) -> tuple[str, str | None]:
    """(kernel, GEMV variant) a decode-path launch runs: decode_kernel(decode), with "auto" resolved by AUTO_DECODE
    (MoE; AUTO_DECODE_ONE / AUTO_DECODE_FEW for up to AUTO_ONE_ROWS / AUTO_FEW_ROWS routed `rows`) or AUTO_LINEAR
    (a linear layer; more than AUTO_LINEAR_MAX_ROWS `rows` stay on WMMA) for `fmt`."""
    name = decode_kernel(decode)
    if name != "auto":
        return name, None
    if not moe:
        if rows is not None and rows > AUTO_LINEAR_MAX_ROWS:
            return "wmma", None
        return AUTO_LINEAR.get(fmt, ("wmma", None))
    if rows is not None and rows <= AUTO_ONE_ROWS and fmt in AUTO_DECODE_ONE:
        return AUTO_DECODE_ONE[fmt]
    if rows is not None and rows <= AUTO_FEW_ROWS and fmt in AUTO_DECODE_FEW:
        return AUTO_DECODE_FEW[fmt]
    return AUTO_DECODE.get(fmt, ("wmma", None))


def needs_align(path: str, fmt: str, rows: int, decode: str | None = None, prefill: str | None = None) -> bool:
    """Whether a MoE launch of `rows` routed rows on `path` reads moe_align_block_size's layout: every choice but a
    router-direct decode (a DIRECT_VARIANTS GEMV) and a "dequant" prefill (moe_prefill_choice), which take topk_ids
    as they come from the router."""
    if path != "decode":
        return moe_prefill_choice(rows, prefill) != "dequant"
    kernel, variant = decode_choice(decode, fmt, rows)
    return not (kernel == "gemv" and variant in DIRECT_VARIANTS)


def prefill_kernel(prefill: str | None = None, default: str = "dequant") -> str:
    """The prefill kernel: `prefill`, else $OVERLAY_W4_PREFILL, else `default` (a linear's "dequant", a MoE's
    MOE_PREFILL_DEFAULT); BuildError for another name."""
    name = prefill or os.environ.get(PREFILL_ENV) or default
    if name not in PREFILL_KERNELS:
        raise BuildError(f"prefill kernel {name!r} (${PREFILL_ENV} or prefill=): expected one of "
                         f"{', '.join(PREFILL_KERNELS)}")
    return name


def prefill_choice(rows: int, prefill: str | None = None) -> str:
    """What a prefill-path linear launch of `rows` rows runs: "dequant" (fp16 weight + torch GEMM) from
    DEQUANT_MIN_ROWS rows when prefill_kernel(prefill) is "dequant", else "wmma"."""
    kernel = prefill_kernel(prefill)
    return "dequant" if kernel == "dequant" and rows >= DEQUANT_MIN_ROWS else "wmma"


def moe_prefill_choice(rows: int, prefill: str | None = None) -> str:
    """What a prefill-path MoE launch of `rows` routed rows runs: "dequant" (moe_dequant) from MOE_DEQUANT_MIN_ROWS
    rows when `prefill`, else $OVERLAY_W4_PREFILL, else MOE_PREFILL_DEFAULT is "dequant" and no CUDA graph is being
    captured, else "wmma"."""
    kernel = prefill_kernel(prefill, MOE_PREFILL_DEFAULT)
    if kernel != "dequant" or rows < MOE_DEQUANT_MIN_ROWS:
        return "wmma"
    import torch

    capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    return "wmma" if capturing else "dequant"


def align_block(path: str, decode: str | None = None, fmt: str | None = None) -> int:
    """Rows per expert block of moe_align_block_size for `path` ("decode" | "prefill") with the chosen decode kernel
    (for "auto", `fmt`'s choice; without `fmt` the WMMA tile's rows, which the GEMV kernels take as well)."""
    if path == "decode":
        kernel = decode_kernel(decode)
        if kernel == "auto":
            kernel = decode_choice(decode, fmt)[0] if fmt is not None else "wmma"
        if kernel == "gemv":
            return GEMV_BLOCK_ROWS
    return TILES[path][0]


def decode_block_rows(decode: str | None = None) -> int:
    """Rows per expert block the decode path wants: align_block("decode", decode) (the name benchmarks ask for)."""
    return align_block("decode", decode)


def pick_path(tokens: int, top_k: int, experts: int) -> str:
    """The MoE path for a batch: the 16-row decode tile while the routed rows stay few per expert."""
    return "decode" if tokens * top_k <= DECODE_MAX_ROWS_PER_EXPERT * experts // 8 else "prefill"


def _row_blocks(x: Any, sorted_ids: Any, num_valid: int | None, bm: int) -> tuple[int, int]:
    """(num_valid, row blocks of bm rows): x's rows without sorted_ids, else sorted_ids' blocks."""
    if sorted_ids is None:
        num_valid = x.shape[0] if num_valid is None else num_valid
        return num_valid, (num_valid + bm - 1) // bm
    if num_valid is None:
        raise BuildError("num_valid (tokens x top_k) is required with sorted_ids")
    return num_valid, sorted_ids.numel() // bm


def _check(x: Any, w: Any, scales: Any, fmt: str, k: int, group: int, zeros: Any = None,
           gscale: Any = None) -> tuple[int, int]:
    """(experts, N) of the packed weight, or BuildError naming the problem."""
    import torch

    if fmt not in FORMATS:
        raise BuildError(f"weight format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if fmt == "int4zp" and zeros is None:
        raise BuildError("int4zp needs zero points")
    if fmt == "fp4" and gscale is None:
        raise BuildError("fp4 needs the per-expert global scale (1 / weight_global_scale)")
    if x.dtype != torch.float16 or x.stride(-1) != 1 or x.stride(0) % 8:
        raise BuildError("activations must be fp16 with a contiguous last dim and 16-byte aligned rows")
    if k % 32:
        raise BuildError(f"K={k}: the kernels need a multiple of 32")
    if fmt == "fp4" and group != 16:
        raise BuildError(f"NVFP4 groups are 16 wide, got group {group}")
    if group % 16 or group <= 0:
        raise BuildError(f"group {group}: expected a positive multiple of 16")
    if w.dim() == 2:
        w = w.unsqueeze(0)
    row_bytes = w.shape[-1] * w.element_size()
    if row_bytes != k // 2 or not w.is_contiguous():
        raise BuildError(f"packed weight {tuple(w.shape)} {w.dtype}: expected contiguous rows of K/2 = {k // 2} bytes")
    g = (k + group - 1) // group
    if scales.shape[-1] != g or not scales.is_contiguous():
        raise BuildError(f"scales {tuple(scales.shape)}: expected contiguous [..., {g}] (K={k}, group {group})")
    want = torch.float8_e4m3fn if fmt == "fp4" else torch.float16
    if scales.dtype != want:
        raise BuildError(f"scales are {scales.dtype}, the {fmt} kernels read {want}")
    return w.shape[0], w.shape[1]


class W4Kernels:
    def __init__(self, kernels: KernelSet, num_sms: int = 132):
        self.k = kernels
        self.num_sms = num_sms
        self.ran: set[str] = set()

    def pick_split(self, path: str, k: int, blocks: int, bk: int | None = None) -> int:
        """K columns per block: all of K on the prefill path; on the decode path split K (in BK chunks) until the
        grid holds ~DECODE_BLOCKS_PER_SM blocks per multiprocessor (a decode step activates few experts)."""
        bk = bk or CHUNK_K[path]
        chunks = (k + bk - 1) // bk
        if path != "decode" or blocks <= 0:
            return chunks * bk
        splits = max(1, min(chunks, (self.num_sms * DECODE_BLOCKS_PER_SM + blocks - 1) // blocks))
        return (chunks + splits - 1) // splits * bk

    def gemm(self, x: Any, w: Any, scales: Any, fmt: str, *, k: int, group: int, zeros: Any = None,
             gscale: Any = None, sorted_ids: Any = None, expert_ids: Any = None, num_post: Any = None,
             topk_w: Any = None, num_valid: int | None = None, a_div: int = 1, path: str = "prefill",
             out: Any = None, out_div: int | None = None, active_blocks: int | None = None,
             variant: str | None = None, decode: str | None = None, block: int | None = None) -> Any:
        """One launch: out[t, n] = sum_k x[row(t), k] * W[e(t)][n, k] (see csrc/w4_gemm.cu for row(t), e(t)).

        out_div (e.g. top_k for the down projection): the fp32 sum over t // out_div, returned as [rows, N] fp16.
        The decode path splits K (fp32 atomics into a zeroed buffer) when the grid would be small;
        active_blocks: the expected non-empty row blocks (default min(rows, experts) with sorted_ids).
        decode: the decode kernel (see decode_kernel); with "gemv" the launch is gemv() (block: rows per block of
        sorted_ids, default align_block("decode", "gemv"))."""
        import torch

        if path == "decode" and (variant is None or variant in GEMV_VARIANTS):
            rows = x.shape[0] if sorted_ids is None else num_valid
            kernel, auto_variant = decode_choice(decode, fmt, rows, moe=sorted_ids is not None)
            if kernel == "gemv":
                variant = variant or auto_variant
                return self.gemv(x, w, scales, fmt, k=k, group=group, zeros=zeros, gscale=gscale,
                                 sorted_ids=sorted_ids, expert_ids=expert_ids, num_post=num_post, topk_w=topk_w,
                                 num_valid=num_valid, a_div=a_div, out_div=out_div, block=block, variant=variant)

        _e, n = _check(x, w, scales, fmt, k, group, zeros, gscale)
        bm, bn = TILES[path]
        bk = CHUNK_K[path]
        if variant:
            path, (bm, bn), bk = VARIANTS[variant]
        num_valid, m_blocks = _row_blocks(x, sorted_ids, num_valid, bm)
        n_tiles = (n + bn - 1) // bn
        if active_blocks is None:
            active_blocks = m_blocks if sorted_ids is None else min(m_blocks, num_valid, _e)
        k_split = self.pick_split(path, k, active_blocks * n_tiles, bk)
        splits = (k + k_split - 1) // k_split
        out32 = None
        if splits > 1 or out_div is not None:
            rows = num_valid if out_div is None else (num_valid + out_div - 1) // out_div
            out32 = torch.zeros((rows, n), dtype=torch.float32, device=x.device)
        elif out is None:
            out = torch.empty((num_valid, n), dtype=torch.float16, device=x.device)
        name = f"w4_gemm_{fmt}_{path}" + (f"_{variant}" if variant else "")
        scales_arg = scales.view(torch.uint8) if fmt == "fp4" else scales
        if m_blocks and n:
            self.k[name].launch((m_blocks, n_tiles, splits), [
                out, x, w, scales_arg, zeros, gscale, sorted_ids, expert_ids, num_post, topk_w,
                num_valid, a_div, n, k, group, x.stride(0), out32, out_div or 1, k_split])
            self.ran.add(name)
        return out if out32 is None else out32.half()

    def gemv(self, x: Any, w: Any, scales: Any, fmt: str, *, k: int, group: int, zeros: Any = None,
             gscale: Any = None, sorted_ids: Any = None, expert_ids: Any = None, num_post: Any = None,
             topk_w: Any = None, num_valid: int | None = None, a_div: int = 1, out_div: int | None = None,
             activation: str | None = None, block: int | None = None, variant: str | None = None) -> Any:
        """The GEMV decode launch (w4_gemv_<fmt>[_act]): the rows of block b are sorted_ids[b*block, (b+1)*block)
        (or x's rows b*block.. without sorted_ids), `block` default GEMV_BLOCK_ROWS. With `activation` the weight
        holds 2I rows (gate then up) and the result is act(gate) * up, [rows, I] fp16; with out_div the fp32 sum over
        t // out_div of (topk_w[t] times) the rows, returned fp16; else [rows, N] fp16. variant: a GEMV_VARIANTS
        candidate (int4, fp4)."""
        import torch

        _e, n = _check(x, w, scales, fmt, k, group, zeros, gscale)
        bm = block or GEMV_BLOCK_ROWS
        if not 0 < bm <= GEMV_MAX_BLOCK:
            raise BuildError(f"block {bm}: the GEMV kernels take 1..{GEMV_MAX_BLOCK} rows per block")
        if activation is not None and (activation not in GEMV_ACT or n % 2 or out_div is not None):
            raise BuildError(f"activation {activation!r}: expected one of {', '.join(GEMV_ACT)} on an even row count")
        num_valid, m_blocks = _row_blocks(x, sorted_ids, num_valid, bm)
        if variant is not None and (variant not in GEMV_VARIANTS or fmt == "int4zp"):
            raise BuildError(f"GEMV variant {variant!r} for {fmt}: expected one of {', '.join(GEMV_VARIANTS)} "
                             "(int4, fp4)")
        rows = GEMV_VARIANTS[variant] if variant else GEMV_ROWS_PER_BLOCK
        n_out = n // 2 if activation else n
        per_block = rows // 2 if activation else rows
        out = out32 = None
        if out_div is not None:
            out32 = torch.zeros(((num_valid + out_div - 1) // out_div, n), dtype=torch.float32, device=x.device)
        else:
            out = torch.empty((num_valid, n_out), dtype=torch.float16, device=x.device)
        name = f"w4_gemv_{fmt}" + ("_act" if activation else "") + (f"_{variant}" if variant else "")
        scales_arg = scales.view(torch.uint8) if fmt == "fp4" else scales
        if m_blocks and n_out:
            self.k[name].launch((m_blocks, (n_out + per_block - 1) // per_block, 1), [
                out, x, w, scales_arg, zeros, gscale, sorted_ids, expert_ids, num_post, topk_w,
                num_valid, a_div, n, k, group, x.stride(0), out32, out_div or 1, GEMV_ACT.get(activation or "", 0),
                bm])
            self.ran.add(name)
        return out if out32 is None else out32.half()

    def moe_down(self, a: Any, w: Any, scales: Any, fmt: str, *, k: int, group: int, topk_ids: Any, topk_w: Any,
                 gscale: Any = None, tile: str = "d16") -> Any:
        """The MoE decode's down projection with the top-k sum in one launch (w4_moe_down_<fmt>_<tile>):
        out[t, n] = sum over j < top_k of topk_w[t, j] x (a[t * top_k + j] . W[topk_ids[t, j]][n]), [tokens, N] fp16.
        a: [tokens x top_k, K] fp16 (gate_up's output rows in routed order); int4 and fp4."""
        import torch

        if tile not in MOE_DOWN_TILES or fmt not in ("int4", "fp4"):
            raise BuildError(f"down tile {tile!r} for {fmt}: expected one of {', '.join(MOE_DOWN_TILES)} (int4, fp4)")
        _e, n = _check(a, w, scales, fmt, k, group, None, gscale)
        if topk_ids.dim() != 2 or topk_w.shape != topk_ids.shape or a.shape[0] != topk_ids.numel():
            raise BuildError(f"topk_ids {tuple(topk_ids.shape)}, topk_w {tuple(topk_w.shape)}, rows {a.shape[0]}: "
                             "expected [tokens, top_k] both, and tokens x top_k rows")
        m, top_k = topk_ids.shape
        if tile in MOE_DOWN_PIPE and not pipe_takes(top_k, k):
            raise BuildError(f"down tile {tile!r}: top_k {top_k} and K {k}; the pipelined and flat tiles take "
                             "top_k <= 8 and K <= 1024")
        ids = topk_ids.to(torch.int32).contiguous()
        tw = topk_w.float().contiguous()
        out = torch.empty((m, n), dtype=torch.float16, device=a.device)
        name = f"w4_moe_down_{fmt}_{tile}"
        scales_arg = scales.view(torch.uint8) if fmt == "fp4" else scales
        dt = MOE_DOWN_TILES[tile]
        if m and n:
            self.k[name].launch((m, (n + dt - 1) // dt, 1), [
                out, a, w, scales_arg, None, gscale, ids, tw, top_k, n, k, group, a.stride(0)])
            self.ran.add(name)
        return out

    def moe_direct(self, x: Any, w13: Any, s13: Any, w2: Any, s2: Any, topk_weights: Any, topk_ids: Any, fmt: str,
                   *, group: int, variant: str, gscale13: Any = None, gscale2: Any = None,
                   activation: str = "gelu_tanh") -> Any:
        """The router-direct MoE decode (DIRECT_VARIANTS): gate_up as GEMV `variant`'s first half with one routed row
        per block and expert_ids = topk_ids, then moe_down with the second half's tile. Two launches."""
        import torch

        if variant not in DIRECT_VARIANTS:
            raise BuildError(f"router-direct variant {variant!r}: expected one of {', '.join(DIRECT_VARIANTS)}")
        up_variant, tile = variant.split("+")
        ids = topk_ids.to(torch.int32).contiguous()
        a = self.direct_gate_up(x, w13, s13, fmt, group=group, topk_ids=ids, gscale=gscale13, activation=activation,
                                variant=up_variant)
        if tile in MOE_DOWN_PIPE and not pipe_takes(ids.shape[1], a.shape[1]):
            tile = MOE_DOWN_PIPE[tile]
        return self.moe_down(a, w2, s2, fmt, k=a.shape[1], group=group, topk_ids=ids, topk_w=topk_weights,
                             gscale=gscale2, tile=tile)

    def direct_gate_up(self, x: Any, w13: Any, s13: Any, fmt: str, *, group: int, topk_ids: Any, gscale: Any = None,
                       activation: str = "gelu_tanh", variant: str | None = None) -> Any:
        """The router-direct gate_up: act(gate) * up [tokens x top_k, I] fp16 from GEMV `variant` with one routed row
        per block, its expert read from topk_ids (int32 [tokens, top_k], contiguous; no alignment)."""
        m, top_k = topk_ids.shape
        return self.gemv(x, w13, s13, fmt, k=x.shape[1], group=group, gscale=gscale, expert_ids=topk_ids.view(-1),
                         num_valid=m * top_k, a_div=top_k, activation=activation, block=1, variant=variant)

    def dequantize(self, w: Any, scales: Any, fmt: str, *, k: int, group: int, zeros: Any = None,
                   gscale: Any = None) -> Any:
        """The weight as fp16, w's leading shape + [K]: [N, K] for a linear layer, [E, N, K] for experts (each value
        rounded once from the exact product, as the checkpoints' dequantized reference before its fp16 cast)."""
        import torch

        probe = torch.empty((1, k), dtype=torch.float16, device=w.device)
        e, n = _check(probe, w, scales, fmt, k, group, zeros, gscale)
        out = torch.empty((*w.shape[:-1], k), dtype=torch.float16, device=w.device)
        vecs = n * (k // 32)
        name = f"w4_dequant_{fmt}"
        scales_arg = scales.view(torch.uint8) if fmt == "fp4" else scales
        if vecs and e:
            self.k[name].launch(((vecs + DEQUANT_THREADS - 1) // DEQUANT_THREADS, e, 1),
                                [out, w, scales_arg, zeros, gscale, n, k, group])
            self.ran.add(name)
        return out

    def linear(self, x: Any, w: Any, scales: Any, fmt: str, *, group: int, zeros: Any = None, gscale: Any = None,
               path: str | None = None, decode: str | None = None, prefill: str | None = None) -> Any:
        """A dense layer: x [M, K] fp16, w [N, K/8] int32 or [N, K/2] uint8 -> [M, N] fp16. On the prefill path
        from DEQUANT_MIN_ROWS rows (prefill_choice) the weight is dequantized to fp16 for the call and multiplied by
        torch's fp16 GEMM."""
        import torch

        k = x.shape[-1]
        path = path or ("decode" if x.shape[0] <= TILES["decode"][0] else "prefill")
        if path == "prefill" and prefill_choice(x.shape[0], prefill) == "dequant":
            _check(x, w, scales, fmt, k, group, zeros, gscale)
            wd = self.dequantize(w, scales, fmt, k=k, group=group, zeros=zeros, gscale=gscale)
            return torch.nn.functional.linear(x, wd.reshape(-1, k))
        return self.gemm(x, w, scales, fmt, k=k, group=group, zeros=zeros, gscale=gscale, path=path, decode=decode)

    def moe_dequant(self, x: Any, w13: Any, s13: Any, w2: Any, s2: Any, topk_weights: Any, topk_ids: Any,
                    fmt: str, *, group: int, z13: Any = None, z2: Any = None, gscale13: Any = None,
                    gscale2: Any = None, activation: str = "gelu_tanh") -> Any:
        """The MoE block (fused_moe's arguments) through fp16 weights and torch's batched GEMM: routed row r of
        expert e goes to slot (e, i) of a [E, C, H] batch, C the busiest expert's row count (one host read of the
        counts), padding rows pointing at a zero row; per chunk of experts (at most MOE_DEQUANT_SCRATCH bytes of
        dequantized weights live at once) gate_up = bmm(batch, W13ᵀ), act(gate) * up in fp16, down = bmm(that, W2ᵀ),
        times the routing weight in fp32 and summed per token (index_add_). fp16 [M, H]."""
        import torch

        m, h = x.shape
        top_k = topk_ids.shape[1]
        e, n13 = w13.shape[0], w13.shape[1]
        inter = n13 // 2
        _check(x, w13, s13, fmt, h, group, z13, gscale13)
        flat = topk_ids.reshape(-1).long()
        counts = torch.bincount(flat, minlength=e)
        cap = int(counts.max()) if flat.numel() else 0   # the host synchronization
        out = torch.zeros((m + 1, h), dtype=torch.float32, device=x.device)
        if cap == 0:
            return out[:m].half()
        order = torch.argsort(flat, stable=True)
        starts = torch.cumsum(counts, 0) - counts
        ex = flat[order]
        slot = ex * cap + torch.arange(flat.numel(), device=x.device) - starts[ex]
        tok = torch.full((e * cap,), m, dtype=torch.long, device=x.device)   # row m: the zero row
        tok[slot] = torch.div(order, top_k, rounding_mode="floor")
        wt = torch.zeros((e * cap, 1), dtype=torch.float32, device=x.device)
        wt[slot, 0] = topk_weights.reshape(-1).float()[order]
        xz = torch.cat([x, x.new_zeros((1, h))])
        chunk = max(1, MOE_DEQUANT_SCRATCH // (n13 * h * 2))

        def part(t: Any, e0: int, e1: int) -> Any:
            return None if t is None else t[e0:e1]

        for e0 in range(0, e, chunk):
            e1 = min(e, e0 + chunk)
            rows = slice(e0 * cap, e1 * cap)
            wd = self.dequantize(w13[e0:e1], s13[e0:e1], fmt, k=h, group=group, zeros=part(z13, e0, e1),
                                 gscale=part(gscale13, e0, e1))
            y = torch.bmm(xz[tok[rows]].view(e1 - e0, cap, h), wd.transpose(1, 2))
            del wd
            a = _act_mul(y[..., :inter], y[..., inter:], activation)
            del y
            wd = self.dequantize(w2[e0:e1], s2[e0:e1], fmt, k=inter, group=group, zeros=part(z2, e0, e1),
                                 gscale=part(gscale2, e0, e1))
            d = torch.bmm(a, wd.transpose(1, 2))
            del wd, a
            out.index_add_(0, tok[rows], d.view(-1, h).float() * wt[rows])
        return out[:m].half()

    def fused_moe(self, x: Any, w13: Any, s13: Any, w2: Any, s2: Any, topk_weights: Any, topk_ids: Any, fmt: str,
                  *, group: int, z13: Any = None, z2: Any = None, gscale13: Any = None, gscale2: Any = None,
                  activation: str = "gelu_tanh", path: str | None = None, align: Any = None,
                  decode: str | None = None, block: int | None = None, variant: str | None = None,
                  prefill: str | None = None) -> Any:
        """The MoE block: gate_up (w13: [E, 2I, H] packed), act(gate) * up, down (w2: [E, H, I]) times the
        routing weight, summed over top_k. x [M, H] fp16; topk_ids/topk_weights [M, top_k]. `align`:
        (sorted_ids, expert_ids, num_post) from vLLM's moe_align_block_size with `block` rows per expert block
        (default align_block(path, decode)). The GEMV decode fuses act(gate) * up into gate_up's epilogue;
        variant: one of GEMV_VARIANTS for it. On the prefill path from MOE_DEQUANT_MIN_ROWS routed rows
        (moe_prefill_choice; `prefill=` or $OVERLAY_W4_PREFILL) moe_dequant runs instead of the WMMA tile."""
        m, h = x.shape
        top_k = topk_ids.shape[1]
        e, n13 = w13.shape[0], w13.shape[1]
        inter = n13 // 2
        path = path or pick_path(m, top_k, e)
        kernel, auto_variant = decode_choice(decode, fmt, m * top_k)
        gemv = path == "decode" and kernel == "gemv"
        variant = variant or (auto_variant if gemv else None)
        if gemv and activation not in GEMV_ACT:
            raise BuildError(f"activation {activation!r}: expected {', '.join(ACTIVATIONS)}")
        if path == "prefill" and moe_prefill_choice(m * top_k, prefill) == "dequant":
            return self.moe_dequant(x, w13, s13, w2, s2, topk_weights, topk_ids, fmt, group=group, z13=z13, z2=z2,
                                    gscale13=gscale13, gscale2=gscale2, activation=activation)
        if gemv and variant in DIRECT_VARIANTS:
            return self.moe_direct(x, w13, s13, w2, s2, topk_weights, topk_ids, fmt, group=group, variant=variant,
                                   gscale13=gscale13, gscale2=gscale2, activation=activation)
        bm = block or align_block(path, decode, fmt)
        if not gemv and variant is not None:
            raise BuildError(f"variant {variant!r}: fused_moe takes GEMV variants only (decode=\"gemv\")")
        if not gemv and bm != TILES[path][0]:
            raise BuildError(f"block {bm}: the {path} WMMA tile takes {TILES[path][0]} rows per expert block")
        sorted_ids, expert_ids, num_post = align or moe_align(topk_ids, bm, e)
        nv = m * top_k
        if gemv:
            a = self.gemv(x, w13, s13, fmt, k=h, group=group, zeros=z13, gscale=gscale13, sorted_ids=sorted_ids,
                          expert_ids=expert_ids, num_post=num_post, num_valid=nv, a_div=top_k,
                          activation=activation, block=bm, variant=variant)
            return self.gemv(a, w2, s2, fmt, k=inter, group=group, zeros=z2, gscale=gscale2, sorted_ids=sorted_ids,
                             expert_ids=expert_ids, num_post=num_post, topk_w=topk_weights.float().contiguous(),
                             num_valid=nv, a_div=1, out_div=top_k, block=bm, variant=variant)
        y1 = self.gemm(x, w13, s13, fmt, k=h, group=group, zeros=z13, gscale=gscale13, sorted_ids=sorted_ids,
                       expert_ids=expert_ids, num_post=num_post, num_valid=nv, a_div=top_k, path=path, decode="wmma")
        a = _act_mul(y1[:, :inter], y1[:, inter:], activation)
        # down: routing weight and the top-k sum fused (fp32 atomics over the k rows of a token)
        return self.gemm(a, w2, s2, fmt, k=inter, group=group, zeros=z2, gscale=gscale2, sorted_ids=sorted_ids,
                         expert_ids=expert_ids, num_post=num_post, topk_w=topk_weights.float().contiguous(),
                         num_valid=nv, a_div=1, path=path, out_div=top_k, decode="wmma")


def _act_mul(gate: Any, up: Any, activation: str) -> Any:
    """act(gate) * up in gate's dtype (the WMMA and dequant paths' activation between gate_up and down)."""
    import torch

    if activation == "gelu_tanh":
        return torch.nn.functional.gelu(gate, approximate="tanh") * up
    if activation == "gelu":   # erf GELU: vLLM's MoEActivation.GELU (gelu_and_mul), what Gemma-4's MoE runs
        return torch.nn.functional.gelu(gate) * up
    if activation == "silu":
        return torch.nn.functional.silu(gate) * up
    raise BuildError(f"activation {activation!r}: expected {', '.join(ACTIVATIONS)}")


def load(cache: Path | None = None, prefer: str = "auto", overlay_dir: Path | None = None) -> W4Kernels:
    """The kernels for the current device, loaded once per (cache, prefer, device)."""
    import torch

    dev = torch.cuda.current_device()
    key = (str(cache), prefer, dev)
    with _lock:
        if key not in _loaded:
            ks = load_overlay_kernels(OVERLAY_ID, cache=cache, prefer=prefer, device=dev, overlay_dir=overlay_dir)
            _loaded[key] = W4Kernels(ks, torch.cuda.get_device_properties(dev).multi_processor_count)
        return _loaded[key]
