"""Build variants of the sm70-d512-attention kernels for `benchmarks/kernels.py --variant LABEL@DIR`.

    python benchmarks/kernel_variants.py --out DIR LABEL[@GITREF]=[-DNAME=VALUE,...][,threads=N,shared=B,rows=R] ...

Each variant is the overlay's kernel sources (from the working tree, or from GITREF: e.g.
`main@2fed222=` is the committed kernels of that commit; a commit before the head-dim family (a59d14d
and older) has other entry parameters, so run its build with its own launcher through
`benchmarks/kernels.py --old`) compiled to compute_70 PTX with the
manifest's options plus the given -D flags, by `overlay build`'s library (NVRTC 12) into DIR/LABEL.
Prints one `LABEL@DIR/LABEL` per variant (the --variant arguments). Nothing in the catalog changes:
the build reads a temporary copy of the overlay. `threads=`/`shared=` override the prefill entry's block
size and dynamic shared memory in the variant's manifest (a -DPREFILL_ALT build has its own); `rows=` is
the query rows per prefill block, written to DIR/LABEL/launch.json for benchmarks/kernels.py.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
OVERLAY = "sm70-d512-attention"


LAUNCH_KEYS = ("threads", "shared", "rows")


def parse(spec: str) -> tuple[str, str | None, list[str], dict[str, int]]:
    """'LABEL[@REF]=FLAG,...' -> (label, ref, -D flags, prefill launch overrides {threads, shared, rows})."""
    head, _, flags = spec.partition("=")
    label, _, ref = head.partition("@")
    if not label or not label.replace("-", "").replace("_", "").isalnum():
        raise SystemExit(f"kernel_variants: {spec!r}: a label is letters, digits, '-' and '_'")
    opts, launch = [], {}
    for f in (f for f in flags.split(",") if f):
        key, eq, val = f.partition("=")
        if key in LAUNCH_KEYS and eq and val.isdigit():
            launch[key] = int(val)
        elif f.startswith("-D"):
            opts.append(f)
        else:
            raise SystemExit(f"kernel_variants: {spec!r}: only -D flags and {'/'.join(LAUNCH_KEYS)}=N, not {f!r}")
    return label, ref or None, opts, launch


def build_variant(label: str, ref: str | None, flags: list[str], out: Path, nvrtc: str,
                  launch: dict[str, int] | None = None) -> Path:
    from manager.kernels import builder

    src = ROOT / "overlays" / OVERLAY
    with tempfile.TemporaryDirectory() as tmp:
        cat = Path(tmp) / "overlays"
        dst = cat / OVERLAY
        shutil.copytree(src, dst)
        if ref:   # the kernel sources (and manifest) as committed at ref: that commit's csrc/ listing
            ls = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{ref}:overlays/{OVERLAY}/csrc"],
                                capture_output=True, text=True)
            if ls.returncode != 0:
                raise SystemExit(f"kernel_variants: {ref}: {ls.stderr.strip()}")
            shutil.rmtree(dst / "csrc")
            (dst / "csrc").mkdir()
            for rel in ["overlay.yaml", *(f"csrc/{n}" for n in ls.stdout.split())]:
                text = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:overlays/{OVERLAY}/{rel}"],
                                      capture_output=True, text=True)
                if text.returncode != 0:
                    raise SystemExit(f"kernel_variants: {ref}:{rel}: {text.stderr.strip()}")
                (dst / rel).write_text(text.stdout)
        manifest = yaml.safe_load((dst / "overlay.yaml").read_text())
        manifest["kernels"]["options"] = list(manifest["kernels"].get("options", [])) + flags
        launch = launch or {}
        for src_spec in manifest["kernels"]["sources"]:
            for e in src_spec["entries"]:
                if e["name"] == "prefill_d512":
                    if "threads" in launch:
                        e["threads"] = launch["threads"]
                    if "shared" in launch:
                        e["shared_bytes"] = launch["shared"]
        (dst / "overlay.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
        cache = out / label
        if cache.exists():
            shutil.rmtree(cache)
        builder.build(cat, [OVERLAY], archs=["compute_70"], cache=cache, nvrtc_path=nvrtc, progress=False)
    if "rows" in launch:
        (cache / "launch.json").write_text(json.dumps({"prefill_rows": launch["rows"]}))
    return cache


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--nvrtc", default=None, help="libnvrtc.so.12 (default: the test helpers' PyPI install)")
    ap.add_argument("variants", nargs="+", metavar="LABEL[@REF]=FLAGS")
    a = ap.parse_args(argv)
    nvrtc = a.nvrtc
    if nvrtc is None:
        from tests.helpers.nvrtc12 import nvrtc12_lib

        nvrtc = str(nvrtc12_lib())
    a.out.mkdir(parents=True, exist_ok=True)
    for spec in a.variants:
        label, ref, flags, launch = parse(spec)
        cache = build_variant(label, ref, flags, a.out, nvrtc, launch)
        print(f"{label}@{cache}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
