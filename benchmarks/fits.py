"""Benchmark: fits() over the whole catalog (every model x hardware x GPU count 1-2 x engine).

Three timings, each over the same set of calls:
  cold      a fresh overlay index with an empty status cache: the overlay engine computes the
            status of every overlay on every engine's vLLM release from the release sources
            (pristine trees must already be downloaded; downloading is not timed here)
  disk      a fresh index whose on-disk status cache (version + manifest hash) is filled
  warm      the same index again: in-process memo
The < 1 s target refers to `warm` (and holds for `disk`); `cold` is paid once per release
and manifest change.

    .venv/bin/python benchmarks/fits.py [--catalog DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from manager.catalog import Catalog
from manager.fits import build_index, fits
from manager.profiles import load_profiles


def sweep(profiles, index) -> tuple[float, int, dict[str, int]]:
    verdicts: dict[str, int] = {}
    n = 0
    t0 = time.perf_counter()
    for m in profiles.models:
        for hw in profiles.hardware:
            for gpus in (1, 2):
                for e in profiles.engines:
                    r = fits(profiles, model=m, hardware=hw, gpus=gpus, engine=e, overlay_index=index)
                    verdicts[r.verdict] = verdicts.get(r.verdict, 0) + 1
                    n += 1
    return time.perf_counter() - t0, n, verdicts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--catalog", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cat = Catalog.locate(args.catalog)
    t0 = time.perf_counter()
    profiles = load_profiles(cat)
    load_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        cold_idx = build_index(cat, cache_dir=Path(tmp))
        cold, n, verdicts = sweep(profiles, cold_idx)
        warm, _, _ = sweep(profiles, cold_idx)
        disk_idx = build_index(cat, cache_dir=Path(tmp))
        disk, _, _ = sweep(profiles, disk_idx)
    out = {
        "calls": n, "load_profiles_s": round(load_s, 3), "cold_s": round(cold, 3), "disk_s": round(disk, 3),
        "warm_s": round(warm, 3), "per_call_warm_us": round(warm / n * 1e6, 1), "status_computations": cold_idx.calls,
        "verdicts": verdicts, "target_s": 1.0, "target_met_warm": warm < 1.0,
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"fits over the catalog: {n} calls ({len(profiles.models)} models x {len(profiles.hardware)} hardware "
              f"x 2 GPU counts x {len(profiles.engines)} engines)")
        print(f"  load_profiles {load_s:.3f} s")
        print(f"  cold  {cold:.3f} s  ({cold_idx.calls} release status computations)")
        print(f"  disk  {disk:.3f} s")
        print(f"  warm  {warm:.3f} s  ({warm / n * 1e6:.0f} us/call)  "
              f"target < 1 s: {'met' if warm < 1.0 else 'MISSED'}")
        print(f"  verdicts {verdicts}")


if __name__ == "__main__":
    main()
