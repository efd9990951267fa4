"""The reference V100 deployment, estimated: one decode step and one 4K-prompt prefill of Gemma-4 26B-A4B NVFP4 at
TP=2 on 2x V100, from each kernel measured on this GPU and scaled as docs/kernels.md's V100 estimate does.

    python3 benchmarks/reference_step.py --cache DIR [--prefer ptx] --out DIR [--ctx 4096] [--prompt 4096]

Issue 29 point 5: "the sum of one decode step and one 4K-prompt prefill of 26B-A4B on 2x V100 (attention + MoE +
linear + norms), each kernel measured on the H200 and scaled as docs/kernels.md's V100 estimate does, against the
fork's reported ~5K tok/s prefill and ~35 tok/s decode. Label measured/derived/estimated."

One GPU of the pair (TP=2 halves the heads, the MLP and expert intermediates and the vocabulary; SHAPES below, from
profiles/models/gemma-4-26b-a4b.yaml): every projection, the dense MLP and the experts as NVFP4 (group 16) through
the sm70-w4-gemm kernels, attention through the sm70-d512-attention family (sliding layers head_dim 256 with the
1024-token window, global layers head_dim 512 with one KV head per GPU, K and V cached separately as vLLM does),
norms and the other small ops through torch, the tied lm_head (vocab-parallel, fp16) through torch. Every component
is timed as a CUDA graph over `--layers` distinct copies of its weights / caches (so a layer's weights are not in L2
when it runs, as in a real step), median of `--repeats`; the time per call is that over the copies.

V100 estimate per call (derived, the rule of docs/kernels.md "A V100 estimate"): the larger of
  * the same instruction stream in V100 cycles: t x (SMs x clock here) / (80 x 1.53 GHz), and
  * the bytes the call must move at 80 % of the V100's 900 GB/s.
Volta's HMMA takes more instructions per MMA, so compute-bound figures are lower bounds on the V100 time. A linear's
prefill through the launcher's "dequant" kernel (from DEQUANT_MIN_ROWS rows) is two rows: the dequantization (the
rule above) and the fp16 GEMM through cuBLAS, which runs other instructions on each card (wgmma here, HMMA on sm_70):
its V100 time is its FLOPs at 80 % of the V100's 125 TFLOPS tensor peak (estimated), or its bytes if larger. Not
counted in the sum (reported beside it, as an assumption-only estimate): the two all-reduces per layer between
the GPUs, which depend on the link (PCIe or NVLink) the deployment has. Nothing here runs on a V100.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

V100_SMS, V100_CLOCK, V100_BW, V100_BW_FRAC = 80, 1.53e9, 900e9, 0.8
# cuBLAS fp16 GEMMs (the linears' "dequant" prefill): not the same instruction stream on both cards (wgmma here, HMMA
# on sm_70), so not scaled by cycles: the FLOPs at V100_GEMM_FRAC of the V100's 125 TFLOPS tensor peak (estimated)
V100_TENSOR, V100_GEMM_FRAC = 125e12, 0.8
FORK = {"prefill_tok_s": 5000.0, "decode_tok_s": 35.0}   # the user's report of a fork (issue 29); not reproduced

# Gemma-4 26B-A4B (profiles/models/gemma-4-26b-a4b.yaml), per GPU at TP=2
H, VOCAB, LAYERS = 2816, 262144, 30
Q_HEADS = 16 // 2
SLIDING = dict(count=25, kv_heads=8 // 2, head_dim=256, window=1024)
FULL = dict(count=5, kv_heads=max(1, 2 // 2), head_dim=512, window=0)
DENSE_INTER = 2112 // 2
EXPERTS, TOP_K, EXPERT_INTER = 128, 8, 704 // 2
# Gemma4TextDecoderLayer (transformers 5.24.0 models/gemma4/modeling_gemma4.py): hidden-size RMSNorms input,
# post_attention, pre_feedforward, post_feedforward, pre_feedforward_2, post_feedforward_1, post_feedforward_2,
# the router's norm (8), and q_norm/k_norm/v_norm over the heads (3)
NORMS_HIDDEN, NORMS_HEAD = 8, 3
# small ops per layer, an estimated count (not read from vLLM's graph): rotary embedding, KV-cache write, the
# dense MLP's GELU-and-mul, router top-k softmax, moe_align_block_size, the layer scalar
SMALL_OPS = 6


@dataclass(frozen=True)
class Linear:
    name: str
    n: int
    k: int
    count: int   # per step (layers that have it)


def linears() -> list[Linear]:
    s, f = SLIDING, FULL
    qkv_s = (Q_HEADS + 2 * s["kv_heads"]) * s["head_dim"]
    qkv_f = (Q_HEADS + f["kv_heads"]) * f["head_dim"]   # K = V on the global layers: no v_proj
    return [
        Linear("qkv (sliding)", qkv_s, H, s["count"]), Linear("o (sliding)", H, Q_HEADS * s["head_dim"], s["count"]),
        Linear("qkv (global)", qkv_f, H, f["count"]), Linear("o (global)", H, Q_HEADS * f["head_dim"], f["count"]),
        Linear("dense MLP gate_up", 2 * DENSE_INTER, H, LAYERS), Linear("dense MLP down", H, DENSE_INTER, LAYERS),
    ]


def fp4_bytes(n: int, k: int) -> int:
    """Packed E2M1 weight + one E4M3 scale per 16."""
    return n * k // 2 + n * k // 16


@dataclass
class Row:
    phase: str
    component: str
    count: int
    us: float             # measured here, per call
    bytes: float          # compulsory bytes per call
    flops: float
    v100_us: float = 0.0  # derived
    rule: str = ""
    extra: dict = field(default_factory=dict)


def v100_us(us: float, nbytes: float, sms: int, clock: float, flops: float | None = None) -> tuple[float, str]:
    """The V100 time of a call measured here (derived): the larger of the same cycles and the bytes at 80 % of the
    V100's bandwidth; with `flops` (a cuBLAS GEMM) the FLOPs at V100_GEMM_FRAC of its tensor peak instead of the
    cycles (estimated)."""
    mem = nbytes / (V100_BW_FRAC * V100_BW) * 1e6
    if flops is not None:
        gemm = flops / (V100_GEMM_FRAC * V100_TENSOR) * 1e6
        return (gemm, "cuBLAS FLOPs (estimated)") if gemm >= mem else (mem, "bytes")
    cyc = us * (sms * clock) / (V100_SMS * V100_CLOCK)
    return (cyc, "cycles") if cyc >= mem else (mem, "bytes")


def totals(rows: list[Row]) -> dict:
    out: dict = {}
    for phase in ("decode", "prefill"):
        rs = [r for r in rows if r.phase == phase]
        out[phase] = {"measured_ms": sum(r.us * r.count for r in rs) / 1e3,
                      "v100_ms": sum(r.v100_us * r.count for r in rs) / 1e3}
    return out


def allreduce_estimate(tokens: int) -> dict:
    """Two all-reduces per layer of [tokens, H] fp16, by assumption only (link not known): latency 15-30 us each
    at one token; bandwidth ~12 GB/s (PCIe 3.0 x16) or ~45 GB/s (NVLink 2, two links) for a 2-GPU exchange."""
    n = 2 * LAYERS
    size = tokens * H * 2
    lat = (15e-6, 30e-6)
    return {"all_reduces": n, "bytes_each": size,
            "pcie3_ms": n * (lat[0] + size / 12e9) * 1e3, "nvlink2_ms": n * (lat[0] + size / 45e9) * 1e3,
            "latency_only_ms": [n * x * 1e3 for x in lat]}


def markdown(doc: dict) -> str:
    lines = [f"device: {doc['device']} ({doc['sms']} SMs, {doc['clock_ghz']:.2f} GHz), {doc['versions']}", ""]
    lines.append("| phase | component | calls per step | measured µs per call | bytes per call (MB) | V100 µs per call "
                 "(derived) | rule | V100 ms per step (derived) |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for r in doc["rows"]:
        lines.append(f"| {r['phase']} | {r['component']} | {r['count']} | {r['us']:.1f} | {r['bytes'] / 1e6:.2f} | "
                     f"{r['v100_us']:.1f} | {r['rule']} | {r['v100_us'] * r['count'] / 1e3:.2f} |")
    t = doc["totals"]
    lines += ["", f"decode step: measured here {t['decode']['measured_ms']:.2f} ms, V100 **estimated "
              f"{t['decode']['v100_ms']:.2f} ms** (= {1e3 / t['decode']['v100_ms']:.1f} tok/s; fork "
              f"{FORK['decode_tok_s']:.0f} tok/s = {1e3 / FORK['decode_tok_s']:.1f} ms)",
              f"{doc['prompt']}-token prefill: measured here {t['prefill']['measured_ms']:.1f} ms, V100 **estimated "
              f"{t['prefill']['v100_ms']:.1f} ms** (= {doc['prompt'] / t['prefill']['v100_ms'] * 1e3:.0f} tok/s; fork "
              f"~{FORK['prefill_tok_s']:.0f} tok/s = {doc['prompt'] / FORK['prefill_tok_s'] * 1e3:.0f} ms)",
              f"all-reduces (not in the sums, assumption only): {json.dumps(doc['allreduce'])}"]
    lines += [f"FAILED (not in the sums): {e}" for e in doc.get("errors", [])]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- GPU side


def _graph_us(calls, repeats: int) -> float:
    """Median µs per call of a CUDA graph that runs every callable of `calls` once (distinct layer copies)."""
    import torch

    for c in calls[:2]:
        c()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / len(calls))
    return statistics.median(ts)


def _clock_hz() -> float:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.max.sm", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout.split()
        return float(out[0]) * 1e6
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return 1.98e9


def measure(args) -> dict:
    import torch

    from tests.kernels.d512_reference import make_paged
    from tests.kernels.launcher import d512_launcher
    from tests.kernels.w4_launcher import w4_launcher
    from tests.kernels.w4_reference import make_weights, route

    dev = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(dev)
    sms, clock = props.multi_processor_count, _clock_hz()
    ctx = dict(attn=d512_launcher().load(Path(args.cache), prefer=args.prefer), mod=w4_launcher(),
               w4=w4_launcher().load(Path(args.cache), prefer=args.prefer),
               w4_kw={"decode": args.w4_decode} if args.w4_decode else {}, prefill=args.w4_prefill,
               moe_variant=args.w4_moe_variant,
               copies=args.layers,
               repeats=args.repeats, make_weights=make_weights, make_paged=make_paged, route=route)
    rows: list[Row] = []

    def add(phase, comp, count, us, nbytes, flops, cublas=False, **extra):
        v, rule = v100_us(us, nbytes, sms, clock, flops if cublas else None)
        rows.append(Row(phase, comp, count, us, nbytes, flops, v, rule, extra))
        print(f"{phase:8s} {comp:28s} x{count:3d}  {us:9.1f} us  V100 {v:9.1f} us ({rule})", flush=True)

    errors: list[str] = []

    def guarded(fn, *a) -> None:   # one component failing is data; the others still run
        try:
            fn(ctx, add, *a)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"{fn.__name__}{a[:1]}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
            print(f"FAILED {errors[-1]}", flush=True)
        torch.cuda.empty_cache()

    for phase, tokens in (("decode", 1), ("prefill", args.prompt)):
        for lin in linears():
            guarded(_linear, phase, tokens, lin)
        guarded(_moe, phase, tokens)
        for grp, label in ((SLIDING, "sliding"), (FULL, "global")):
            guarded(_attention, phase, tokens, args.ctx if phase == "decode" else tokens, grp, label)
        guarded(_small, phase, tokens)
    return {"device": props.name, "sms": sms, "clock_ghz": clock / 1e9,
            "versions": f"torch {torch.__version__}, CUDA {torch.version.cuda}", "prompt": args.prompt,
            "ctx": args.ctx, "rows": [asdict(r) for r in rows], "totals": totals(rows),
            "allreduce": {"decode": allreduce_estimate(1), "prefill": allreduce_estimate(args.prompt)},
            "errors": errors}


def _linear(c: dict, add, phase: str, tokens: int, lin: Linear) -> None:
    """A projection or the dense MLP, NVFP4 group 16."""
    import torch

    ws = [c["make_weights"]("fp4", 1, lin.n, lin.k, 16, seed=i, with_deq=False) for i in range(c["copies"])]
    xin = torch.randn((tokens, lin.k), device="cuda").half()
    flops = 2.0 * tokens * lin.n * lin.k
    act_bytes = tokens * (lin.k + lin.n) * 2
    if phase == "prefill" and c["mod"].prefill_choice(tokens, c["prefill"]) == "dequant":
        # the launcher's linear() here is two calls, timed apart because they scale to a V100 by different rules
        w4 = c["w4"]
        deq = [lambda w=w: w4.dequantize(w.w[0], w.scales[0], "fp4", k=lin.k, group=16, gscale=w.gscale) for w in ws]
        wds = [d() for d in deq]
        us = _graph_us(deq, c["repeats"])
        add(phase, f"linear {lin.name}: dequant", lin.count, us, fp4_bytes(lin.n, lin.k) + lin.n * lin.k * 2, 0.0,
            n=lin.n, k=lin.k)
        us = _graph_us([lambda wd=wd: xin @ wd.t() for wd in wds], c["repeats"])
        add(phase, f"linear {lin.name}: fp16 GEMM", lin.count, us, lin.n * lin.k * 2 + act_bytes, flops, cublas=True,
            n=lin.n, k=lin.k)
        return
    calls = [lambda w=w: c["w4"].linear(xin, w.w[0], w.scales[0], "fp4", group=16, gscale=w.gscale, **c["w4_kw"],
                                        **({"prefill": c["prefill"]} if c["prefill"] else {}))
             for w in ws]
    us = _graph_us(calls, c["repeats"])
    add(phase, f"linear {lin.name}", lin.count, us, fp4_bytes(lin.n, lin.k) + act_bytes, flops, n=lin.n, k=lin.k)


def _moe(c: dict, add, phase: str, tokens: int) -> None:
    """The MoE block (gate_up, GELU-and-mul, down with the top-k sum), experts NVFP4 group 16."""
    import torch

    mod = c["mod"]
    x = torch.randn((tokens, H), device="cuda").half()
    w13 = [c["make_weights"]("fp4", EXPERTS, 2 * EXPERT_INTER, H, 16, seed=100 + i, with_deq=False)
           for i in range(c["copies"])]
    w2 = [c["make_weights"]("fp4", EXPERTS, H, EXPERT_INTER, 16, seed=200 + i, with_deq=False)
          for i in range(c["copies"])]
    tw, ti = c["route"](tokens, EXPERTS, TOP_K, seed=tokens)
    path = mod.pick_path(tokens, TOP_K, EXPERTS)
    align = mod.moe_align(ti, mod.align_block(path, c["w4_kw"].get("decode"), "fp4"), EXPERTS)
    kw = dict(c["w4_kw"])
    if c["moe_variant"] and path == "decode":   # a GEMV variant for the decode step's MoE (--w4-moe-variant)
        kw.update(decode="gemv", variant=c["moe_variant"])
        align = mod.moe_align(ti, mod.align_block(path, "gemv", "fp4"), EXPERTS)
    if path == "prefill":
        # the WMMA tile, whatever --w4-prefill says: the launcher's dequant MoE prefill cannot be captured in a graph,
        # and its V100 time (fp16 weights written and read back, then cuBLAS) follows neither rule here (its V100
        # break-even against the tile is estimated in docs/kernels.md)
        kw["prefill"] = "wmma"
    calls = [lambda a=a, b=b: c["w4"].fused_moe(x, a.w, a.scales, b.w, b.scales, tw, ti, "fp4", group=16,
                                                gscale13=a.gscale, gscale2=b.gscale, activation="gelu",
                                                align=align, **kw)
             for a, b in zip(w13, w2, strict=True)]
    us = _graph_us(calls, c["repeats"])
    hit = int(ti.unique().numel())
    add(phase, "MoE (fp4 experts)", LAYERS, us,
        hit * (fp4_bytes(2 * EXPERT_INTER, H) + fp4_bytes(H, EXPERT_INTER)) + tokens * H * 4,
        2.0 * tokens * TOP_K * (2 * EXPERT_INTER * H + H * EXPERT_INTER), experts_hit=hit, path=path)


def _attention(c: dict, add, phase: str, tokens: int, ctx: int, grp: dict, label: str) -> None:
    import torch

    attn = c["attn"]
    hd, hk, win = grp["head_dim"], grp["kv_heads"], grp["window"]
    scale = 1.0 / math.sqrt(hd)
    cases = [c["make_paged"]([ctx], hk, 16, seed=i, head_dim=hd) for i in range(c["copies"])]
    eff = min(ctx, win) if win else ctx
    if phase == "decode":
        q = torch.randn((1, Q_HEADS, hd), device="cuda").half()
        calls = [lambda p=p: attn.decode(q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, ctx, scale,
                                         window=win) for p in cases]
        nbytes = eff * hk * hd * 2 * 2
        flops = 4.0 * Q_HEADS * eff * hd
    else:
        q = torch.randn((tokens, Q_HEADS, hd), device="cuda").half()
        cu = torch.tensor([0, tokens], dtype=torch.int32, device="cuda")
        calls = [lambda p=p: attn.prefill(q, p.k_cache, p.v_cache, p.block_tables, cu, p.seq_lens, tokens, scale,
                                          causal=True, window=win) for p in cases]
        nbytes = tokens * hk * hd * 2 * 2 + 2 * tokens * Q_HEADS * hd * 2
        keys = sum(min(i + 1, win) if win else i + 1 for i in range(tokens))
        flops = 4.0 * Q_HEADS * hd * keys
    us = _graph_us(calls, c["repeats"])
    add(phase, f"attention {label} D={hd}", grp["count"], us, nbytes, flops, ctx=ctx, window=win)


def _small(c: dict, add, phase: str, tokens: int) -> None:
    """Norms and small ops (torch; vLLM fuses the residual add into its own rms_norm op) and the lm_head."""
    import torch

    f = torch.nn.functional
    wn = torch.ones(H, device="cuda").half()
    xs = [torch.randn((tokens, H), device="cuda").half() for _ in range(c["copies"])]
    us = _graph_us([lambda t=t: f.rms_norm(t, (H,), wn) for t in xs], c["repeats"])
    add(phase, "RMSNorm (hidden)", LAYERS * NORMS_HIDDEN, us, tokens * H * 4, 4.0 * tokens * H)
    hq = torch.randn((tokens, Q_HEADS, 256), device="cuda").half()
    us = _graph_us([lambda: f.rms_norm(hq, (256,))] * c["copies"], c["repeats"])
    add(phase, "RMSNorm (heads)", LAYERS * NORMS_HEAD, us, hq.numel() * 4, 4.0 * hq.numel())
    us = _graph_us([lambda t=t: t.add_(1.0) for t in xs], c["repeats"])
    add(phase, "small op (estimated count)", LAYERS * SMALL_OPS, us, tokens * H * 4, tokens * H)
    # the tied lm_head, vocab-parallel, fp16: logits of the last token only
    lm = torch.randn((VOCAB // 2, H), device="cuda").half()
    last = xs[0][-1:].contiguous()
    us = _graph_us([lambda: last @ lm.t()], c["repeats"])
    add(phase, "lm_head (fp16, last token)", 1, us, lm.numel() * 2, 2.0 * lm.numel())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", required=True, help="kernel cache with both overlays built")
    ap.add_argument("--prefer", default="ptx")
    ap.add_argument("--out", required=True)
    ap.add_argument("--ctx", type=int, default=4096, help="context of the decode step")
    ap.add_argument("--prompt", type=int, default=4096, help="prefill prompt length")
    ap.add_argument("--layers", type=int, default=8, help="distinct weight/cache copies per timed graph")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--w4-decode", default=None, help="the launcher's decode= keyword (when it has one)")
    ap.add_argument("--w4-prefill", default=None, help="the launcher's prefill= keyword for linears (dequant | wmma)")
    ap.add_argument("--w4-moe-variant", default=None,
                    help="a GEMV variant (GEMV_VARIANTS) for the decode step's MoE, e.g. q1; default: --w4-decode's")
    args = ap.parse_args(argv)
    doc = measure(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "reference_step.json").write_text(json.dumps(doc, indent=1))
    md = markdown(doc)
    (out / "reference_step.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
