"""The real vLLM 0.20.0 engine on the H200: #40886 generating, and the D=512 route A/B under CUDA graphs.

Runs on the GPU machine from what benchmarks/engine_gpu_prepare.py staged (driver: engine_gpu.sh):

    engine_gpu.py receive --manifest M --work W DIR     keep this call's pieces (sha256-checked) in W/in
    engine_gpu.py run --manifest M --work W --out OUT [--phases install,a,b,c,f,w] [--budget-s 540] [--tp N] [--dry-run]

`run` first installs what has arrived (once: join the parts, unpack vLLM without FA2, `pip install
--no-deps --target W/site` the dependency wheels, unpack the kernel cache, checkpoints and project),
makes four hard-linked copies of vLLM with different overlays applied by `overlay apply`
(stock; base = gemma4-convertor-per-layer; pr40886 = base + vllm-pr40886-gemma4-awq-moe-keys;
full = all four overlays), then runs each engine configuration in its own process:

a. #40886 A/B (eager) on the compressed-tensors W4A16 MoE checkpoints, group 32 (Marlin MoE) and
   group 16 (not Marlin: the Triton fused-MoE WNA16 path): base → the KeyError, pr40886 → greedy
   tokens, compared with transformers' forward pass (fp32, eager attention, on the GPU: the checkpoint
   factory's reference computation) over the dequantized checkpoint;
   plus stock vLLM on the dense checkpoint (the convertor's error, for context).
b. D=512 route A/B with CUDA graphs (no enforce_eager) on the full root: OVERLAY_D512=off (vLLM's
   Triton path) vs force (the sm70-d512-attention kernels, compute_70 PTX JIT-run on sm_90), fp16,
   dense and MoE: greedy tokens and logprobs, the marker lines the route logs in the engine-core
   process, and (dense) one long request through chunked prefill and split decode.
c. throughput, route off vs on (dense): prefill tokens/s, decode tokens/s (short and long context),
   medians of 3.
f. the whole SM70 attention family (issue 32), CUDA graphs on, the full root: $OVERLAY_SM70_ATTENTION=off vs
   force on checkpoints whose layers use every head dim between them (FAMILY_MODELS: dense-h256 = sliding 256 +
   global 512, Gemma-4's own pair, with the chunked 24K prompt; moe-h128 = 128 + 512; dense = 64 + 512), greedy
   tokens, teacher-forced errors of both arms against the fp32 reference (the tolerance rule below), and the
   route's marker lines (first decode / split decode / prefill / chunked prefill per head dim, fallback reasons).
w. the SM70 4-bit route (issue 29), eager, the w4 root (full + sm70-w4-gemm): $OVERLAY_W4=force on the tiny
   ct-w4a16-moe, ct-nvfp4-moe, ct-nvfp4-dense and ct-w4a16-dense (W4A16 dense Linear) checkpoints against the same
   weights dequantized through the same engine (the baseline of the tolerance rule), both scored by the fp32
   reference; the route's marker lines. The route arm names the WMMA decode ($OVERLAY_W4_DECODE=wmma); a third arm
   runs it with $OVERLAY_W4_DECODE=auto (the launcher's per-format choice of GEMV or WMMA decode, its default since
   the 2026-12-06 H200 run), judged against the same baseline and compared token by token with the WMMA-decode arm.
r. the attention route as the TritonAttentionImpl.forward edit vs as a registered CUSTOM backend (issue 32 point 3;
   benchmarks/sm70_backend_plugin.py): dense-h256, eager and CUDA graphs, off / edit / plugin: start time, decode
   time per step at batch 4 and 16, 4K prefill, greedy tokens (the "phase r" section below).

`--tp N` (default 1) starts every vLLM engine with `--tensor-parallel-size N` (LLM(tensor_parallel_size=N))
on the checkpoint kinds whose shapes divide by N (TP_CHECKPOINTS; stage them with engine_gpu_prepare.py
--tp N), and needs N visible GPUs: a wrong N, too few GPUs or a staging for another N is one line on
stderr and exit 1 before anything is installed. At N > 1 every served engine run also has a TP=1 twin on
the same checkpoint (`<name>-tp1`, greedy tokens only; the summary's `<name>-vs-tp1`), the references
score the TP=N runs as at TP=1, and the runs where #40886 loads the W4A16 experts must show its
`OVERLAY_TRACE=1` line (manager/overlays/trace.py) from every rank's pid (`<name>-trace`). The TP=2
path has not run on GPUs yet (issue 31 will run it on two H200s).

Writes OUT/results.json, OUT/results.md and OUT/logs.txt. `--dry-run` does the install (without
pip), the overlay applies and prints the planned engine runs (their engine flags), with no GPU and no
engine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOTS = {
    "stock": (),
    "base": ("gemma4-convertor-per-layer",),
    "pr40886": ("gemma4-convertor-per-layer", "vllm-pr40886-gemma4-awq-moe-keys"),
    "full": ("gemma4-convertor-per-layer", "vllm-pr40886-gemma4-awq-moe-keys", "dynamo-dict-caches",
             "sm70-d512-attention"),
    "plugin": ("gemma4-convertor-per-layer", "vllm-pr40886-gemma4-awq-moe-keys", "dynamo-dict-caches"),   # phase r
    "w4": ("gemma4-convertor-per-layer", "vllm-pr40886-gemma4-awq-moe-keys", "dynamo-dict-caches",
           "sm70-d512-attention", "sm70-w4-gemm"),
}
# the routes' log lines: the attention family's per-head-dim launch markers ("head_dim-D attention: decode ran on
# sm70-d512-attention kernels ...") and fallback reasons ("sm70 attention: ..."), and the 4-bit route's lines
MARKER_RE = re.compile(r"head_dim-\d+ attention:|sm70 attention|sm70-w4-gemm|sm70 w4|OVERLAY_W4")
MARKERS_KEPT = 40
# phase f: (run-name model key, checkpoint key) -- head dims (sliding + global) 256 + 512, 128 + 512, 64 + 512
FAMILY_MODELS = ("dense-h256", "moe-h128", "dense")
# phase w: the 4-bit checkpoints the route takes (each with its dequantized/ float model)
W4_MODELS = ("ct-w4a16-moe", "ct-nvfp4-moe", "ct-nvfp4-dense", "ct-w4a16-dense")
AWQ = "vllm-pr40886-gemma4-awq-moe-keys"
# checkpoint kind per run role and tensor-parallel size: the factory's TP2 kinds (testing/checkpoints.py:
# 2 KV heads on both layer types, 4 query heads, MoE intermediate 128) divide by 2; it has no group-16 TP=2 kind,
# so at TP=2 phase a runs group 32 (the Marlin MoE path) only. Same names as engine_gpu_prepare.CHECKPOINT_KINDS_TP.
TP_CHECKPOINTS = {
    1: {"dense": "dense", "moe": "moe", 32: "ct-w4a16-moe", 16: "ct-w4a16-moe-g16", "dense-h256": "dense-h256",
        "moe-h128": "moe-h128", "ct-w4a16-moe": "ct-w4a16-moe", "ct-nvfp4-moe": "ct-nvfp4-moe",
        "ct-nvfp4-dense": "ct-nvfp4-dense", "ct-w4a16-dense": "ct-w4a16-dense"},
    2: {"dense": "dense-tp2", "moe": "moe-tp2", 32: "ct-w4a16-moe-tp2"},
}
# Tolerances on the logprob of each greedy token while the token streams agree (stated up front):
TOL_W4A16 = 5e-2   # vLLM fp16 W4A16 kernels (fp16 activations) vs transformers fp32 on the dequantized weights
TOL_ROUTE = 1e-2   # fp16 D=512 kernels vs vLLM's fp16 Triton attention (same engine otherwise)
TOL_TP = 1e-2      # fp16 TP=N vs TP=1 on one checkpoint (the all-reduce sums per-rank partials in another order);
                   # derived from TOL_ROUTE, not measured: the CPU build's fp32 gap was 2.9e-05 (docs/engine.md)
# Teacher-forced accuracy (the fp32 reference scores the engine's own token streams, so one near-tie
# does not derail the rest): a configuration passes when its largest |logprob error| against the fp32
# reference is at most BASELINE_FACTOR x the baseline's + BASELINE_SLACK, the baseline being the same
# engine without the change under test (W4A16 + #40886: the same weights, dequantized, through the same
# fp16 engine's unquantized MoE path -- first pass used the separate unquantized MoE checkpoint, still
# reported as vs_unquantized_moe_checkpoint; the D=512 route: OVERLAY_D512=off, vLLM's Triton path).
# A position where the engine's token is not the reference's argmax counts as a near-tie when the reference puts it
# within the configuration's own allowed error of its top token; any other mismatch fails.
BASELINE_FACTOR = 1.5
BASELINE_SLACK = 1e-2
MAX_TOKENS = 16
LONG_PROMPT = 24576
LONG_TOKENS = 32
CHUNK = 4096       # max_num_batched_tokens: a 24K prompt is prefilled in 6 chunks
SEED = 1234
MIB = 1 << 20


def say(msg: str) -> None:
    print(f"[engine_gpu {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(MIB), b""):
            h.update(chunk)
    return h.hexdigest()


def load_manifest(path: Path) -> dict:
    return json.loads(Path(path).read_text())


# --- receive / install -------------------------------------------------------------------------


def receive(manifest: dict, work: Path, src: Path) -> dict:
    """Copy src's pieces into work/in after checking each one's sha256 (idempotent)."""
    pieces = {p["name"]: p for p in manifest["pieces"]}
    inbox = work / "in"
    inbox.mkdir(parents=True, exist_ok=True)
    got, bad = [], []
    for f in sorted(Path(src).iterdir()):
        p = pieces.get(f.name)
        if p is None:
            bad.append(f"{f.name}: not in the manifest")
            continue
        dest = inbox / f.name
        if dest.exists() and dest.stat().st_size == p["size"] and sha256_file(dest) == p["sha256"]:
            got.append(f.name)
            continue
        if sha256_file(f) != p["sha256"]:
            bad.append(f"{f.name}: sha256 mismatch")
            continue
        shutil.copyfile(f, dest.with_name(dest.name + ".tmp"))
        os.replace(dest.with_name(dest.name + ".tmp"), dest)
        got.append(f.name)
    have = {f.name for f in inbox.iterdir()}
    missing = sorted(set(pieces) - have)
    say(f"received {len(got)} piece(s) from {src}; {len(have & set(pieces))}/{len(pieces)} here"
        + (f"; missing {', '.join(missing)}" if missing else "; all pieces here"))
    for b in bad:
        say(f"REJECTED {b}")
    return {"received": got, "rejected": bad, "missing": missing}


def _join(manifest: dict, work: Path, group: str) -> Path:
    g = manifest["groups"][group]
    out = work / "joined" / group
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as f:
        for name in g["parts"]:
            with open(work / "in" / name, "rb") as part:
                shutil.copyfileobj(part, f, 16 * MIB)
    if sha256_file(out) != g["sha256"]:
        raise SystemExit(f"engine_gpu: joined {group} does not match its sha256 (a part is corrupt)")
    return out


def install(manifest: dict, work: Path, dry: bool = False, roots: set[str] | None = None) -> dict:
    """Join and unpack every group whose parts are all here (once each); build the overlay roots."""
    report = {}
    have = {f.name for f in (work / "in").iterdir()} if (work / "in").exists() else set()
    dest_of = {"vllm": work / "vllm", "kernels": work / "kernels", "checkpoints": work / "ckpt",
               "project": work / "project", "deps": work / "wheels"}
    for group, g in manifest["groups"].items():
        done = work / f".done-{group}"
        if done.exists():
            report[group] = "installed earlier"
            continue
        if not set(g["parts"]) <= have:
            report[group] = f"waiting for {len(set(g['parts']) - have)} part(s)"
            continue
        t0 = time.time()
        joined = _join(manifest, work, group)
        dest = dest_of[group]
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        with tarfile.open(joined) as t:
            t.extractall(dest, filter="tar") if sys.version_info >= (3, 12) else t.extractall(dest)
        if group == "deps" and not dry:
            wheels = sorted(str(p) for p in dest.glob("*.whl"))
            proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                                   "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(work / "site"),
                                   *wheels], capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"engine_gpu: pip install of the dependency wheels failed: {proc.stderr[-800:]}")
        joined.unlink()
        done.write_text("ok\n")
        report[group] = f"installed in {time.time() - t0:.1f} s"
    for group, r in report.items():
        say(f"{group}: {r}")
    if (work / ".done-vllm").exists() and (work / ".done-project").exists():
        report["roots"] = make_roots(work, roots)
    return report


def _env_for(work: Path, root: str | None = None, **extra: str) -> dict:
    paths = ([str(work / "roots" / root)] if root else []) + [str(work / "site"), str(work / "project")]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(extra)
    return env


def make_roots(work: Path, names: set[str] | None = None) -> dict:
    """Hard-linked copies of the unpacked vLLM with each root's overlays applied (once); `names`: only these."""
    out = {}
    for name, ids in ROOTS.items():
        if names is not None and name not in names:
            continue
        root = work / "roots" / name
        done = root / ".ready"
        if done.exists():
            out[name] = json.loads(done.read_text())
            continue
        if root.exists():
            shutil.rmtree(root)
        shutil.copytree(work / "vllm", root, copy_function=os.link)
        rec = {"overlays": list(ids)}
        if ids:
            # cwd=work: `python -m` puts the cwd first on sys.path, and the device runs commands in a copy of
            # the lead's checkout, whose own manager/ and overlays/ would be applied instead (seen on the H200)
            proc = subprocess.run([sys.executable, "-m", "manager", "apply", *ids, "--root", str(root)],
                                  capture_output=True, text=True, env=_env_for(work), cwd=str(work))
            rec["apply_rc"] = proc.returncode
            rec["apply"] = (proc.stderr + proc.stdout).strip().splitlines()[-len(ids) - 2:]
            if proc.returncode != 0:   # the runs on this root are skipped (run_one), the others go on
                rec["error"] = f"overlay apply {' '.join(ids)} failed: {(proc.stderr + proc.stdout)[-1500:]}"
                say(f"root {name}: {rec['error']}")
                out[name] = rec
                continue
        done.write_text(json.dumps(rec))
        say(f"root {name}: {', '.join(ids) or 'no overlays'}")
        out[name] = rec
    return out


# --- the planned engine runs -------------------------------------------------------------------


def prompts(n: int = 4, length: int = 24, vocab: int = 512, seed: int = SEED) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    lo = 8  # keep clear of pad/bos/eos ids at the start of a tiny vocabulary
    return [[rng.randrange(lo, vocab) for _ in range(length + 3 * i)] for i in range(n)]


def long_prompt() -> list[int]:
    import random

    rng = random.Random(SEED + 1)
    return [rng.randrange(8, 512) for _ in range(LONG_PROMPT)]


def plan(work: Path, phases: set[str], tp: int = 1) -> list[dict]:
    ck = work / "ckpt"
    kinds = TP_CHECKPOINTS[tp]
    runs: list[dict] = []
    if "a" in phases:
        runs.append({"name": "a-stock-dense", "phase": "a", "root": "stock", "model": str(ck / kinds["dense"]),
                     "eager": True, "expect_error": True})
        runs.append({"name": "a-moe-baseline", "phase": "a", "root": "pr40886", "model": str(ck / kinds["moe"]),
                     "eager": True})
        runs.append({"name": "a-moe-reference", "phase": "a", "kind": "reference", "model": str(ck / kinds["moe"]),
                     "score": ["a-moe-baseline"]})
        for g in (32, 16):
            if g not in kinds:
                continue
            m = str(ck / kinds[g])
            runs.append({"name": f"a-g{g}-unpatched", "phase": "a", "root": "base", "model": m, "eager": True,
                         "expect_error": True, "group": g})
            # #40886's remapped keys are loaded in each rank's load_weights: its trace line from every rank pid
            runs.append({"name": f"a-g{g}-patched", "phase": "a", "root": "pr40886", "model": m, "eager": True,
                         "group": g, "expect_trace": [AWQ]})
            # the same fp16 engine on the same weights, dequantized (the unquantized MoE path): the baseline
            # that differs from the patched run only by the W4A16 kernels and #40886's key remap
            runs.append({"name": f"a-g{g}-dequant", "phase": "a", "root": "pr40886",
                         "model": str(Path(m) / "dequantized"), "eager": True, "group": g})
            runs.append({"name": f"a-g{g}-reference", "phase": "a", "kind": "reference",
                         "model": str(Path(m) / "dequantized"), "group": g,
                         "score": [f"a-g{g}-patched", f"a-g{g}-dequant"]})
            runs.append({"name": f"a-g{g}-reference16", "phase": "a", "kind": "reference", "dtype": "float16",
                         "model": str(Path(m) / "dequantized"), "group": g,
                         "score": [f"a-g{g}-patched", f"a-g{g}-dequant"]})
    # b and f: the attention route off vs forced under CUDA graphs (+ the fp32 reference scoring both arms)
    ab = [("b", model, model == "dense" and "b" in phases, model == "dense" and "c" in phases, "b" in phases)
          for model in ("dense", "moe") if "b" in phases or "c" in phases]
    ab += [("f", model, model == FAMILY_MODELS[0], False, True) for model in FAMILY_MODELS if "f" in phases]
    for ph, model, long, thr, short in ab:
        m = str(ck / kinds[model])
        for mode in ("off", "force"):
            runs.append({"name": f"{ph}-{model}-{mode}", "phase": ph, "root": "full", "model": m, "eager": False,
                         "d512": mode, "long": long, "throughput": thr, "short": short})
        if short:
            runs.append({"name": f"{ph}-{model}-reference", "phase": ph, "kind": "reference", "model": m,
                         "score": [f"{ph}-{model}-off", f"{ph}-{model}-force"]})
    if "w" in phases:
        for model in W4_MODELS:
            if model not in kinds:
                continue
            m = str(ck / kinds[model])
            # the WMMA decode named (the launcher's default is "auto" since 2026-12-06; the auto arm below)
            runs.append({"name": f"w-{model}-route", "phase": "w", "root": "w4", "model": m, "eager": True,
                         "w4": "force", "w4_decode": "wmma"})
            runs.append({"name": f"w-{model}-dequant", "phase": "w", "root": "w4",
                         "model": str(Path(m) / "dequantized"),
                         "eager": True, "w4": "force"})
            runs.append({"name": f"w-{model}-auto", "phase": "w", "root": "w4", "model": m, "eager": True,
                         "w4": "force", "w4_decode": "auto"})
            runs.append({"name": f"w-{model}-reference", "phase": "w", "kind": "reference",
                         "model": str(Path(m) / "dequantized"),
                         "score": [f"w-{model}-route", f"w-{model}-dequant", f"w-{model}-auto"]})
    runs += plan_route_cost(ck, kinds) if "r" in phases and R_MODEL in kinds else []   # phase r (issue 32 point 3)
    out: list[dict] = []
    for r in runs:
        if r.get("kind") == "reference":
            out.append(r)
            continue
        r["tp"] = tp
        if tp > 1 and not r.get("expect_error"):
            # the TP=1 engine on the same checkpoint, just before: greedy tokens to compare the TP=N run with
            out.append(dict(r, name=f"{r['name']}-tp1", tp=1, long=False, throughput=False, short=True,
                            twin_of=r["name"]))
        out.append(r)
    return out


def llm_kwargs(spec: dict) -> dict:
    """The LLM(...) arguments of one engine run (pure: the dry-run prints them as engine flags)."""
    long_len = LONG_PROMPT + LONG_TOKENS + 64
    kw = dict(model=spec["model"], dtype="float16", skip_tokenizer_init=True, seed=0,
              gpu_memory_utilization=0.40, max_num_seqs=64, enable_prefix_caching=False,
              enforce_eager=spec.get("eager", False), tensor_parallel_size=spec.get("tp", 1))
    if spec.get("long") or spec.get("throughput"):
        kw.update(max_model_len=long_len, max_num_batched_tokens=CHUNK, enable_chunked_prefill=True,
                  hf_overrides={"max_position_embeddings": long_len})
    else:
        kw.update(max_model_len=2048)
    kw.update(route_cost_kwargs(spec))   # phase r
    if not kw["enforce_eager"]:
        kw["compilation_config"] = {"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64]}
    return kw


def engine_flags(kw: dict) -> list[str]:
    """vLLM's engine-argument flags for LLM kwargs (`tensor_parallel_size=2` -> `--tensor-parallel-size 2`)."""
    out = []
    for k, v in kw.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            out.append(flag)
        elif v is False:   # enable_prefix_caching=False -> --no-enable-prefix-caching; others are off by default
            if k.startswith("enable_"):
                out.append("--no-" + k.replace("_", "-"))
            continue
        else:
            out += [flag, json.dumps(v) if isinstance(v, (dict, list)) else str(v)]
    return out


def visible_gpus(env: dict, smi_lines: list[str] | None) -> int | None:
    """GPUs a CUDA process would see: `nvidia-smi -L`'s count (None: no nvidia-smi), capped by
    CUDA_VISIBLE_DEVICES when set; without nvidia-smi, CUDA_VISIBLE_DEVICES' entries (or None)."""
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    listed = None if cvd is None else len([x for x in cvd.split(",") if x.strip()])
    if smi_lines is None:
        return listed
    n = len([ln for ln in smi_lines if ln.startswith("GPU ")])
    return n if listed is None else min(n, listed)


def _smi_lines() -> list[str] | None:
    if not shutil.which("nvidia-smi"):
        return None
    proc = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return proc.stdout.splitlines() if proc.returncode == 0 else []


def check_tp(tp: int, manifest: dict, dry: bool, env: dict | None = None, smi_lines=...) -> str | None:
    """Why --tp N cannot run here (one line), or None. Checked before anything is installed."""
    if tp not in TP_CHECKPOINTS:
        return (f"--tp {tp}: no checkpoint kinds whose shapes divide by {tp} "
                f"(sizes with kinds: {', '.join(map(str, TP_CHECKPOINTS))})")
    staged = set((manifest.get("info") or {}).get("checkpoints") or {})
    need = sorted(set(TP_CHECKPOINTS[tp].values()))
    if staged and not set(need) & staged:   # a subset may be staged (engine_gpu_prepare.py --kinds); runs skip the rest
        return (f"--tp {tp}: the manifest's checkpoints are {', '.join(sorted(staged))}; --tp {tp} needs "
                f"{', '.join(need)} (stage them with engine_gpu_prepare.py --tp {tp})")
    n = visible_gpus(os.environ if env is None else env, _smi_lines() if smi_lines is ... else smi_lines)
    if n is None and dry:
        return None   # a dry run on a machine without GPUs: nothing to count
    if (n or 0) < tp:
        return (f"--tp {tp}: needs {tp} visible GPU(s), this machine shows {n or 0} "
                "(nvidia-smi -L, CUDA_VISIBLE_DEVICES)")
    return None


def rank_pids(log: str, tp: int) -> dict[str, int]:
    """Each rank's process from vLLM's log prefixes: `(Worker_TP<i> pid=N)` under the multiprocessing
    executor (TP > 1); at TP=1 the worker runs inside the engine core, `(EngineCore_DP0 pid=N)`."""
    pat = r"^\((Worker_TP\d+) pid=(\d+)\)" if tp > 1 else r"^\((EngineCore_DP0) pid=(\d+)\)"
    return {m.group(1): int(m.group(2)) for m in re.finditer(pat, log, re.M)}


def trace_by_rank(log: str, tp: int, expect: list[str], read_trace) -> dict:
    """Which expected overlays traced in which rank's pid (read_trace: manager.overlays.trace.read_trace)."""
    ranks = rank_pids(log, tp)
    by_pid: dict[int, set[str]] = {}
    for t in read_trace(log):
        by_pid.setdefault(t.pid, set()).add(t.overlay)
    missing = {name: sorted(set(expect) - by_pid.get(pid, set())) for name, pid in ranks.items()}
    missing = {k: v for k, v in missing.items() if v}
    return {"ranks": ranks, "expect": list(expect), "traced": {str(k): sorted(v) for k, v in sorted(by_pid.items())},
            "missing": missing, "every_rank": len(ranks) == tp and not missing}


# --- worker: one engine configuration in its own process ---------------------------------------


def _lp_record(out) -> dict:
    c = out.outputs[0]
    steps = []
    for tok, lp in zip(c.token_ids, c.logprobs or [], strict=False):
        steps.append({"token": int(tok), "logprob": float(lp[tok].logprob),
                      "top": sorted(((int(k), float(v.logprob)) for k, v in lp.items()), key=lambda kv: -kv[1])[:5]})
    return {"tokens": [int(t) for t in c.token_ids], "steps": steps}


def worker(spec: dict) -> dict:
    import torch
    from vllm import LLM, SamplingParams

    kw = llm_kwargs(spec)
    # no CUDA call before LLM(): an initialised CUDA context would make vLLM spawn instead of fork
    res: dict = {"name": spec["name"], "pid": os.getpid(), "torch": torch.__version__,
                 "llm_kwargs": {k: v for k, v in kw.items()}}
    import vllm

    res["vllm"] = vllm.__version__
    res["vllm_file"] = vllm.__file__
    t0 = time.time()
    llm = LLM(**kw)
    res["start_s"] = round(time.time() - t0, 1)
    res["device"] = torch.cuda.get_device_name(0)
    res["gpus"] = torch.cuda.device_count()
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=5, ignore_eos=True, detokenize=False)
    if spec.get("short", True):
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts()], greedy, use_tqdm=False)
        res["short"] = [_lp_record(o) for o in outs]
    if spec.get("long"):
        p = long_prompt()
        sp = SamplingParams(temperature=0.0, max_tokens=LONG_TOKENS, logprobs=5, ignore_eos=True, detokenize=False)
        t = time.perf_counter()
        o = llm.generate([{"prompt_token_ids": p}], sp, use_tqdm=False)[0]
        res["long"] = _lp_record(o) | {"prompt_tokens": LONG_PROMPT, "seconds": round(time.perf_counter() - t, 3)}
    if spec.get("throughput"):
        res["throughput"] = throughput(llm)
    if spec.get("timing"):   # phase r
        res["timing"] = step_timing(llm)
    return res


def timed_generate(llm, ps: list[list[int]], n: int) -> float:
    """Seconds of one greedy generate of `n` tokens for each prompt of `ps` (phases c and r)."""
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)
    t = time.perf_counter()
    llm.generate([{"prompt_token_ids": p} for p in ps], sp, use_tqdm=False)
    return time.perf_counter() - t


def throughput(llm) -> dict:
    """Prefill and decode tokens/s (median of 3 after a warm-up) for three shapes."""

    def timed(ps, n):
        return timed_generate(llm, ps, n)

    cases = {"prefill 8x4096": (8, 4096, 1), "decode 64x256 +128": (64, 256, 128), "decode 8x8192 +128": (8, 8192, 128)}
    out = {}
    for label, (b, L, n) in cases.items():
        ps = prompts(b, L)
        ps = [p[:L] for p in ps]
        timed(ps, n)  # warm-up
        if n == 1:
            ts = [timed(ps, 1) for _ in range(3)]
            med = statistics.median(ts)
            out[label] = {"tokens_per_s": round(b * L / med, 1), "seconds": [round(x, 4) for x in ts]}
        else:
            t1 = [timed(ps, 1) for _ in range(3)]
            tn = [timed(ps, n) for _ in range(3)]
            dec = statistics.median(tn) - statistics.median(t1)
            out[label] = {"tokens_per_s": round(b * (n - 1) / dec, 1),
                          "seconds_prefill_only": [round(x, 4) for x in t1],
                          "seconds_total": [round(x, 4) for x in tn]}
    return out


def reference(spec: dict) -> dict:
    """transformers' greedy decode over the (dequantized) float checkpoint: fp32 (or spec["dtype"]), eager
    attention, on the GPU.

    The same computation as the checkpoint factory's `reference()` (testing.checkpoints), with the
    model loaded once and run on the GPU (the factory's CPU loop took minutes per checkpoint); no TF32.
    """
    import torch
    import transformers

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.time()
    dtype = getattr(torch, spec.get("dtype", "float32"))
    model = transformers.AutoModelForCausalLM.from_pretrained(spec["model"], dtype=dtype,
                                                              attn_implementation="eager").to(dev).eval()
    res = {"name": spec["name"], "transformers": transformers.__version__, "torch": torch.__version__,
           "dtype": str(dtype).removeprefix("torch."),
           "model": spec["model"], "class": type(model).__name__, "device": dev, "short": []}
    with torch.no_grad():
        for p in prompts():
            ids = list(p)
            steps = []
            for _ in range(MAX_TOKENS):
                logits = model(torch.tensor([ids], device=dev)).logits[0, -1].float()
                lp = torch.log_softmax(logits, -1)
                vals, idx = torch.topk(lp, 5)
                tok = int(idx[0])
                steps.append({"token": tok, "logprob": float(vals[0]),
                              "top": [[int(i), float(v)] for i, v in zip(idx, vals, strict=False)]})
                ids.append(tok)
            res["short"].append({"tokens": [x["token"] for x in steps], "steps": steps})
        res["scored"] = {}
        for name, streams in (spec.get("sequences") or {}).items():
            res["scored"][name] = {part: [score_stream(model, prompt, toks, dev) for prompt, toks in pairs]
                                   for part, pairs in streams.items()}
    res["seconds"] = round(time.time() - t0, 1)
    return res


def score_stream(model, prompt: list[int], tokens: list[int], dev: str) -> dict:
    """Teacher-forced: the fp32 reference's view of every position of an engine's greedy stream.

    One forward pass over prompt + tokens; for generated position i: the reference logprob of the
    engine's token, the reference's own argmax and its logprob.
    """
    import torch

    ids = torch.tensor([list(prompt) + list(tokens)], device=dev)
    logits = model(ids).logits[0].float()
    lp = torch.log_softmax(logits[len(prompt) - 1: len(prompt) - 1 + len(tokens)], -1)
    top_lp, top = lp.max(-1)
    tok = torch.tensor(tokens, device=dev)
    mine = lp.gather(-1, tok[:, None])[:, 0]
    return {"ref_logprob": [float(x) for x in mine], "ref_argmax": [int(x) for x in top],
            "ref_max_logprob": [float(x) for x in top_lp]}


# --- comparison --------------------------------------------------------------------------------


def compare(a: list[dict], b: list[dict]) -> dict:
    """Token agreement and the largest |logprob difference| of the chosen tokens while they agree."""
    equal = total = 0
    worst = 0.0
    first_div = []
    for x, y in zip(a, b, strict=False):
        n = min(len(x["tokens"]), len(y["tokens"]))
        k = next((i for i in range(n) if x["tokens"][i] != y["tokens"][i]), n)
        first_div.append(None if k == n else k)
        equal += k
        total += n
        for i in range(k):
            worst = max(worst, abs(x["steps"][i]["logprob"] - y["steps"][i]["logprob"]))
    return {"tokens_equal": equal, "tokens": total, "identical": equal == total and len(a) == len(b),
            "max_abs_logprob_diff": worst, "first_divergence": first_div}


def teacher_forced(run: dict, scored: dict) -> dict:
    """An engine run against the fp32 reference's scoring of its own streams (see BASELINE_FACTOR)."""
    errs, mismatches, total = [], [], 0
    for part in ("short", "long"):
        recs = run.get(part)
        if recs is None or part not in scored:
            continue
        recs = recs if isinstance(recs, list) else [recs]
        for si, (rec, sc) in enumerate(zip(recs, scored[part], strict=False)):
            for i, st in enumerate(rec["steps"]):
                total += 1
                errs.append(abs(st["logprob"] - sc["ref_logprob"][i]))
                if st["token"] != sc["ref_argmax"][i]:
                    mismatches.append({"part": part, "stream": si, "step": i, "engine": st["token"],
                                       "reference": sc["ref_argmax"][i],
                                       "ref_gap": sc["ref_max_logprob"][i] - sc["ref_logprob"][i]})
    return {"positions": total, "argmax_agree": total - len(mismatches), "mismatches": mismatches,
            "max_abs_logprob_err": max(errs) if errs else None,
            "mean_abs_logprob_err": statistics.fmean(errs) if errs else None}


def judge(tf: dict, baseline: dict) -> dict:
    """Pass when the error stays within BASELINE_FACTOR x baseline + BASELINE_SLACK, and every
    argmax mismatch is a near-tie within that allowance."""
    allowed = BASELINE_FACTOR * baseline["max_abs_logprob_err"] + BASELINE_SLACK
    ties_ok = all(m["ref_gap"] <= allowed for m in tf["mismatches"])
    return {"allowed": allowed, "baseline_max_abs_logprob_err": baseline["max_abs_logprob_err"],
            "within": tf["max_abs_logprob_err"] <= allowed and ties_ok, "mismatches_are_near_ties": ties_ok}


def first_error_line(log: str) -> str | None:
    """The root-cause exception line of a failed engine start (not vLLM's wrapper)."""
    lines = [ln.strip() for ln in log.splitlines()]
    pat = re.compile(r"(?:^|\s)((?:[\w.]+\.)?\w*(?:Error|Exception)\b: .*)$")
    for ln in lines:
        m = pat.search(ln)
        if m and "Engine core initialization failed" not in ln and "Traceback" not in ln:
            return m.group(1)[:400]
    return None


# --- run ---------------------------------------------------------------------------------------


def run_one(spec: dict, work: Path, out: Path, timeout: float, dry: bool) -> dict:
    env_extra = {"OVERLAY_KERNEL_CACHE": str(work / "kernels"), "OVERLAY_MANAGER_HOME": str(work / "project"),
                 "PYTHONUNBUFFERED": "1", "VLLM_LOGGING_LEVEL": "INFO", "TOKENIZERS_PARALLELISM": "false"}
    if "d512" in spec:   # the family's switch, and its old name (read when the new one is unset)
        env_extra["OVERLAY_SM70_ATTENTION"] = env_extra["OVERLAY_D512"] = spec["d512"]
    if "w4" in spec:
        env_extra["OVERLAY_W4"] = spec["w4"]
    if "w4_decode" in spec:   # the sm70-w4-gemm launcher's decode kernel (wmma | gemv)
        env_extra["OVERLAY_W4_DECODE"] = spec["w4_decode"]
    env_extra["OVERLAY_TRACE"] = "1"   # the runtime marker: one line per patched block per process
    env = route_cost_env(spec, work, _env_for(work, spec.get("root"), **env_extra))   # phase r: the plugin arm
    if spec.get("kind") == "reference":   # the image's transformers, none of the carried packages
        env = dict(os.environ, PYTHONPATH=str(work / "project"), PYTHONUNBUFFERED="1")
    spec_path = out / "specs" / f"{spec['name']}.json"
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    spec_path.write_text(json.dumps(spec))
    res_path = out / "specs" / f"{spec['name']}.result.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "worker", str(spec_path), str(res_path)]
    flags = [] if spec.get("kind") == "reference" else engine_flags(llm_kwargs(spec))
    if dry:
        say(f"dry-run {spec['name']}: PYTHONPATH={env['PYTHONPATH']} OVERLAY_D512={env.get('OVERLAY_D512', '-')} "
            f"model={spec['model']} ({'present' if Path(spec['model']).is_dir() else 'MISSING'})"
            + (f" engine: {' '.join(flags)}" if flags else " transformers reference"))
        return {"name": spec["name"], "dry_run": True, "model_present": Path(spec["model"]).is_dir(),
                "engine_flags": flags, "tp": spec.get("tp"), "expect_trace": spec.get("expect_trace", [])}
    if not Path(spec["model"]).is_dir():
        say(f"skip {spec['name']}: {spec['model']} was not staged")
        return {"name": spec["name"], "skipped": "checkpoint not staged"}
    root = spec.get("root")
    if root and not (work / "roots" / root / ".ready").exists():
        say(f"skip {spec['name']}: root {root} was not made (overlay apply failed; see install.roots)")
        return {"name": spec["name"], "skipped": f"root {root} not made"}
    say(f"start {spec['name']}")
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=str(work))
        log, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        log = ((exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes)
               else (exc.stdout or "")) + \
              ((exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or ""))
        rc = "timeout"
    res = json.loads(res_path.read_text()) if res_path.exists() else {"name": spec["name"]}
    res.update(rc=rc, wall_s=round(time.time() - t0, 1))
    if spec.get("twin_of"):
        res["twin_of"] = spec["twin_of"]
    if rc != 0:
        res["error"] = first_error_line(log)
    res["markers"] = [ln.strip()[:300] for ln in log.splitlines() if MARKER_RE.search(ln)][:MARKERS_KEPT]
    res["tp"] = spec.get("tp", 1)
    if spec.get("expect_trace"):
        res["trace"] = trace_by_rank(log, spec.get("tp", 1), spec["expect_trace"], _read_trace(work))
    (out / "logs").mkdir(exist_ok=True)
    (out / "logs" / f"{spec['name']}.log").write_text(log)
    say(f"done {spec['name']}: rc={rc} in {res['wall_s']} s" + (f" error: {res.get('error')}" if rc != 0 else ""))
    return res


def _read_trace(work: Path):
    """manager.overlays.trace.read_trace from the unpacked project (only re and dataclasses at import)."""
    proj = str(work / "project")
    if proj not in sys.path:
        sys.path.insert(0, proj)
    from manager.overlays.trace import read_trace

    return read_trace


def summarize(results: dict) -> dict:
    s: dict = {}
    for name, r in results.items():   # TP=N vs its TP=1 twin on the same checkpoint, and the rank traces
        twin = results.get(f"{name}-tp1")
        if twin and twin.get("twin_of", name) == name and "short" in r and "short" in twin:
            c = compare(r["short"], twin["short"]) | {"tolerance": TOL_TP, "tp": r.get("tp")}
            c["within_tolerance"] = c["identical"] and c["max_abs_logprob_diff"] <= TOL_TP
            s[f"{name}-vs-tp1"] = c
        if r.get("trace"):
            s[f"{name}-trace"] = r["trace"]
    for g in (32, 16):
        pa, un, ref = (results.get(f"a-g{g}-{k}") for k in ("patched", "unpatched", "reference"))
        if pa and ref and "short" in pa and "short" in ref:
            s[f"a-g{g}"] = compare(pa["short"], ref["short"]) | {"tolerance": TOL_W4A16}
            s[f"a-g{g}"]["within_tolerance"] = s[f"a-g{g}"]["max_abs_logprob_diff"] <= TOL_W4A16
        if un:
            s.setdefault(f"a-g{g}", {})["unpatched_error"] = un.get("error")
    base_run, base_ref = results.get("a-moe-baseline"), results.get("a-moe-reference")
    baseline = None
    if base_run and base_ref and "a-moe-baseline" in base_ref.get("scored", {}):
        baseline = teacher_forced(base_run, base_ref["scored"]["a-moe-baseline"])
        s["a-moe-baseline-teacher-forced"] = baseline
    for g in (32, 16):
        pa, dq = results.get(f"a-g{g}-patched"), results.get(f"a-g{g}-dequant")
        if pa and dq and "short" in pa and "short" in dq:   # same weights, same engine: W4A16 kernels vs fp16 GEMMs
            s[f"a-g{g}-vs-dequant-engine"] = compare(pa["short"], dq["short"])
        for suffix, ref in (("", results.get(f"a-g{g}-reference")), ("-fp16ref", results.get(f"a-g{g}-reference16"))):
            scored = (ref or {}).get("scored", {})
            if not (pa and f"a-g{g}-patched" in scored):
                continue
            tf = teacher_forced(pa, scored[f"a-g{g}-patched"])
            same = teacher_forced(dq, scored[f"a-g{g}-dequant"]) if dq and f"a-g{g}-dequant" in scored else None
            if same and same["max_abs_logprob_err"] is not None:
                s[f"a-g{g}-dequant-teacher-forced{suffix}"] = same
                tf |= judge(tf, same)   # the baseline: the same weights through the same engine, unquantized
            if not suffix and baseline and baseline["max_abs_logprob_err"] is not None:
                tf["vs_unquantized_moe_checkpoint"] = judge(tf, baseline)
            s[f"a-g{g}-teacher-forced{suffix}"] = tf
    for ph, model in [("b", "dense"), ("b", "moe"), *(("f", m) for m in FAMILY_MODELS)]:
        off, force = results.get(f"{ph}-{model}-off"), results.get(f"{ph}-{model}-force")
        if off and force and "short" in off and "short" in force:
            c = compare(off["short"], force["short"]) | {"tolerance": TOL_ROUTE}
            c["within_tolerance"] = c["max_abs_logprob_diff"] <= TOL_ROUTE
            c["markers_force"] = force.get("markers", [])
            c["markers_off"] = off.get("markers", [])
            s[f"{ph}-{model}"] = c
        ref = results.get(f"{ph}-{model}-reference")
        for mode, r in (("off", off), ("force", force)):
            if r and ref and "short" in r and "short" in ref:
                s[f"{ph}-{model}-{mode}-vs-transformers"] = compare(r["short"], ref["short"])
        scored = (ref or {}).get("scored", {})
        judged_pair(s, scored, f"{ph}-{model}-off", off, f"{ph}-{model}-force", force)
        if off and force and "long" in off and "long" in force:
            s[f"{ph}-{model}-long"] = compare([off["long"]], [force["long"]]) | {
                "tolerance": TOL_ROUTE, "seconds_off": off["long"]["seconds"],
                "seconds_force": force["long"]["seconds"]}
        if off and force and "throughput" in off and "throughput" in force:
            s[f"c-{model}"] = {k: {"off": off["throughput"][k]["tokens_per_s"],
                                   "force": force["throughput"][k]["tokens_per_s"],
                                   "ratio_force_over_off": round(force["throughput"][k]["tokens_per_s"]
                                                                 / off["throughput"][k]["tokens_per_s"], 3)}
                               for k in off["throughput"]}
    for model in W4_MODELS:   # the 4-bit route vs the same weights dequantized through the same engine
        route, dq, ref = (results.get(f"w-{model}-{k}") for k in ("route", "dequant", "reference"))
        if route and dq and "short" in route and "short" in dq:
            s[f"w-{model}-vs-dequant-engine"] = compare(route["short"], dq["short"]) | {
                "markers_route": route.get("markers", []), "markers_dequant": dq.get("markers", [])}
        scored = (ref or {}).get("scored", {})
        judged_pair(s, scored, f"w-{model}-dequant", dq, f"w-{model}-route", route)
        auto = results.get(f"w-{model}-auto")
        if auto and route and "short" in auto and "short" in route:
            s[f"w-{model}-auto-vs-wmma-decode"] = compare(auto["short"], route["short"]) | {
                "markers_auto": auto.get("markers", [])}
        judged_pair(s, scored, f"w-{model}-dequant", dq, f"w-{model}-auto", auto)
    s.update(summarize_route_cost(results))   # phase r
    return s


def judged_pair(s: dict, scored: dict, base_name: str, base: dict | None, run_name: str, run: dict | None) -> None:
    """The teacher-forced errors of a baseline run and of the run under test, the latter judged against the former
    (summary keys `<name>-teacher-forced`), when the reference scored both."""
    if base and run and base_name in scored and run_name in scored:
        tf_base = teacher_forced(base, scored[base_name])
        tf_run = teacher_forced(run, scored[run_name])
        s[f"{base_name}-teacher-forced"] = tf_base
        s[f"{run_name}-teacher-forced"] = tf_run | judge(tf_run, tf_base)


def markdown(doc: dict) -> str:
    lines = [f"# engine_gpu results ({doc['date']})", ""]
    for r in doc["runs"].values():
        lines.append(f"- {r['name']}: rc={r.get('rc')} wall={r.get('wall_s')} s start={r.get('start_s')} s"
                     + (f" error=`{r.get('error')}`" if r.get("error") else ""))
    lines += ["", "```json", json.dumps(doc["summary"], indent=1), "```"]
    return "\n".join(lines) + "\n"


def run(manifest: dict, work: Path, out: Path, phases: set[str], budget_s: float, dry: bool,
        only: tuple[str, ...] = (), tp: int = 1, skip_done: bool = False) -> int:
    start = time.time()
    out.mkdir(parents=True, exist_ok=True)
    doc: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "phases": sorted(phases), "tp": tp, "runs": {}}
    res_file = out / "results.json"
    if res_file.exists():
        doc["runs"] = json.loads(res_file.read_text()).get("runs", {})
    # the roots the planned runs use, and `full` (the import check's)
    doc["install"] = install(manifest, work, dry,
                             {"full"} | {r["root"] for r in plan(work, phases, tp) if r.get("root")})
    missing = [g for g, r in doc["install"].items() if str(r).startswith("waiting")]
    if missing:
        say(f"cannot run yet: {', '.join(missing)} incomplete")
        res_file.write_text(json.dumps(doc, indent=1))
        return 1
    if dry:
        doc["roots"] = doc["install"].get("roots")
    else:   # one cheap import first: a missing module stops here, not once per engine start
        proc = subprocess.run([sys.executable, "-c",
                               "import vllm, vllm.entrypoints.llm, vllm.model_executor.models.gemma4;"
                               "print('import ok', vllm.__version__)"], capture_output=True, text=True,
                              env=_env_for(work, "full"))
        doc["import_check"] = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        say(f"import check: {' | '.join(doc['import_check'])}")
        if proc.returncode != 0:
            res_file.write_text(json.dumps(doc, indent=1))
            return 1
    for spec in plan(work, phases, tp):
        if only and not any(spec["name"].startswith(o) for o in only):
            continue
        if skip_done and doc["runs"].get(spec["name"], {}).get("rc") == 0:   # done by an earlier call into --out
            continue
        left = budget_s - (time.time() - start)
        if left < 45 and not dry:
            say(f"skip {spec['name']}: {left:.0f} s of the budget left")
            doc["runs"][spec["name"]] = {"name": spec["name"], "skipped": "budget"}
            continue
        if spec.get("score"):   # the engine streams this reference scores, from the runs before it
            spec["sequences"] = {}
            for name in spec["score"]:
                r = doc["runs"].get(name, {})
                streams = {}
                if "short" in r:
                    streams["short"] = [(p, rec["tokens"]) for p, rec in zip(prompts(), r["short"], strict=False)]
                if "long" in r:
                    streams["long"] = [(long_prompt(), r["long"]["tokens"])]
                if streams:
                    spec["sequences"][name] = streams
        limit = min(left - 15, 240 if spec.get("throughput") or spec.get("long") or spec.get("score") else 180)
        doc["runs"][spec["name"]] = run_one(spec, work, out, limit, dry)
        doc["summary"] = summarize(doc["runs"])
        res_file.write_text(json.dumps(doc, indent=1))   # partial results survive a kill
    doc["summary"] = summarize(doc["runs"])
    res_file.write_text(json.dumps(doc, indent=1))
    (out / "results.md").write_text(markdown(doc))
    logs = sorted((out / "logs").glob("*.log")) if (out / "logs").exists() else []
    with open(out / "logs.txt", "w") as f:
        for p in logs:
            text = p.read_text().splitlines()
            keep = [ln for ln in text if MARKER_RE.search(ln) or "Error" in ln or "error" in ln][:60]
            f.write(f"===== {p.name} ({len(text)} lines): markers/errors, then the last 40 lines\n")
            f.write("\n".join([*keep, "-----", *text[-40:]]) + "\n")
    if not dry and (out / "logs").exists():
        shutil.rmtree(out / "logs")   # only 8 files come back: the digest above replaces them
        shutil.rmtree(out / "specs", ignore_errors=True)
    say(f"results in {res_file}")
    return 0


# === phase r: the route as an edit vs as a registered backend (issue 32 point 3; branch h-backend) ================
# Three arms on the dense-h256 checkpoint (sliding 256 + global 512: Gemma-4's pair), eager and CUDA graphs:
#   off     the full root, $OVERLAY_SM70_ATTENTION=off: vLLM's Triton path (the edit present, declining)
#   edit    the full root, force: the TritonAttentionImpl.forward edit routes every layer
#   plugin  the `plugin` root (the full root's overlays minus sm70-d512-attention: no edit), force,
#           LLM(attention_backend="CUSTOM"), benchmarks/sm70_backend_plugin.py installed as a distribution with a
#           `vllm.general_plugins` entry point in W/plugin-site (on this arm's PYTHONPATH only): the same route module
#           (the overlay's files, loaded by the plugin) behind a registered TritonAttentionBackend subclass
# Measured per engine: start time (LLM()), decode time per step at batch 4 and 16 ((T(1 + R_STEPS tokens) -
# T(1 token)) / R_STEPS, median of 3 after a warm-up; and the median interval between LLMEngine.step() outputs),
# prefill of one R_PREFILL-token prompt (median of 3), greedy tokens (the summary compares them across arms).
R_MODEL = "dense-h256"
R_ARMS = ("off", "edit", "plugin")
R_BATCHES = (4, 16)
R_STEPS = 64
R_PREFILL = 4096
R_MAX_LEN = 8192
PLUGIN_ROOT = "plugin"
PLUGIN_FILE = "benchmarks/sm70_backend_plugin.py"
MARKER_RE = re.compile(MARKER_RE.pattern + r"|AttentionBackendEnum\.\w+ backend")   # + vLLM's "Using ... backend."


def plan_route_cost(ck: Path, kinds: dict) -> list[dict]:
    """Phase r's engine runs (pure)."""
    m = str(ck / kinds[R_MODEL])
    runs = []
    for mode in ("eager", "graphs"):
        for arm in R_ARMS:
            runs.append({"name": f"r-{mode}-{arm}", "phase": "r", "root": PLUGIN_ROOT if arm == "plugin" else "full",
                         "model": m, "eager": mode == "eager", "d512": "off" if arm == "off" else "force",
                         "short": True, "timing": True, "plugin": arm == "plugin"})
    return runs


def route_cost_kwargs(spec: dict) -> dict:
    """Phase r's additions to LLM(...) (pure): room for the prefill prompt, and the plugin arm's backend."""
    kw: dict = {}
    if spec.get("timing"):
        kw.update(max_model_len=R_MAX_LEN, max_num_batched_tokens=R_MAX_LEN,
                  hf_overrides={"max_position_embeddings": R_MAX_LEN})
    if spec.get("plugin"):
        kw["attention_backend"] = "CUSTOM"
    return kw


def plugin_site(work: Path) -> Path:
    """W/plugin-site: the plugin module + its dist-info (entry point), written by the plugin's own helper."""
    import importlib.util

    src = work / "project" / PLUGIN_FILE
    spec = importlib.util.spec_from_file_location("sm70_backend_plugin_staging", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    site = work / "plugin-site"
    mod.write_dist_info(site, src)
    return site


def route_cost_env(spec: dict, work: Path, env: dict) -> dict:
    """The plugin arm's environment: W/plugin-site first on PYTHONPATH (every engine process inherits it)."""
    if not spec.get("plugin"):
        return env
    site = plugin_site(work) if (work / "project" / PLUGIN_FILE).exists() else work / "plugin-site"
    return dict(env, PYTHONPATH=os.pathsep.join([str(site), env.get("PYTHONPATH", "")]))


def step_timing(llm) -> dict:
    """Decode time per step at each batch, the step-output interval, and the prefill of one long prompt."""

    def timed(ps, n):
        return timed_generate(llm, ps, n)

    out: dict = {}
    for b in R_BATCHES:
        ps = prompts(b, 32)
        timed(ps, R_STEPS + 1)   # warm-up
        t1 = [timed(ps, 1) for _ in range(3)]
        tn = [timed(ps, R_STEPS + 1) for _ in range(3)]
        rec = {"decode_ms_per_step": round((statistics.median(tn) - statistics.median(t1)) / R_STEPS * 1e3, 4),
               "seconds_1": [round(x, 4) for x in t1], "seconds_n": [round(x, 4) for x in tn]}
        try:
            rec["step_interval_ms_median"] = round(_step_intervals(llm, ps) * 1e3, 4)
        except Exception as exc:  # noqa: BLE001 - the engine API differs by release; the timing above stands
            rec["step_interval_error"] = f"{type(exc).__name__}: {exc}"[:300]
        out[f"decode b{b}"] = rec
    p = long_prompt()[:R_PREFILL]
    timed([p], 1)   # warm-up
    ts = [timed([p], 1) for _ in range(3)]
    out[f"prefill 1x{R_PREFILL}"] = {"seconds_median": round(statistics.median(ts), 4),
                                     "seconds": [round(x, 4) for x in ts]}
    return out


def _step_intervals(llm, ps) -> float:
    """Median time between LLMEngine.step() calls once every sequence decodes (the first two steps dropped)."""
    from vllm import SamplingParams

    eng = llm.llm_engine
    sp = SamplingParams(temperature=0.0, max_tokens=R_STEPS + 2, ignore_eos=True, detokenize=False)
    for i, p in enumerate(ps):
        eng.add_request(f"r-step-{len(ps)}-{i}-{time.monotonic_ns()}", {"prompt_token_ids": p}, sp)
    ts = []
    while eng.has_unfinished_requests():
        t = time.perf_counter()
        eng.step()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts[2:]) if len(ts) > 2 else float("nan")


def summarize_route_cost(results: dict) -> dict:
    """Per mode: greedy tokens of each arm vs off, start time, decode ms/step and prefill s with ratios to off."""
    s: dict = {}
    for mode in ("eager", "graphs"):
        arms = {a: results.get(f"r-{mode}-{a}") for a in R_ARMS}
        off = arms["off"]
        if not off or "timing" not in off:
            continue
        row: dict = {}
        for a, r in arms.items():
            if not r or "timing" not in r:
                continue
            t, t0 = r["timing"], off["timing"]
            rec: dict = {"start_s": r.get("start_s"), "markers": r.get("markers", [])[:8]}
            if a != "off" and "short" in r and "short" in off:
                rec["tokens_identical_to_off"] = compare(r["short"], off["short"])["identical"]
            for key in t:
                field = "seconds_median" if key.startswith("prefill") else "decode_ms_per_step"
                rec[key] = {field: t[key][field], "ratio_to_off": round(t[key][field] / t0[key][field], 3)}
                if "step_interval_ms_median" in t[key]:
                    rec[key]["step_interval_ms_median"] = t[key]["step_interval_ms_median"]
            row[a] = rec
        s[f"r-{mode}"] = row
    return s

# === end of phase r ============================================================================

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("receive")
    r.add_argument("src", type=Path)
    r.add_argument("--manifest", type=Path, required=True)
    r.add_argument("--work", type=Path, required=True)
    u = sub.add_parser("run")
    u.add_argument("--manifest", type=Path, required=True)
    u.add_argument("--work", type=Path, required=True)
    u.add_argument("--out", type=Path, required=True)
    u.add_argument("--phases", default="install,a,b,c", help="comma list of install, a, b, c, f, w, r")
    u.add_argument("--budget-s", type=float, default=540.0, help="stop starting engines after this many seconds")
    u.add_argument("--only", default="", help="comma list of run-name prefixes to keep (e.g. b-dense,b-moe)")
    u.add_argument("--tp", type=int, default=1,
                   help="tensor-parallel size of every engine (needs that many GPUs and the kinds staged with --tp)")
    u.add_argument("--skip-done", action="store_true",
                   help="skip the runs --out's results.json already holds with rc 0 (a run split over device calls)")
    u.add_argument("--dry-run", action="store_true")
    w = sub.add_parser("worker")
    w.add_argument("spec", type=Path)
    w.add_argument("result", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "worker":
        spec = json.loads(args.spec.read_text())
        res = reference(spec) if spec.get("kind") == "reference" else worker(spec)
        args.result.write_text(json.dumps(res))
        return 0
    if not args.manifest.is_file():
        print(f"engine_gpu: {args.manifest}: no such manifest (run engine_gpu_prepare.py first)", file=sys.stderr)
        return 1
    manifest = load_manifest(args.manifest)
    if args.cmd == "receive":
        rep = receive(manifest, args.work, args.src)
        return 1 if rep["rejected"] else 0
    phases = {p.strip() for p in args.phases.split(",") if p.strip()}
    bad = phases - {"install", "a", "b", "c", "f", "w", "r"}
    if bad:
        print(f"engine_gpu: --phases: unknown phase(s) {', '.join(sorted(bad))} (install, a, b, c, f, w, r)",
              file=sys.stderr)
        return 1
    why = check_tp(args.tp, manifest, args.dry_run)
    if why:
        print(f"engine_gpu: {why}", file=sys.stderr)
        return 1
    only = tuple(o.strip() for o in args.only.split(",") if o.strip())
    return run(manifest, args.work, args.out, phases, args.budget_s, args.dry_run, only, args.tp, args.skip_done)


if __name__ == "__main__":
    sys.exit(main())
