"""One decode (32 x 32K) and one prefill (1 x 8192) launch of the sm70-d512-attention kernels, for a profiler.

    ncu --clock-control none -k regex:d512 --section ... python3 benchmarks/kernels_profile.py --cache DIR

`--variant` profiles a `benchmarks/kernel_variants.py` build (its own entry specs and launch.json);
`--only prefill|decode` runs one of the two. Each kernel runs twice (the first launch JIT-compiles the PTX and
warms the caches); profile the second with `--launch-skip 1` per kernel name. Prints the launches it made.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # manager, and tests.kernels.d512_reference: the float32 torch oracle of the kernel tests


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", required=True)
    ap.add_argument("--prefer", default="ptx")
    ap.add_argument("--variant", action="store_true",
                    help="a kernel_variants.py build: its own entry specs and launch.json")
    ap.add_argument("--only", choices=("decode", "prefill"))
    a = ap.parse_args()
    import torch

    from tests.kernels.d512_reference import make_paged
    from tests.kernels.launcher import d512_launcher

    d512 = d512_launcher()

    cache = Path(a.cache)
    attn = d512.load(cache=cache, prefer=a.prefer,
                     overlay_dir=None if a.variant else ROOT / "overlays" / "sm70-d512-attention")
    if a.variant and (cache / "launch.json").is_file():
        attn.prefill_rows = int(json.loads((cache / "launch.json").read_text())["prefill_rows"])
    scale = 1.0 / math.sqrt(512)
    if a.only != "prefill":
        case = make_paged([32768] * 32, 2, 16, seed=1)
        q = torch.randn((32, 16, 512), device="cuda").to(torch.float16)
        for _ in range(2):
            attn.decode(q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, 32768, scale)
        torch.cuda.synchronize()
        print(f"decode 32 x 32768, 16/2 heads, {attn.last_splits} split(s)", flush=True)
        del case, q
    if a.only == "decode":
        return 0
    L = 8192
    case = make_paged([L], 2, 16, seed=2)
    q = torch.randn((L, 16, 512), device="cuda").to(torch.float16)
    cu = torch.tensor([0, L], dtype=torch.int32, device="cuda")
    for _ in range(2):
        attn.prefill(q, case.k_cache, case.v_cache, case.block_tables, cu, case.seq_lens, L, scale)
    torch.cuda.synchronize()
    print("prefill 1 x 8192, 16/2 heads, causal", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
