"""Walk of one `overlay apply` on a slim vLLM root, counted with an audit hook (issue 27).

    .venv/bin/python benchmarks/apply_walk.py [--version 0.20.0] [--tree CHECKOUT]

The root is slim, as `overlay prepare`'s scratch root: the release's dist-info and every input file
of the shipped catalog's overlays (manager.overlays.prepare.input_paths), copied from the pristine
release tree. Each apply runs in a fresh process (`python -m manager --catalog overlays apply --root R`,
the container-start entry, stderr not a terminal) of the checkout `--tree` (default: this one), with
`sys.addaudithook` installed before `manager` is imported. It counts, under the root only: `open`
events (files opened) and `os.listdir`/`os.scandir` events (directories entered), for a first apply
(full engine, no plan) and the warm no-op that follows. Deterministic counts: one run each.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, os, sys
root = os.path.realpath(sys.argv[1])
counts = {"open": 0, "dirs": 0, "open_paths": []}
def hook(event, args):
    if event == "open":
        p = args[0]
        if isinstance(p, (str, bytes, os.PathLike)) and os.path.realpath(os.fsdecode(p)).startswith(root + os.sep):
            counts["open"] += 1
            counts["open_paths"].append(os.path.relpath(os.path.realpath(os.fsdecode(p)), root))
    elif event in ("os.listdir", "os.scandir"):
        p = args[0] if args else None
        real = os.path.realpath(os.fsdecode(p)) if isinstance(p, (str, bytes, os.PathLike)) else ""
        if (real + os.sep).startswith(root + os.sep):
            counts["dirs"] += 1
sys.addaudithook(hook)
fd = int(sys.argv[3])
sys.argv = ["overlay", "--catalog", sys.argv[2], "apply", "--root", sys.argv[1]]
from manager.fastpath import main
try:
    main()
except SystemExit as exc:
    code = exc.code
else:
    code = 0
import manager
os.write(fd, json.dumps({"code": code, "manager": manager.__file__, **counts}).encode())
"""


def slim_root(version: str, dest: Path, catalog: Path, tree: Path) -> None:
    sys.path.insert(0, str(tree))
    from manager.catalog import Catalog
    from manager.overlays import load_overlays
    from manager.overlays.prepare import input_paths
    from manager.releases import pristine_tree

    src = pristine_tree(version)
    for info in src.glob("vllm-*.dist-info"):
        shutil.copytree(info, dest / info.name)
    (dest / "vllm").mkdir()
    for rel in input_paths(load_overlays(Catalog(catalog))):
        if (src / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / rel, dest / rel)


def walk(tree: Path, root: Path, catalog: Path) -> dict:
    r, w = os.pipe()
    env = {**os.environ, "PYTHONPATH": str(tree)}
    for k in ("OVERLAY_PLAN_CACHE", "OVERLAY_PLANS", "OVERLAY_PLAN_KEY"):
        env.pop(k, None)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(root), str(catalog), str(w)], env=env, pass_fds=(w,),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, cwd=str(tree),
                          timeout=600)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        raw = fh.read()
    if proc.returncode != 0 or not raw:
        raise SystemExit(f"apply failed: {proc.stderr}")
    return json.loads(raw)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--version", default="0.20.0")
    ap.add_argument("--tree", type=Path, default=HERE, help="the checkout whose `manager` runs")
    ap.add_argument("--paths", action="store_true", help="also list the files opened")
    args = ap.parse_args()
    tree = args.tree.resolve()
    catalog = tree  # the catalog directory holds overlays/
    with tempfile.TemporaryDirectory(prefix="apply-walk-") as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        slim_root(args.version, root, catalog, tree)
        for label in ("first", "warm"):
            got = walk(tree, root, catalog)
            print(f"{label:>6}: files opened {got['open']:3d}  directories entered {got['dirs']:3d}  "
                  f"exit {got['code']}")
            if args.paths:
                print(f"          (manager from {got['manager']})")
                for p in got["open_paths"]:
                    print(f"          {p}")


if __name__ == "__main__":
    main()
