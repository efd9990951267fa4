"""Benchmark of `overlay apply` / `status` on a real vLLM release tree, against a regex patcher.

    .venv/bin/python benchmarks/apply.py [--version 0.20.0] [--runs 7] [--json OUT]
    .venv/bin/python benchmarks/apply.py --plans [--version 0.20.0] [--runs 15] [--json OUT]

Ours (the overlay engine, the three Python overlays of issue 2 in a temporary catalog):
  * cold apply, in-process (libcst already imported): load_overlays + apply on a fresh copy;
  * first apply in a fresh process (imports included, interpreter start-up not);
  * warm no-op apply (everything applied: the ledger fast path);
  * status (ledger fast path on the applied tree; from sources on a fresh tree);
  * the same as whole processes through the CLI (`python -m manager ...`).
Baseline: the way the bash/regex scripts patch: read the file, look for the sentinel
substring, regex-find the anchor line, insert the #40886 branches with the captured
indent, write the file; its cold insertion and its no-op run, in-process and as a
`python -c` process. Ours is also timed for #40886 alone (the like-for-like ratio).

`--plans` (issue 14) runs only the prepared-plan section, every figure a whole process on a
fresh copy of the release, all in one run (plans signed with a plan key made for the run, or the
one `$OVERLAY_PLAN_KEY` names, and verified, as a bundle's are): the regex patcher's cold insertion and no-op, our
first apply with a prepared plan (`overlay apply --plans DIR`; the three overlays, and the whole
catalog), without one (the full engine: #40886 alone, the three, the whole catalog), and our warm
no-op. `--before DIR` adds the same figures for another checkout (e.g. main) in the same rounds.
Our package is byte-compiled first (as an installed wheel is), in both trees.
The warm no-op pair (ours and the regex patcher's, with `python -c pass`) is also timed, in the same
rounds, under two more interpreters, because the benchmark's own venv is an editable install whose
`.pth` hook imports `re` (and pathlib, urllib...) into every process at start-up, the regex
patcher's one import included: a plain venv of the same python (`python -m venv --without-pip`: no
`.pth`, as a pipx/uv tool venv has none that imports `re`) and the system `python3` (Debian's, the
compose image's interpreter) when it is another python >= 3.10. Our warm check is standard library
only, so it runs from the checkout under either.

Every figure is the median of --runs runs (>= 5). Targets (issue 2): cold apply of the
whole set < 0.5 s and <= 3x the baseline; warm no-op <= 1.0x the baseline's no-op.

`--scaling [0.25,1,4,16]`: apply time against target size (a padded cuda.py; issue 10 item 11,
target <= 2x the CPU time per MiB at 16 MiB as at 0.25 MiB).
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

from manager.releases import copy_release, pristine_tree  # noqa: E402

THREE = ("dynamo-dict-caches", "gemma4-convertor-per-layer", "vllm-pr40886-gemma4-awq-moe-keys")
PR = "vllm-pr40886-gemma4-awq-moe-keys"
GEMMA4 = "vllm/model_executor/models/gemma4.py"
SNIPPET = ROOT / "overlays" / PR / "snippets" / "awq_moe_branches.py"

# The baseline: what the regex scripts do (python3 + re + a sentinel substring).
BASELINE = r'''
import re, sys
def patch(path, snippet_path):
    text = open(path).read()
    if "# overlay-regex:pr40886" in text:
        return "already"
    m = re.search(r'^([ \t]*)if "moe\.gate_up_proj" in name and weight\.dim\(\) == 3:[ \t]*$', text, re.M)
    if m is None:
        raise SystemExit("anchor not found")
    indent = m.group(1)
    block = "".join(indent + l if l.strip() else l for l in open(snippet_path).read().splitlines(True))
    text = text[: m.start()] + indent + "# overlay-regex:pr40886\n" + block + text[m.start():]
    with open(path, "w") as fh:
        fh.write(text)
    return "patched"
'''
_ns: dict = {}
exec(BASELINE, _ns)
baseline_patch = _ns["patch"]

# A PROTOTYPE (not the product) of the proposed stdlib-only warm no-op check that would run
# before click/rich/pydantic/yaml/libcst are imported: the same decision as the engine's
# ledger fast path (package version, no journal, every catalog overlay's directory digest
# and recorded status, every observed target hash), from the ledger and the files alone.
PROTO_FASTPATH = r'''
import hashlib, json, os, sys
def noop(catalog, root):
    state = os.path.join(root, ".overlay-manager")
    if os.path.exists(os.path.join(state, "journal.json")):
        return False
    try:
        with open(os.path.join(state, "ledger.json"), "rb") as fh:
            led = json.load(fh)
    except (OSError, ValueError):
        return False
    version = None
    for name in sorted(os.listdir(root)):
        if name.startswith("vllm-") and name.endswith(".dist-info"):
            with open(os.path.join(root, name, "METADATA")) as fh:
                for line in fh:
                    if line.startswith("Version:"):
                        version = line.split(":", 1)[1].strip()
                        break
            break
    if version is None or led.get("package_version") != version:
        return False
    base = os.path.join(catalog, "overlays")
    for oid in sorted(os.listdir(base)):
        d = os.path.join(base, oid)
        if oid.startswith((".", "_")) or not os.path.isfile(os.path.join(d, "overlay.yaml")):
            continue
        rec = led.get("overlays", {}).get(oid)
        if not rec or rec.get("status") not in (
            "applied", "upstream", "not-applicable", "superseded", "missing-target"
        ):
            return False
        h = hashlib.sha256()
        files = []
        for dp, dn, fn in os.walk(d, followlinks=True):
            if "__pycache__" in dp.split(os.sep):
                continue
            files += [os.path.join(dp, f) for f in fn]
        for p in sorted(files, key=lambda p: tuple(os.path.relpath(p, d).split(os.sep))):
            h.update(os.path.relpath(p, d).encode() + b"\0")
            with open(p, "rb") as fh:
                h.update(fh.read() + b"\0")
        if h.hexdigest() != rec.get("digest"):
            return False
        for t in rec["targets"]:
            try:
                with open(os.path.join(root, t["path"]), "rb") as fh:
                    now = hashlib.sha256(fh.read()).hexdigest()
            except FileNotFoundError:
                now = "absent"
            if led.get("observed", {}).get(t["path"]) != now:
                return False
    return True
'''
_ns2: dict = {}
exec(PROTO_FASTPATH, _ns2)
proto_noop = _ns2["noop"]


def median_of(fn, runs: int) -> float:
    return statistics.median(fn() for _ in range(runs))


CPU: list[float] = []  # process CPU seconds of the last _timed call (load-independent view)


def _timed(fn) -> float:
    c0 = time.process_time()
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    CPU[:] = [time.process_time() - c0]
    return dt


def _proc(args: list[str], env: dict | None = None) -> float:
    full = dict(os.environ)
    full.update(env or {})
    t0 = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, env=full, cwd=ROOT)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return dt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--version", default="0.20.0")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures as JSON here")
    ap.add_argument("--plans", action="store_true", help="only the prepared-plan section (issue 14), as processes")
    ap.add_argument("--before", type=Path, default=None, metavar="DIR",
                    help="with --plans: also time a checkout of the code before the change (e.g. `git worktree add "
                         "DIR main`) in the same interleaved rounds")
    ap.add_argument("--short", type=int, default=3, metavar="N",
                    help="with --plans: the short processes (regex, plan, warm no-op, python -c pass) "
                         "N times per round")
    ap.add_argument("--scaling", nargs="?", const="0.25,1,4,16", default=None, metavar="MIB,...",
                    help="only the file-size scaling benchmark (default sizes 0.25,1,4,16 MiB); "
                         "--runs applies to sizes <= 1 MiB, larger sizes run once")
    a = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="overlay-bench-"))
    try:
        if a.plans:
            return _bench_plans(work, a.version, max(5, a.runs), a.json, a.before, max(1, a.short))
        if a.scaling:
            return _scaling(work, a.version, [float(x) for x in a.scaling.split(",")], max(1, a.runs), a.json)
        return _bench(work, a.version, max(5, a.runs), a.json)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# --- scaling with file size (issue 10, item 11) -----------------------------------------------
# vllm/platforms/cuda.py of the release, padded with generated unique definitions (one
# functools.cache function and one class per ~300 bytes) up to each size; the three overlays
# applied in-process on a slim root (the dist-info and the three targets). Reported: median wall
# and process-CPU seconds, CPU seconds per MiB, and that per-MiB cost relative to the smallest
# size of the same run (target: <= 2x at 16 MiB vs 0.25 MiB).
CUDA = "vllm/platforms/cuda.py"


def _pad(i: int) -> str:
    return (
        f"\n\n@functools.cache\ndef _pad_cached_{i}(x: int) -> int:\n    return x * {i}\n\n\n"
        f"class _Pad{i}:\n    def method(self, a, b):\n        c = a + b\n        if c > {i}:\n"
        f"            return [c, a]\n        return {{'k': c}}\n"
    )


def _padded(original: str, mib: float) -> str:
    want = int(mib * 1024 * 1024)
    parts, n, i = [original], len(original.encode()), 0
    while n < want:
        chunk = _pad(i)
        parts.append(chunk)
        n += len(chunk)
        i += 1
    return "".join(parts)


def _scaling(work: Path, version: str, sizes: list[float], runs: int, json_out: Path | None) -> int:
    from manager.catalog import Catalog
    from manager.overlays import apply, load_overlays

    src = pristine_tree(version)
    cat = work / "catalog"
    (cat / "overlays").mkdir(parents=True)
    for i in THREE:
        os.symlink(ROOT / "overlays" / i, cat / "overlays" / i)
    overlays = load_overlays(Catalog(cat))
    targets = sorted({t for o in overlays for t in o.manifest.targets})
    info = [p for p in src.iterdir() if p.name.endswith(".dist-info")]
    original = (src / CUDA).read_text()
    counter = iter(range(10**6))

    def slim(text: str) -> Path:
        root = work / f"scale-{next(counter)}"
        for d in info:
            shutil.copytree(d, root / d.name)
        for t in targets:
            (root / t).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / t, root / t)
        (root / CUDA).write_text(text)
        return root

    apply(overlays, slim(original))  # imports and first-use costs outside the timings
    rows = []
    for mib in sizes:
        text = _padded(original, mib)
        real_mib = len(text.encode()) / (1024 * 1024)
        walls, cpus = [], []
        for _ in range(runs if mib <= 1 else 1):
            root = slim(text)
            walls.append(_timed(lambda root=root: apply(overlays, root)))
            cpus.append(CPU[0])
            assert (root / CUDA).read_text() != text, "the padded target was not patched"
            shutil.rmtree(root)
        rows.append({"mib": round(real_mib, 3), "wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus),
                     "runs": len(walls)})
        r = rows[-1]
        r["cpu_s_per_mib"] = r["cpu_s"] / real_mib
        r["per_mib_vs_smallest"] = r["cpu_s_per_mib"] / rows[0]["cpu_s_per_mib"]
        print(f"{r['mib']:7.2f} MiB  wall {r['wall_s']:8.2f} s  cpu {r['cpu_s']:8.2f} s  "
              f"{r['cpu_s_per_mib']:7.2f} cpu-s/MiB  {r['per_mib_vs_smallest']:5.2f}x per MiB vs {rows[0]['mib']} MiB"
              f"  (median of {r['runs']})", flush=True)
    if json_out:
        json_out.write_text(json.dumps({"version": version, "scaling": rows}, indent=2) + "\n")
    return 0


def _bench(work: Path, version: str, runs: int, json_out: Path | None) -> int:
    pristine_tree(version)  # download/extract once, outside every timing
    cat = work / "catalog"
    (cat / "overlays").mkdir(parents=True)
    for i in THREE:
        os.symlink(ROOT / "overlays" / i, cat / "overlays" / i)
    cat_pr = work / "catalog-pr"
    (cat_pr / "overlays").mkdir(parents=True)
    os.symlink(ROOT / "overlays" / PR, cat_pr / "overlays" / PR)
    counter = iter(range(10**6))

    def fresh() -> Path:
        return copy_release(version, work / f"tree-{next(counter)}")

    py = sys.executable
    # what the `overlay` console script and the in-container bundle wrapper run
    cli = [py, "-c", "import sys; from manager.fastpath import main; sys.argv[0] = 'overlay'; main()"]
    fig: dict[str, float] = {}

    # --- first apply in a fresh process (imports included, interpreter start-up not) ---
    first_script = (
        "import time; t0 = time.perf_counter()\n"
        "import sys; from pathlib import Path\n"
        "from manager.catalog import Catalog\n"
        "from manager.overlays import apply, find_root, load_overlays\n"
        "r = apply(load_overlays(Catalog(Path(sys.argv[1]))), find_root(sys.argv[2]))\n"
        "assert r.changes\n"
        "print(time.perf_counter() - t0)\n"
    )
    firsts = []
    for _ in range(runs):
        root = fresh()
        out = subprocess.run([py, "-c", first_script, str(cat), str(root)], capture_output=True, text=True, cwd=ROOT)
        if out.returncode:
            raise SystemExit(out.stderr)
        firsts.append(float(out.stdout.strip().splitlines()[-1]))
    fig["ours_first_apply_in_process_s"] = statistics.median(firsts)

    # --- in-process, libcst and the engine already imported ---
    import libcst  # noqa: F401

    from manager.catalog import Catalog
    from manager.overlays import apply, find_root, load_overlays, status

    def ours_cold(catalog: Path) -> float:
        root = fresh()

        def run() -> None:
            r = apply(load_overlays(Catalog(catalog)), find_root(str(root)))
            assert r.changes and not r.fast_path

        return _timed(run)

    ours_cold(cat)  # warm-up: imports, first parse
    cpu: list[float] = []

    def ours_cold_cpu() -> float:
        dt = ours_cold(cat)
        cpu.append(CPU[0])
        return dt

    fig["ours_cold_apply_s"] = median_of(ours_cold_cpu, runs)
    fig["ours_cold_apply_cpu_s"] = statistics.median(cpu)
    fig["ours_cold_apply_pr40886_only_s"] = median_of(lambda: ours_cold(cat_pr), runs)

    applied = fresh()
    apply(load_overlays(Catalog(cat)), applied)

    def ours_noop() -> float:
        def run() -> None:
            r = apply(load_overlays(Catalog(cat)), find_root(str(applied)))
            assert r.fast_path and not r.changes

        return _timed(run)

    fig["ours_warm_noop_apply_s"] = median_of(ours_noop, max(runs, 21))

    def ours_status_ledger() -> float:
        return _timed(lambda: status(load_overlays(Catalog(cat)), find_root(str(applied))))

    fig["ours_status_ledger_s"] = median_of(ours_status_ledger, max(runs, 21))
    ov_loaded = load_overlays(Catalog(cat))
    fig["ours_warm_noop_apply_overlays_preloaded_s"] = median_of(
        lambda: _timed(lambda: apply(ov_loaded, applied)), max(runs, 21)
    )
    fig["ours_load_overlays_s"] = median_of(lambda: _timed(lambda: load_overlays(Catalog(cat))), max(runs, 21))
    assert proto_noop(str(cat), str(applied)) and not proto_noop(str(cat), str(fresh()))
    fig["proto_stdlib_noop_check_s"] = median_of(
        lambda: _timed(lambda: proto_noop(str(cat), str(applied))), max(runs, 21)
    )
    unpatched = fresh()
    fig["ours_status_sources_s"] = median_of(
        lambda: _timed(lambda: status(load_overlays(Catalog(cat)), unpatched, use_ledger=False)), runs
    )

    # --- baseline, in-process ---
    def base_cold() -> float:
        root = fresh()
        t = _timed(lambda: baseline_patch(str(root / GEMMA4), str(SNIPPET)))
        text = (root / GEMMA4).read_text()
        compile(text, GEMMA4, "exec")
        assert text.count("# overlay-regex:pr40886") == 1
        return t

    base_cold()
    fig["baseline_cold_insert_s"] = median_of(base_cold, runs)
    base_tree = fresh()
    baseline_patch(str(base_tree / GEMMA4), str(SNIPPET))
    fig["baseline_noop_s"] = median_of(
        lambda: _timed(lambda: baseline_patch(str(base_tree / GEMMA4), str(SNIPPET))), max(runs, 21)
    )

    # --- whole processes ---
    def ours_cold_proc() -> float:
        root = fresh()
        return _proc([*cli, "--catalog", str(cat), "apply", "--root", str(root)])

    fig["proc_ours_cold_apply_s"] = median_of(ours_cold_proc, runs)
    fig["proc_ours_warm_noop_apply_s"] = median_of(
        lambda: _proc([*cli, "--catalog", str(cat), "apply", "--root", str(applied)]), runs
    )
    # Without site start-up (`python -S`, this repo on PYTHONPATH) for both sides: the venv's
    # editable-install finder costs ~11 ms per process that an installed wheel or the
    # in-container bundle does not pay, and that says nothing about either patcher.
    fig["proc_ours_warm_noop_apply_nosite_s"] = median_of(
        lambda: _proc([py, "-S", *cli[1:], "--catalog", str(cat), "apply", "--root", str(applied)],
                      env={"PYTHONPATH": str(ROOT)}),
        runs,
    )
    fig["proc_baseline_noop_nosite_s"] = median_of(
        lambda: _proc([py, "-S", "-c", BASELINE + "\nprint(patch(sys.argv[1], sys.argv[2]))\n",
                       str(base_tree / GEMMA4), str(SNIPPET)]),
        runs,
    )
    fig["proc_ours_status_s"] = median_of(
        lambda: _proc([*cli, "--catalog", str(cat), "status", "--root", str(applied)]), runs
    )
    base_cmd = BASELINE + "\nprint(patch(sys.argv[1], sys.argv[2]))\n"

    def base_cold_proc() -> float:
        root = fresh()
        return _proc([py, "-c", base_cmd, str(root / GEMMA4), str(SNIPPET)])

    fig["proc_baseline_cold_insert_s"] = median_of(base_cold_proc, runs)
    fig["proc_baseline_noop_s"] = median_of(
        lambda: _proc([py, "-c", base_cmd, str(base_tree / GEMMA4), str(SNIPPET)]), runs
    )
    proto_cmd = PROTO_FASTPATH + "\nsys.exit(0 if noop(sys.argv[1], sys.argv[2]) else 2)\n"
    fig["proc_proto_stdlib_noop_check_s"] = median_of(
        lambda: _proc([py, "-c", proto_cmd, str(cat), str(applied)]), runs
    )
    fig["proc_python_startup_s"] = median_of(lambda: _proc([py, "-c", "pass"]), runs)

    ratios = {
        "cold_apply_set_vs_baseline": fig["ours_cold_apply_s"] / fig["baseline_cold_insert_s"],
        "cold_apply_pr40886_vs_baseline": fig["ours_cold_apply_pr40886_only_s"] / fig["baseline_cold_insert_s"],
        "warm_noop_vs_baseline_noop": fig["ours_warm_noop_apply_s"] / fig["baseline_noop_s"],
        "proc_cold_apply_vs_baseline": fig["proc_ours_cold_apply_s"] / fig["proc_baseline_cold_insert_s"],
        "proc_warm_noop_vs_baseline_noop": fig["proc_ours_warm_noop_apply_s"] / fig["proc_baseline_noop_s"],
        "proc_warm_noop_nosite_vs_baseline_noop_nosite": fig["proc_ours_warm_noop_apply_nosite_s"]
        / fig["proc_baseline_noop_nosite_s"],
        "proto_noop_vs_baseline_noop": fig["proto_stdlib_noop_check_s"] / fig["baseline_noop_s"],
        "proc_proto_noop_vs_baseline_noop": fig["proc_proto_stdlib_noop_check_s"] / fig["proc_baseline_noop_s"],
    }
    targets = {
        "cold apply of the set < 0.5 s (in-process)": fig["ours_cold_apply_s"] < 0.5,
        "cold apply of the set < 0.5 s (first in a process)": fig["ours_first_apply_in_process_s"] < 0.5,
        "cold apply <= 3x baseline (in-process, set)": ratios["cold_apply_set_vs_baseline"] <= 3,
        "cold apply <= 3x baseline (in-process, #40886 only)": ratios["cold_apply_pr40886_vs_baseline"] <= 3,
        "cold apply <= 3x baseline (processes)": ratios["proc_cold_apply_vs_baseline"] <= 3,
        "warm no-op <= 1.0x baseline no-op (in-process)": ratios["warm_noop_vs_baseline_noop"] <= 1.0,
        "warm no-op <= 1.0x baseline no-op (processes)": ratios["proc_warm_noop_vs_baseline_noop"] <= 1.0,
        "warm no-op <= 1.0x baseline no-op (processes, both without site)":
            ratios["proc_warm_noop_nosite_vs_baseline_noop_nosite"] <= 1.0,
    }

    load = os.getloadavg()
    print(f"vLLM {version}, {runs} runs per figure (no-op/status in-process: {max(runs, 21)}), median, "
          f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f}")
    fig_meta = {"loadavg_1m_end": load[0], "loadavg_5m_end": load[1], "cpus": os.cpu_count()}
    for k, v in fig.items():
        print(f"  {k:40s} {v * 1000:10.2f} ms")
    for k, v in ratios.items():
        print(f"  {k:40s} {v:10.2f} x")
    for k, ok in targets.items():
        print(f"  {'MET ' if ok else 'MISS'} {k}")
    if json_out:
        json_out.write_text(json.dumps({"version": version, "runs": runs, "figures_s": fig, "ratios": ratios,
                                        "machine": fig_meta, "targets_met": targets}, indent=2) + "\n")
    return 0


def _other_pythons(work: Path) -> dict[str, str]:
    """{"plainvenv": a venv of this python without pip or any .pth, "system": the system python3 when it
    is another python >= 3.10}: the interpreters the warm no-op pair is also timed under."""
    base = Path(getattr(sys, "_base_executable", sys.executable))
    plain = work / "plain-venv"
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(plain)], check=True)
    out = {"plainvenv": str(plain / "bin" / "python")}
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system:
        probe = subprocess.run([system, "-c", "import sys; print(sys.version_info >= (3, 10), sys.prefix)"],
                               capture_output=True, text=True)
        fields = probe.stdout.split()
        if (probe.returncode == 0 and fields[:1] == ["True"]
                and Path(fields[1]).resolve() != Path(sys.base_prefix).resolve()):
            out["system"] = system
    return out


def _compile_bytecode(tree: Path) -> None:
    """Byte-compile `tree`/manager into its __pycache__ directories, as `pip install` does for an
    installed wheel. Without it a checkout run with PYTHONDONTWRITEBYTECODE=1 (set on the shared
    machine) compiles every module of ours from source in every process, which an installed
    `overlay` never does."""
    import compileall

    compileall.compile_dir(str(tree / "manager"), quiet=1)


def _catalog(work: Path, name: str, ids) -> Path:
    cat = work / name
    (cat / "overlays").mkdir(parents=True)
    for i in ids:
        os.symlink(ROOT / "overlays" / i, cat / "overlays" / i)
    return cat


def _bench_plans(work: Path, version: str, runs: int, json_out: Path | None, before: Path | None = None,
                 short: int = 3) -> int:
    """Issue 14: first container start with a prepared plan, as processes, against the regex patcher.

    Runs are interleaved (one of each kind per round, on its own fresh copy; the short processes
    `short` times per round) so the load of the shared machine falls on every figure alike;
    medians. With `before` (a checkout of the code to
    compare with, e.g. main), each of our figures is also taken with that tree's `manager` (the
    processes run there: `python -c` puts the working directory first on sys.path), in the same
    rounds: "before" and "after" in one run."""
    pristine_tree(version)
    every = sorted(p.name for p in (ROOT / "overlays").iterdir() if (p / "overlay.yaml").is_file())
    cats = {"three": _catalog(work, "catalog", THREE), "pr": _catalog(work, "catalog-pr", [PR]),
            "all": _catalog(work, "catalog-all", every)}
    trees = {"": ROOT}
    if before is not None:
        trees["before_"] = Path(before).resolve()
    for tree in trees.values():
        _compile_bytecode(tree)
    # our package without bytecode (compiled from source in every process, as a checkout under
    # PYTHONDONTWRITEBYTECODE=1 runs it: the condition of runs E and F) for the warm and plan figures
    source_tree = work / "source-tree"
    shutil.copytree(ROOT / "manager", source_tree / "manager", ignore=shutil.ignore_patterns("__pycache__"))
    env_source = {"PYTHONDONTWRITEBYTECODE": "1"}
    py = sys.executable
    # plans are signed and verified as a bundle's are (issue 28): a plan key for the whole run
    # (a checkout from before plan keys ignores it)
    if not os.environ.get("OVERLAY_PLAN_KEY"):
        (work / "plan-key").write_bytes(os.urandom(32))
        os.environ["OVERLAY_PLAN_KEY"] = str(work / "plan-key")
    plans: dict[tuple[str, str], Path] = {}
    for tag, tree in trees.items():
        for c in ("three", "all"):
            plans[tag, c] = work / f"plans-{tag or 'after_'}{c}"
            prep = subprocess.run([py, "-c", "import sys; from manager.fastpath import main; main()", "--catalog",
                                   str(cats[c]), "prepare", "--vllm", version, "--out", str(plans[tag, c])],
                                  capture_output=True, text=True, cwd=tree)
            if prep.returncode:
                raise SystemExit(prep.stderr)
    counter = iter(range(10**6))

    def fresh() -> Path:
        return copy_release(version, work / f"tree-{next(counter)}")

    cli_code = "import sys; from manager.fastpath import main; sys.argv[0] = 'overlay'; main()"
    base_code = BASELINE + "\nprint(patch(sys.argv[1], sys.argv[2]))\n"
    cli = [py, "-c", cli_code]
    base_cmd = [py, "-c", base_code]
    others = _other_pythons(work)
    for other in others.values():  # our modules' bytecode for that python too (its own cache tag)
        subprocess.run([other, "-m", "compileall", "-q", str(ROOT / "manager")], check=True)
    env_noplan = {"OVERLAY_PLANS": "", "OVERLAY_PLAN_CACHE": ""}
    import resource

    samples: dict[str, list[float]] = {}

    def timed(key: str, args: list[str], env: dict | None = None, cwd: Path = ROOT) -> None:
        """One process: wall seconds under key, the child's CPU seconds (user + sys) under key_cpu."""
        full = dict(os.environ)
        full.update(env or {})
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(args, capture_output=True, text=True, env=full, cwd=cwd)
        dt = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise SystemExit(f"{key}: {' '.join(args[:2])} ... failed ({proc.returncode}): {proc.stderr[-2000:]}")
        samples.setdefault(key + "_s", []).append(dt)
        samples.setdefault(key + "_cpu_s", []).append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)

    applied = {}
    for tag, tree in trees.items():
        applied[tag] = fresh()
        timed("warmup", [*cli, "--catalog", str(cats["three"]), "apply", "--root", str(applied[tag])], env_noplan, tree)
    base_tree = fresh()
    timed("warmup", [*base_cmd, str(base_tree / GEMMA4), str(SNIPPET)])
    reference: dict[str, dict[str, bytes]] = {}

    def check(key: str, root: Path, cat: str) -> None:
        """Every apply of a catalog leaves the same bytes, whichever path (plan or engine) and tree."""
        try:
            led = json.loads((root / ".overlay-manager" / "ledger.json").read_text())
        except FileNotFoundError:
            raise SystemExit(f"{key}: no ledger written") from None
        got = {rel: (root / rel).read_bytes() if (root / rel).exists() else None for rel in sorted(led["observed"])}
        if cat not in reference:
            reference[cat] = got
        elif got != reference[cat]:
            raise SystemExit(f"{key}: the applied files differ from the first {cat} apply of this run")

    def first_apply(key: str, cat: str, tree: Path, root: Path, plan: Path | None, env: dict | None = None) -> None:
        args = [*cli, "--catalog", str(cats[cat]), "apply", "--root", str(root)]
        if plan is not None:
            timed(key, [*args, "--plans", str(plan)], env, tree)
        else:
            timed(key, args, {**env_noplan, **(env or {})}, tree)
        check(key, root, cat)

    for _ in range(runs):
        # the round's fresh copies first, then on disk (os.sync), so no figure waits on the
        # writeback of the copies (a container's image layers are on disk before it starts)
        pool = [fresh() for _ in range(short * (2 + 2 * len(trees)) + 3 * len(trees))]
        os.sync()
        for _ in range(short):  # the short processes `short` times a round: more samples, same interleaving
            root = pool.pop()
            timed("proc_baseline_cold_insert", [*base_cmd, str(root / GEMMA4), str(SNIPPET)])
            for tag, tree in trees.items():
                first_apply(f"proc_{tag}ours_cold_apply_plan", "three", tree, pool.pop(), plans[tag, "three"])
                first_apply(f"proc_{tag}ours_cold_apply_plan_all", "all", tree, pool.pop(), plans[tag, "all"])
            first_apply("proc_ours_cold_apply_plan_from_source", "three", source_tree, pool.pop(),
                        plans["", "three"], env_source)
            timed("proc_baseline_noop", [*base_cmd, str(base_tree / GEMMA4), str(SNIPPET)])
            for tag, tree in trees.items():
                timed(f"proc_{tag}ours_warm_noop_apply",
                      [*cli, "--catalog", str(cats["three"]), "apply", "--root", str(applied[tag])], env_noplan, tree)
            timed("proc_ours_warm_noop_apply_from_source",
                  [*cli, "--catalog", str(cats["three"]), "apply", "--root", str(applied[""])],
                  {**env_noplan, **env_source}, source_tree)
            timed("proc_python_startup", [py, "-c", "pass"])
            for tag, other in others.items():  # the warm no-op pair without the editable install's hooks
                timed(f"proc_{tag}_python_startup", [other, "-c", "pass"])
                timed(f"proc_{tag}_baseline_noop", [other, "-c", base_code, str(base_tree / GEMMA4), str(SNIPPET)])
                timed(f"proc_{tag}_ours_warm_noop_apply",
                      [other, "-c", cli_code, "--catalog", str(cats["three"]), "apply", "--root", str(applied[""])],
                      env_noplan, ROOT)
        for tag, tree in trees.items():
            for key, cat in (("cold_apply_noplan_pr40886", "pr"), ("cold_apply_noplan", "three"),
                             ("cold_apply_noplan_all", "all")):
                first_apply(f"proc_{tag}ours_{key}", cat, tree, pool.pop(), None)
        for p in work.glob("tree-*"):
            if p not in (base_tree, *applied.values()):
                shutil.rmtree(p)
    samples.pop("warmup_s")
    samples.pop("warmup_cpu_s")
    fig = {k: statistics.median(v) for k, v in samples.items()}
    ratios = {}
    for tag in trees:
        p = f"proc_{tag}ours_"
        ratios.update({
            f"{p}cold_apply_plan_vs_baseline_cold": fig[p + "cold_apply_plan_s"] / fig["proc_baseline_cold_insert_s"],
            f"{p}cold_apply_plan_vs_baseline_cold_cpu": fig[p + "cold_apply_plan_cpu_s"]
            / fig["proc_baseline_cold_insert_cpu_s"],
            f"{p}cold_apply_plan_vs_noplan": fig[p + "cold_apply_plan_s"] / fig[p + "cold_apply_noplan_s"],
            f"{p}warm_noop_vs_baseline_noop": fig[p + "warm_noop_apply_s"] / fig["proc_baseline_noop_s"],
        })
    for tag in trees:  # machine-independent-ish: in units of this run's `python -c pass`
        for key in ("cold_apply_noplan_pr40886", "cold_apply_noplan", "cold_apply_noplan_all"):
            ratios[f"proc_{tag}ours_{key}_in_python_startups"] = (fig[f"proc_{tag}ours_{key}_s"]
                                                                  / fig["proc_python_startup_s"])
    for tag in others:
        ratios[f"proc_{tag}_ours_warm_noop_vs_baseline_noop"] = (fig[f"proc_{tag}_ours_warm_noop_apply_s"]
                                                                 / fig[f"proc_{tag}_baseline_noop_s"])
    ratios["proc_ours_warm_noop_from_source_vs_baseline_noop"] = (fig["proc_ours_warm_noop_apply_from_source_s"]
                                                                  / fig["proc_baseline_noop_s"])
    ratios["proc_ours_cold_apply_plan_from_source_vs_baseline_cold"] = (
        fig["proc_ours_cold_apply_plan_from_source_s"] / fig["proc_baseline_cold_insert_s"])
    if before is not None:
        for k in [k for k in fig if k.startswith("proc_ours_") and k.endswith("_s") and "_from_source" not in k]:
            ratios[k[:-2] + "_after_vs_before"] = fig[k] / fig[k.replace("proc_ours_", "proc_before_ours_")]
    targets = {
        "cold first apply with a plan <= 1.5x regex cold insertion (processes)":
            ratios["proc_ours_cold_apply_plan_vs_baseline_cold"] <= 1.5,
        "cold first apply with a plan < 0.1 s": fig["proc_ours_cold_apply_plan_s"] < 0.1,
        "cold first apply without a plan < 0.8 s (#40886 alone, the issue's like-for-like)":
            fig["proc_ours_cold_apply_noplan_pr40886_s"] < 0.8,
        "cold first apply without a plan < 0.8 s (the three overlays)": fig["proc_ours_cold_apply_noplan_s"] < 0.8,
        "cold first apply without a plan < 0.8 s (the whole catalog)": fig["proc_ours_cold_apply_noplan_all_s"] < 0.8,
        "warm no-op <= 1.0x regex no-op (processes)": ratios["proc_ours_warm_noop_vs_baseline_noop"] <= 1.0,
    }
    for tag, other in others.items():
        where = "python -m venv --without-pip" if tag == "plainvenv" else other
        targets[f"warm no-op <= 1.0x regex no-op (processes, {tag}: {where})"] = (
            ratios[f"proc_{tag}_ours_warm_noop_vs_baseline_noop"] <= 1.0)
    load = os.getloadavg()
    print(f"vLLM {version}, prepared plans, {runs} interleaved rounds (short processes x{short}), median, "
          f"python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
          + (f", before = {trees['before_']}" if before is not None else ""))
    for k, v in fig.items():
        print(f"  {k:52s} {v * 1000:10.2f} ms  (min {min(samples[k]) * 1000:.2f})")
    for k, v in ratios.items():
        print(f"  {k:52s} {v:10.2f} x")
    for k, ok in targets.items():
        print(f"  {'MET ' if ok else 'MISS'} {k}")
    if json_out:
        json_out.write_text(json.dumps({"version": version, "runs": runs, "short": short, "figures_s": fig,
                                        "ratios": ratios, "samples_s": samples, "targets_met": targets,
                                        "before": str(trees.get("before_")) if before is not None else None,
                                        "machine": {"loadavg_end": load, "cpus": os.cpu_count()}}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
