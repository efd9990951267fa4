"""The bundle's first container start under a bare python (issue 14): the regex patcher vs `overlay apply`.

    .venv/bin/python benchmarks/bundle_start.py [--python /usr/bin/python3] [--runs 11] [--json OUT]

Runs the bundle's wrapper (`overlay bundle` for that python's version, its prepared plans) under a bare
python3 (default: Debian's /usr/bin/python3, the compose e2e image's python; no venv, no .pth at
start-up), on a fresh copy of vLLM 0.20.0 each time, without Docker (container start-up is the same for
both and not ours). Interleaved rounds, medians:

- the regex patcher (benchmarks/apply.py's BASELINE): cold insertion of #40886, and its no-op;
- ours: the first `overlay apply vllm-pr40886-gemma4-awq-moe-keys` from the bundle's plan, and the warm no-op;
- the same first apply with `--before` (default): the bundle as main built it (no bytecode in site/, the
  wrapper's PYTHONPYCACHEPREFIX at an empty directory, as in a fresh container), to show what the
  bytecode change does;
- `python3 -c pass`.
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
sys.path.insert(0, str(ROOT / "benchmarks"))

from apply import BASELINE, GEMMA4, PR, SNIPPET  # noqa: E402
from manager.catalog import Catalog  # noqa: E402
from manager.compose.bundle import build_bundle  # noqa: E402
from manager.releases import copy_release  # noqa: E402

# main's wrapper before this change: PYTHONPYCACHEPREFIX always set (the stdlib's own bytecode ignored)
_PREFIX_WRAPPER_LINES = (
    'PYTHONPYCACHEPREFIX="${OVERLAY_PYCACHE:-${TMPDIR:-/tmp}/overlay-pycache}"\n'
    "export PYTHONPYCACHEPREFIX\n"
)


def _prefix_bundle(bundle: Path, dest: Path) -> Path:
    """A copy of `bundle` as main built it: no bytecode in site/, the prefix always set."""
    shutil.copytree(bundle, dest, symlinks=True)
    for cache in list(dest.rglob("__pycache__")):
        shutil.rmtree(cache)
    wrapper = dest / "bin" / "overlay"
    text = wrapper.read_text()
    at = text.index("export PYTHONPATH")
    wrapper.write_text(text[:at] + _PREFIX_WRAPPER_LINES + text[at:])
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--runs", type=int, default=11)
    ap.add_argument("--no-before", action="store_true", help="skip the prefix-bundle figure")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    py = a.python
    version = subprocess.run([py, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    work = Path(tempfile.mkdtemp(prefix="overlay-bench-bundle-"))
    try:
        bundle = build_bundle(work / "bundle", version, "manylinux_2_28_x86_64", Catalog.locate()).path
        bundles = {"": bundle}
        if not a.no_before:
            bundles["prefix_"] = _prefix_bundle(bundle, work / "bundle-prefix")
        base = [py, "-c", BASELINE + "\nprint(patch(sys.argv[1], sys.argv[2]))\n"]
        counter = iter(range(10**6))

        def env(tmp: Path) -> dict:
            return {"PATH": "/usr/bin:/bin", "HOME": str(tmp), "TMPDIR": str(tmp), "OVERLAY_PYTHON": py}

        samples: dict[str, list[float]] = {}

        def timed(key: str, cmd: list[str], **kw) -> subprocess.CompletedProcess:
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
            samples.setdefault(key, []).append(time.perf_counter() - t0)
            if proc.returncode:
                raise SystemExit(f"{key}: exit {proc.returncode}: {proc.stderr[-1500:]}")
            return proc

        def tmpdir() -> Path:
            d = work / f"tmp-{next(counter)}"
            d.mkdir()
            return d

        applied, patched = copy_release("0.20.0", work / "applied"), copy_release("0.20.0", work / "patched")
        subprocess.run([str(bundle / "bin" / "overlay"), "apply", PR, "--root", str(applied)],
                       env=env(tmpdir()), check=True, capture_output=True)
        subprocess.run([*base, str(patched / GEMMA4), str(SNIPPET)], check=True, capture_output=True)
        warm_tmp = tmpdir()
        reference = None
        for _ in range(a.runs):
            roots = [copy_release("0.20.0", work / f"r{next(counter)}") for _ in range(1 + len(bundles))]
            os.sync()
            timed("regex_cold_insert_s", [*base, str(roots[0] / GEMMA4), str(SNIPPET)])
            for (tag, b), root in zip(bundles.items(), roots[1:], strict=False):
                proc = timed(f"ours_{tag}first_apply_plan_s", [str(b / "bin" / "overlay"), "apply", PR, "--root",
                                                               str(root)], env=env(tmpdir()))
                if "prepared plan" not in proc.stderr:
                    raise SystemExit(f"{tag or 'bundle'}: the plan was not used: {proc.stderr}")
                got = (root / GEMMA4).read_bytes()
                if reference is None:
                    reference = got
                elif got != reference:
                    raise SystemExit("the first applies wrote different bytes")
            for _ in range(3):
                timed("regex_noop_s", [*base, str(patched / GEMMA4), str(SNIPPET)])
                timed("ours_warm_noop_s", [str(bundle / "bin" / "overlay"), "apply", PR, "--root", str(applied)],
                      env=env(warm_tmp))
                timed("python_startup_s", [py, "-c", "pass"])
            for r in roots:
                shutil.rmtree(r)
        fig = {k: statistics.median(v) for k, v in samples.items()}
        ratios = {"first_apply_plan_vs_regex_cold": fig["ours_first_apply_plan_s"] / fig["regex_cold_insert_s"],
                  "warm_noop_vs_regex_noop": fig["ours_warm_noop_s"] / fig["regex_noop_s"]}
        if "prefix_" in bundles:
            ratios["first_apply_plan_bytecode_vs_prefix"] = (fig["ours_first_apply_plan_s"]
                                                             / fig["ours_prefix_first_apply_plan_s"])
        load = os.getloadavg()
        print(f"bundle for python {version} ({py}), {a.runs} interleaved rounds (no-ops x3), median, "
              f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        for k, v in fig.items():
            print(f"  {k:40s} {v * 1000:8.1f} ms  (min {min(samples[k]) * 1000:.1f}, n={len(samples[k])})")
        for k, v in ratios.items():
            print(f"  {k:40s} {v:8.2f} x")
        if a.json:
            a.json.write_text(json.dumps({"python": py, "runs": a.runs, "figures_s": fig, "ratios": ratios,
                                          "samples_s": samples, "loadavg_end": load}, indent=2) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
