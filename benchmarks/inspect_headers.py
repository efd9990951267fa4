"""Benchmark: `overlay inspect` on a 26B-A4B-shaped AWQ header set (all shards) vs reading the same
headers with the safetensors library, in the same run (medians of --repeats).

The set is written with tests/inspect/checkpoint_shapes.py as sparse files (full size, data region a hole),
so the safetensors library can open them. Timed:
  inspect        inspect_checkpoint(dir): config + index + headers -> facts, bytes, per-TP splits, findings
  inspect+eng    the same plus the per-engine key-layout checks against the catalog's profiles
  safetensors    safe_open(shard, "np") and get_slice(k).get_dtype()/get_shape() for every key (names, dtypes,
                 shapes only: no bytes per rank, no findings)
Memory: tracemalloc peak of inspect on the set and on the same keys with every first dimension x1000.

    .venv/bin/python benchmarks/inspect_headers.py [--repeats 15] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # manager, and tests.inspect.checkpoint_shapes

from tests.inspect import checkpoint_shapes as shapes  # noqa: E402
from manager.catalog import Catalog  # noqa: E402
from manager.inspect import inspect_checkpoint  # noqa: E402
from manager.profiles import load_profiles  # noqa: E402


def _median(fn, n: int) -> float:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def _scaled(src: Path, dest: Path, factor: int) -> None:
    dest.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (dest / f.name).write_bytes(f.read_bytes())
            continue
        shapes.scale_first_dims(f, factor, dest / f.name)


def _peak(d: Path) -> tuple[int, int]:
    inspect_checkpoint(d)
    tracemalloc.start()
    r = inspect_checkpoint(d)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak, r.weights.total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from safetensors import safe_open

    cat = Catalog(ROOT)
    profiles = load_profiles(cat)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "26b-a4b-awq"
        info = shapes.write(d, "26b-a4b", "w4a16", sparse=True)
        files = sorted(d.glob("*.safetensors"))

        def lib() -> int:
            n = 0
            for f in files:
                with safe_open(str(f), "np") as fh:
                    for k in fh.keys():  # noqa: SIM118 - safetensors' safe_open has keys() but is not iterable
                        s = fh.get_slice(k)
                        s.get_dtype()
                        n += len(s.get_shape())
            return n

        inspect_checkpoint(d, profiles=profiles, catalog=cat)  # warm imports and caches
        lib()
        t_lib = _median(lib, args.repeats)
        t_ins = _median(lambda: inspect_checkpoint(d), args.repeats)
        t_eng = _median(lambda: inspect_checkpoint(d, profiles=profiles, catalog=cat), args.repeats)
        r = inspect_checkpoint(d)
        big = Path(tmp) / "x1000"
        _scaled(Path(tmp) / "26b-a4b-awq", big, 1000)
        p1, b1 = _peak(d)
        p2, b2 = _peak(big)
    out = {
        "set": {"model": "26b-a4b", "quant": "w4a16", "shards": len(files), "tensors": info["tensors"],
                "described_bytes": info["total"], "bytes_read": r.bytes_read},
        "median_s": {"inspect": round(t_ins, 4), "inspect_with_engine_checks": round(t_eng, 4),
                     "safetensors_headers": round(t_lib, 4)},
        "ratio_inspect_vs_safetensors": round(t_ins / t_lib, 2),
        "ratio_inspect_with_engines_vs_safetensors": round(t_eng / t_lib, 2),
        "memory_peak_bytes": {"set": p1, "x1000_set": p2, "described": [b1, b2], "ratio": round(p2 / p1, 3)},
        "target_under_0.2s": t_eng < 0.2,
        "repeats": args.repeats,
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return
    s = out["set"]
    print(f"26B-A4B AWQ header set: {s['shards']} shards, {s['tensors']} tensors, "
          f"{s['described_bytes']:,} B described, {s['bytes_read']:,} B read")
    m = out["median_s"]
    print(f"median of {args.repeats}: inspect {m['inspect']:.4f} s | "
          f"inspect + engine checks {m['inspect_with_engine_checks']:.4f} s | "
          f"safetensors library headers {m['safetensors_headers']:.4f} s")
    print(f"ratio vs safetensors: inspect {out['ratio_inspect_vs_safetensors']}x, with engine checks "
          f"{out['ratio_inspect_with_engines_vs_safetensors']}x; < 0.2 s: {out['target_under_0.2s']}")
    mp = out["memory_peak_bytes"]
    print(f"memory peak: {mp['set']:,} B for {b1:,} B described; {mp['x1000_set']:,} B for {b2:,} B described "
          f"(ratio {mp['ratio']})")


if __name__ == "__main__":
    main()
