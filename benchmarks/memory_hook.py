"""In-memory delivery (issue 25 point 4): the import hook's cost per process, and a first start in memory mode vs
file mode with the same prepared plan.

    .venv/bin/python benchmarks/memory_hook.py [--python /usr/bin/python3] [--runs 11] [--json OUT]

On vLLM 0.20.0 from PyPI (manager.releases, a fresh copy for every first apply) with the two Python overlays a
0.20.0 deployment applies there (gemma4-convertor-per-layer, vllm-pr40886-gemma4-awq-moe-keys: two modules), a plan
prepared and signed as `overlay bundle` does, and the bundle's memory/ directory (manager/compose/bundle.py). Every
figure is a whole process of a bare python (default Debian's /usr/bin/python3, the compose e2e image's), median of
`--runs`, rounds interleaved; ratios are against `python3 -c pass` measured in the same run:

- baseline: `python3 -c pass` (the memory/ directory on PYTHONPATH, no overlay named: its sitecustomize returns);
- hook install: the same interpreter with the server's memory environment ($OVERLAY_MEMORY_PLAN as the entrypoint
  exports it): plan read, HMAC and structure verified, finder installed; what every engine process pays;
- the same two with `import json` in both (every vLLM process imports it; the plan is JSON, and json imports re:
  ~14 ms of a bare start, measured with -X importtime);
- hook install + both modules served: their original files read and hashed, hunks applied, result hashed, code
  compiled (cold: no bytecode cache) or loaded from $OVERLAY_MEMORY_PYCACHE (warm);
- today's warm no-op: `overlay apply IDS` through the wrapper's fast path on an applied root (every container
  start in file mode pays it once);
- first start, file mode: `overlay apply IDS` replaying the prepared plan onto a fresh root (writes two files);
- first start, memory mode: the entrypoint's check (plan lookup and every file's hash) + one interpreter's hook with
  both modules served cold.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from manager.catalog import Catalog  # noqa: E402
from manager.compose.bundle import write_memory_dir  # noqa: E402
from manager.overlays import load_overlays  # noqa: E402
from manager.overlays.plankey import create_key_file  # noqa: E402
from manager.overlays.prepare import prepare  # noqa: E402
from manager.releases import copy_release  # noqa: E402

VERSION = "0.20.0"
IDS = ["gemma4-convertor-per-layer", "vllm-pr40886-gemma4-awq-moe-keys"]
MODULES = {"vllm.transformers_utils.model_arch_config_convertor": "vllm/transformers_utils",
           "vllm.model_executor.models.gemma4": "vllm/model_executor/models"}
FASTPATH = 'import sys; from manager.fastpath import main; sys.argv[0] = "overlay"; main()'


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--runs", type=int, default=11)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="memory-bench.") as raw:
        tmp = Path(raw)
        catalog = Catalog(ROOT)
        key = create_key_file(tmp / "plan-key")
        (made,) = prepare(load_overlays(catalog), [VERSION], IDS, tmp / "plans", key=key)
        memory = tmp / "memory"
        write_memory_dir(memory)
        subprocess.run([args.python, "-m", "compileall", "-q", str(memory)], check=True)
        root = copy_release(VERSION, tmp / "root")
        applied = copy_release(VERSION, tmp / "applied")
        base = {k: v for k, v in os.environ.items() if not k.startswith(("OVERLAY_", "PYTHON"))}
        mem_env = dict(base, PYTHONPATH=f"{memory}{os.pathsep}{root}", OVERLAY_MEMORY_IDS=" ".join(IDS),
                       OVERLAY_MEMORY_CATALOG=str(ROOT), OVERLAY_MEMORY_PLANS=str(tmp / "plans"),
                       OVERLAY_PLAN_KEY=str(tmp / "plan-key"), OVERLAY_MEMORY_ROOT=str(root))
        file_env = dict(base, PYTHONPATH=str(ROOT), OVERLAY_CATALOG=str(ROOT), OVERLAY_PLANS=str(tmp / "plans"),
                        OVERLAY_PLAN_KEY=str(tmp / "plan-key"))
        first = subprocess.run([args.python, "-c", FASTPATH, "apply", *IDS, "--root", str(applied)], env=file_env,
                               capture_output=True, text=True)
        assert first.returncode == 0 and "prepared plan" in first.stderr, first.stderr
        serve = ("import sys\n"
                 + "".join(f"sys.meta_path[0].find_spec({m!r}, [{str(root / d)!r}]).loader.get_code({m!r})\n"
                           for m, d in MODULES.items()))
        check = ("import sys; sys.path.insert(0, sys.argv[1]); from overlay_memory.inmemory.check import main; "
                 "main(sys.argv[2:])")
        got: dict[str, list[float]] = {}

        def timed(name: str, cmd: list[str], env: dict, setup=None) -> None:
            if setup is not None:
                setup()
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            got.setdefault(name, []).append(time.perf_counter() - t0)
            assert proc.returncode == 0, (name, proc.stderr[-600:])

        plan_env = dict(mem_env, OVERLAY_MEMORY_PLAN=made.path)
        warm_env = dict(plan_env, OVERLAY_MEMORY_PYCACHE=str(tmp / "pycache"))
        py = args.python
        for i in range(args.runs):
            fresh = tmp / f"fresh-{i}"
            timed("python3 -c pass (baseline)", [py, "-c", "pass"], dict(mem_env, OVERLAY_MEMORY_IDS=""))
            timed("hook install (plan verified, finder installed)", [py, "-c", "pass"], plan_env)
            timed("python3 -c 'import json' (what vLLM imports anyway)", [py, "-c", "import json"],
                  dict(mem_env, OVERLAY_MEMORY_IDS=""))
            timed("hook install, same process importing json", [py, "-c", "import json"], plan_env)
            timed("hook install + 2 modules served, cold (compiled)", [py, "-c", serve], plan_env)
            timed("hook install + 2 modules served, warm (bytecode cache)", [py, "-c", serve], warm_env)
            timed("today's warm no-op `overlay apply` (fast path)",
                  [py, "-c", FASTPATH, "apply", *IDS, "--root", str(applied)], file_env)
            timed("first start, file mode: `overlay apply` replaying the plan",
                  [py, "-c", FASTPATH, "apply", *IDS, "--root", str(fresh)], file_env,
                  setup=lambda fresh=fresh: copy_release(VERSION, fresh))
            timed("first start, memory mode: the entrypoint's check", [py, "-c", check, str(memory), *IDS], mem_env)
            shutil.rmtree(fresh, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in got.items()}
    base_s = med["python3 -c pass (baseline)"]
    check_s = med["first start, memory mode: the entrypoint's check"]
    med["first start, memory mode: check + one interpreter's hook, cold"] = \
        check_s + med["hook install + 2 modules served, cold (compiled)"]
    print(f"{'what':<72} {'median s':>9} {'x baseline':>10}")
    for k, v in med.items():
        print(f"{k:<72} {v:9.4f} {v / base_s:10.2f}")
    hook = med["hook install (plan verified, finder installed)"] - base_s
    noop = med["today's warm no-op `overlay apply` (fast path)"] - base_s
    print(f"\nper-process hook install over python start: {hook * 1000:.1f} ms; warm no-op apply over python start: "
          f"{noop * 1000:.1f} ms; ratio {hook / noop:.2f}")
    file_first = med["first start, file mode: `overlay apply` replaying the plan"]
    mem_first = med["first start, memory mode: check + one interpreter's hook, cold"]
    marginal = (med["hook install, same process importing json"]
                - med["python3 -c 'import json' (what vLLM imports anyway)"])
    print(f"hook install in a process that imports json anyway (as vLLM's do): {marginal * 1000:.1f} ms")
    print(f"first start, memory mode / file mode: {mem_first / file_first:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"python": args.python, "runs": args.runs, "median_s": med}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
