"""The real vLLM engine on a CPU machine for the tests: the OpenAI server, vLLM's loader, reference comparisons.

The venv recipe, its cache layout and locks, and the isolated overlay roots live in manager/engines/venv.py
(shipped: `overlay upstream-tests` runs in those venvs) and are re-exported here.

Tensor parallelism on CPU (issue 30): `serve(..., extra_args=TP2_ARGS, extra_env=TP2_ENV)` starts two ranks, each
bound to its own core; `load_with_vllm_tp` runs vLLM's loader as `world` rank processes (gloo).

Test support (not in the wheel): the server, the loader script and the comparisons share one engine venv layout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from collections.abc import Iterator


from manager.errors import EngineError

from manager.engines.venv import (  # noqa: F401 - re-exported: the tests import them from here
    DEFAULT_TRANSFORMERS, DEFAULT_VLLM, IMPORT_CHECK, TORCH_PINS, EngineEnv, _run, cached_engine_env, engine_env,
    engine_environ, engines_dir, isolated_root, stop, transformers_layer,
)


def overlay_cli(*args: str, cwd: str | os.PathLike[str] | None = None,
                env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real `overlay` CLI of this checkout (`python -m manager ...`) and return the finished process."""
    env = dict(os.environ)
    project = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = project + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "manager", *args], cwd=cwd, env=env, capture_output=True, text=True)


# ------------------------------------------------------------------------------------------------ server


@dataclasses.dataclass(frozen=True)
class Server:
    base_url: str
    port: int
    log_path: Path
    pid: int
    start_seconds: float

    def post(self, path: str, payload: dict, timeout: float = 300) -> dict:
        req = urllib.request.Request(self.base_url + path, data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise EngineError(f"POST {path}: HTTP {exc.code}: {exc.read()[:500]!r}") from None

    def complete(self, prompt_ids: list[int] | tuple[int, ...], n_tokens: int, logprobs: int = 5) -> Completion:
        """Greedy completion of token ids with top-`logprobs` logprobs (EOS ignored)."""
        body = self.post("/v1/completions", {
            "model": "tiny", "prompt": list(prompt_ids), "max_tokens": n_tokens, "temperature": 0.0,
            "logprobs": logprobs, "ignore_eos": True, "return_tokens_as_token_ids": True,
        })
        lp = body["choices"][0]["logprobs"]
        tokens = tuple(_token_id(t) for t in lp["tokens"])
        tops = tuple(tuple(sorted(((_token_id(k), float(v)) for k, v in d.items()), key=lambda kv: -kv[1]))
                     for d in lp["top_logprobs"])
        return Completion(tokens, tuple(float(x) for x in lp["token_logprobs"]), tops)


@dataclasses.dataclass(frozen=True)
class Completion:
    tokens: tuple[int, ...]
    token_logprobs: tuple[float, ...]
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...]


def compare_to_reference(served: Completion, reference, tol: float) -> float:
    """Assert `served` (the engine's greedy completion) equals a checkpoints.Reference: the same greedy tokens,
    the same top-2 order at every position, and top-k logprobs within `tol` on the tokens both top-k sets hold.
    Returns the largest logprob gap."""
    assert served.tokens == reference.tokens, f"served {served.tokens} != transformers {reference.tokens}"
    worst = 0.0
    for pos, (s_top, r_top) in enumerate(zip(served.top_logprobs, reference.top_logprobs, strict=False)):
        r, s = dict(r_top), dict(s_top)
        # the top-k sets agree except possibly at the boundary; compare on the common tokens (at least the best 2)
        assert [t for t, _ in r_top[:2]] == [t for t, _ in s_top[:2]], f"position {pos}: top-2 differ"
        for t in (t for t in r if t in s):
            worst = max(worst, abs(r[t] - s[t]))
    assert worst <= tol, f"max |logprob gap| {worst:.2e} > {tol:.0e}"
    return worst


def _token_id(text: str) -> int:
    # return_tokens_as_token_ids: tokens read "token_id:<n>"
    if not text.startswith("token_id:"):
        raise EngineError(f"expected a 'token_id:<n>' token, got {text!r}")
    return int(text.split(":", 1)[1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Two tensor-parallel ranks on the CPU build (issue 30; docs/engine.md "TP=2"): `--tensor-parallel-size 2` with each
# rank's OpenMP threads bound to its own core. vLLM's CPU platform runs TP through its multiprocessing executor (the
# "uni" backend is rewritten to "mp": vllm/platforms/cpu.py) with a gloo group; VLLM_CPU_KVCACHE_SPACE (1 GiB,
# engine_environ) is per rank. "0|1" names cores 0 and 1, which every machine with >= 2 CPUs has.
TP2_ARGS = ("--tensor-parallel-size", "2")
TP2_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}


class EngineStartFailed(EngineError):
    """The server process exited before /health answered (its log holds the reason)."""

    def __init__(self, message: str, log_path: Path, returncode: int | None) -> None:
        super().__init__(message)
        self.log_path = log_path
        self.returncode = returncode


@contextlib.contextmanager
def serve(env: EngineEnv, root: Path, model: str | os.PathLike[str], log_path: str | os.PathLike[str], *,
          transformers_target: Path | None = None, dtype: str = "float32", max_model_len: int = 256,
          timeout: float | None = None, extra_args: tuple[str, ...] = (),
          fill_uninitialized: bool = False, extra_env: dict[str, str] | None = None) -> Iterator[Server]:
    """Start `python -m vllm.entrypoints.openai.api_server` on `model` with `root` first on PYTHONPATH.

    Waits for /health (raises EngineStartFailed with the log's last error line if the process exits first or the
    timeout passes); always stops the server (SIGTERM to its process group, then SIGKILL).
    `fill_uninitialized`: every engine process fills uninitialised tensors (`torch.empty`) with NaN (PyTorch's
    `torch.utils.deterministic.fill_uninitialized_memory`, through a `sitecustomize` first on PYTHONPATH), so a
    read of memory nobody wrote shows up every time instead of by chance.
    `extra_env`: added to the engine's environment last (e.g. TP2_ENV for `--tensor-parallel-size 2`).
    """
    if timeout is None:  # 35-50 s on an idle 2-core machine; several minutes when it is shared
        timeout = float(os.environ.get("OVERLAY_ENGINE_START_TIMEOUT", "900"))
    port = _free_port()
    log_path = Path(log_path)
    cmd = [str(env.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
           "--max-model-len", str(max_model_len), "--enforce-eager", "--max-num-seqs", "4",
           "--max-logprobs", "20", "--seed", "0", *extra_args]
    environ = engine_environ(env, root, transformers_target=transformers_target, extra=extra_env)
    if fill_uninitialized:
        environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(_fill_uninitialized_dir(log_path.parent)), environ.get("PYTHONPATH")) if p)
    t0 = time.monotonic()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=environ, start_new_session=True, cwd=str(log_path.parent))
    try:
        url = f"http://127.0.0.1:{port}"
        while True:
            rc = proc.poll()
            if rc is not None:
                raise EngineStartFailed(f"vLLM server exited with {rc} before it was healthy: "
                                        f"{last_error(log_path.read_text(errors='replace'))}", log_path, rc)
            if time.monotonic() - t0 > timeout:
                raise EngineStartFailed(f"vLLM server not healthy after {timeout:.0f} s (log: {log_path})",
                                        log_path, None)
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1)
        yield Server(url, port, log_path, proc.pid, time.monotonic() - t0)
    finally:
        stop(proc)


_FILL_UNINITIALIZED = """\
# written by testing.engine.serve(fill_uninitialized=True): NaN in every uninitialised tensor
import torch

torch.use_deterministic_algorithms(True, warn_only=True)
torch.utils.deterministic.fill_uninitialized_memory = True
"""


def _fill_uninitialized_dir(parent: Path) -> Path:
    d = parent / "fill-uninitialized"
    d.mkdir(exist_ok=True)
    f = d / "sitecustomize.py"
    if not f.is_file() or f.read_text() != _FILL_UNINITIALIZED:
        f.write_text(_FILL_UNINITIALIZED)
    return d


def last_error(log: str) -> str:
    """The last `SomeError: message` line of a Python traceback in a log ('' when none)."""
    import re

    found = re.findall(r"^(?:\(\S+ pid=\d+\) )?([A-Za-z_][\w.]*(?:Error|Exception)(?::.*)?)$", log, re.M)
    return found[-1].strip() if found else ""


def run_engine_python(env: EngineEnv, root: Path | None, code: str, *, transformers_target: Path | None = None,
                      timeout: float = 600, cwd: str | os.PathLike[str] | None = None
                      ) -> subprocess.CompletedProcess[str]:
    """Run `code` with the engine venv's python, `root` first on PYTHONPATH (e.g. vLLM's loader in-process)."""
    return subprocess.run([str(env.python), "-c", code], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=engine_environ(env, root, transformers_target=transformers_target))


# ------------------------------------------------------------------------------- vLLM's loader, in-process

# Runs in the engine venv (it does not import `manager`): builds the real model class of a checkpoint from vLLM's
# own config, drives its load_weights over the checkpoint's safetensors (vLLM's iterator) with the model dtype as
# torch's default (as vLLM's loader), and compares every loaded fused-MoE expert parameter with the checkpoint's
# fused 3-D tensor (at TP > 1: with this rank's slice of it); it also reports the parameter bytes the rank holds
# and each attention layer's KV bytes per token (its KV-cache spec). It stops before
# process_weights_after_loading (the CUDA/Triton-only repack step on CPU builds). Prints one JSON object.
# argv: checkpoint [rank world port] (load_with_vllm_tp runs one process per rank).
LOADER_SCRIPT = r'''
import glob, json, os, socket, sys, traceback

def expected_slice(t, proj, suffix, rank, world):
    """The part of a fused checkpoint expert tensor ([E, out, in]) rank `rank` of `world` holds: FusedMoE shards the
    intermediate dim (gate_up: the gate and the up half each split in `world` rows; down: its input columns, which
    packed int4 / group scales split the same way)."""
    import torch
    if world == 1:
        return t
    if proj == "gate_up_proj":
        inter = t.shape[1] // 2
        n = inter // world
        gate, up = t[:, :inter], t[:, inter:]
        return torch.cat([gate[:, rank * n:(rank + 1) * n], up[:, rank * n:(rank + 1) * n]], dim=1)
    n = t.shape[2] // world
    return t[:, :, rank * n:(rank + 1) * n]

def main(ckpt, rank=0, world=1, port=0):
    out = {"stage": "import", "rank": rank, "world": world, "pid": os.getpid()}
    try:
        import torch
        from safetensors import safe_open
        from vllm.config import set_current_vllm_config
        from vllm.distributed import init_distributed_environment, initialize_model_parallel
        from vllm.engine.arg_utils import EngineArgs
        from vllm.model_executor.model_loader.utils import initialize_model
        from vllm.model_executor.model_loader.weight_utils import safetensors_weights_iterator
        out["stage"] = "config"
        cfg = EngineArgs(model=ckpt, dtype="bfloat16", enforce_eager=True, max_model_len=256,
                         tensor_parallel_size=world, seed=0).create_engine_config()
        with set_current_vllm_config(cfg):
            if not port:
                s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
            init_distributed_environment(world, rank, f"tcp://127.0.0.1:{port}", rank, backend="gloo")
            initialize_model_parallel(world, 1)
            out["stage"] = "init"
            from vllm.utils.torch_utils import set_default_torch_dtype
            # the model's dtype as default while building and loading, as vLLM's model loader does
            # (model_loader/base_loader.py): parameters in the served dtype, not float32
            with set_default_torch_dtype(cfg.model_config.dtype):
                model = initialize_model(vllm_config=cfg)
                out["model_class"] = type(model).__name__
                files = sorted(glob.glob(os.path.join(ckpt, "*.safetensors")))
                out["stage"] = "load_weights"
                loaded = model.load_weights(safetensors_weights_iterator(files, False))
            out["loaded"] = len(loaded)
            # what this rank holds: parameter bytes, and each attention layer's KV bytes per token (its KV-cache
            # spec's page size / block size) with its sliding window (None: full attention)
            out["param_bytes"] = sum(q.numel() * q.element_size() for q in model.parameters())
            kv = {}
            for lname, layer in cfg.compilation_config.static_forward_context.items():
                spec = layer.get_kv_cache_spec(cfg) if hasattr(layer, "get_kv_cache_spec") else None
                if spec is not None:
                    kv[lname] = [spec.page_size_bytes // spec.block_size, getattr(spec, "sliding_window", None)]
            out["kv_per_token"] = kv
        out["stage"] = "compare"
        ck = {}
        for f in files:
            with safe_open(f, "pt") as fh:
                for k in fh.keys():
                    ck[k] = fh.get_tensor(k)
        params = dict(model.named_parameters())
        compared, equal, bad = 0, 0, []
        for k, t in sorted(ck.items()):
            if ".experts." not in k or t.dim() != 3:
                continue
            layer = k.split(".layers.")[1].split(".")[0]
            stem = k.rsplit(".", 1)[1]  # gate_up_proj_packed, down_proj_scale, ...
            proj, suffix = stem.rsplit("_", 1)  # gate_up_proj / down_proj, packed / scale
            w = "w13" if proj == "gate_up_proj" else "w2"
            pname = f"model.layers.{layer}.moe.experts.{w}_weight_{suffix}"
            p = params.get(pname)
            if p is None:
                bad.append(f"{k}: no parameter {pname}")
                continue
            part = expected_slice(t, proj, suffix, rank, world)
            for e in range(t.shape[0]):
                compared += 1
                got = p.data[e]
                if getattr(p, "is_transposed", False):
                    got = got.t()
                exp = part[e]
                if tuple(got.shape) == tuple(exp.shape) and torch.equal(got.to(torch.float64), exp.to(torch.float64)):
                    equal += 1
                else:
                    bad.append(f"{pname}[{e}] shape {tuple(got.shape)} vs checkpoint {k}[{e}] {tuple(exp.shape)}")
        import hashlib
        experts = {n: q for n, q in sorted(params.items()) if ".moe.experts." in n}
        out["layer0_shapes"] = {n.rsplit(".", 1)[1]: list(q.shape) for n, q in experts.items()
                                if ".layers.0." in n}
        digest = hashlib.sha256()
        for q in experts.values():
            digest.update(q.data.contiguous().view(torch.uint8).numpy().tobytes())
        out["experts_sha256"] = digest.hexdigest()
        out.update(ok=True, stage="done", compared=compared, equal=equal, mismatches=bad[:10],
                   quant_method=type(model.model.layers[0].moe.experts.quant_method).__name__)
    except BaseException as exc:
        out.update(ok=False, error_type=type(exc).__name__, error=str(exc),
                   traceback=traceback.format_exc()[-3000:])
    print("LOADER-RESULT " + json.dumps(out), flush=True)

if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:5]))
'''


@dataclasses.dataclass(frozen=True)
class LoadResult:
    ok: bool
    stage: str
    error_type: str | None
    error: str | None
    compared: int        # fused expert tensors x experts compared
    equal: int           # of those, bit-identical to the checkpoint
    mismatches: tuple[str, ...]
    quant_method: str | None
    stderr: str          # the process's stderr (vLLM logs, overlay-trace lines)
    rank: int = 0        # tensor-parallel rank of the process (load_with_vllm_tp), 0 of world 1 otherwise
    world: int = 1
    pid: int | None = None
    layer0_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()  # layer 0's expert parameters as this rank holds them
    experts_sha256: str | None = None  # of every expert parameter this rank holds (ranks' shards differ)
    param_bytes: int | None = None     # bytes of every parameter this rank holds after load_weights
    # attention layer -> (KV bytes per token on this rank, sliding window or None), from vLLM's KV-cache specs
    kv_per_token: tuple[tuple[str, int, int | None], ...] = ()


def load_with_vllm(env: EngineEnv, root: Path, checkpoint: str | os.PathLike[str], workdir: Path, *,
                   transformers_target: Path | None = None, timeout: float = 600) -> LoadResult:
    """Drive vLLM's weight loader on the real model class of `checkpoint`, with `root` first on PYTHONPATH."""
    script = Path(workdir) / "vllm_load_check.py"
    script.write_text(LOADER_SCRIPT)
    env_vars = engine_environ(env, root, transformers_target=transformers_target)
    proc = subprocess.run([str(env.python), str(script), str(checkpoint)], capture_output=True, text=True,
                          timeout=timeout, env=env_vars, cwd=str(workdir))
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("LOADER-RESULT ")), None)
    if line is None:
        raise EngineError(f"vLLM loader check printed no result (exit {proc.returncode}): "
                          f"{last_error(proc.stderr) or proc.stderr[-500:]}")
    return _load_result(line, proc.stderr)


def _load_result(line: str, stderr: str) -> LoadResult:
    d = json.loads(line.split(" ", 1)[1])
    return LoadResult(d["ok"], d["stage"], d.get("error_type"), d.get("error"), d.get("compared", 0),
                      d.get("equal", 0), tuple(d.get("mismatches", ())), d.get("quant_method"), stderr,
                      d.get("rank", 0), d.get("world", 1), d.get("pid"),
                      tuple((k, tuple(v)) for k, v in sorted(d.get("layer0_shapes", {}).items())),
                      d.get("experts_sha256"), d.get("param_bytes"),
                      tuple((k, v[0], v[1]) for k, v in sorted(d.get("kv_per_token", {}).items())))


def load_with_vllm_tp(env: EngineEnv, root: Path, checkpoint: str | os.PathLike[str], workdir: Path, *,
                      world: int = 2, transformers_target: Path | None = None,
                      timeout: float = 600) -> tuple[LoadResult, ...]:
    """`load_with_vllm` at tensor parallelism `world`: one process per rank (gloo, one OpenMP thread each), each
    comparing the expert parameters it holds with its slice of the checkpoint's fused tensors. One result per rank."""
    script = Path(workdir) / "vllm_load_check.py"
    script.write_text(LOADER_SCRIPT)
    port = _free_port()
    procs = []
    for rank in range(world):
        env_vars = engine_environ(env, root, transformers_target=transformers_target,
                                  # VLLM_DIST_IDENT: the CPU communicator's shared-memory group name, which
                                  # vLLM's CPU worker sets from the init port (v1/worker/cpu_worker.py)
                                  extra={"OMP_NUM_THREADS": "1", "VLLM_DIST_IDENT": str(port)})
        procs.append(subprocess.Popen([str(env.python), str(script), str(checkpoint), str(rank), str(world),
                                       str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=env_vars, cwd=str(workdir), start_new_session=True))
    results = []
    try:
        for rank, proc in enumerate(procs):
            out, err = proc.communicate(timeout=timeout)
            line = next((ln for ln in out.splitlines() if ln.startswith("LOADER-RESULT ")), None)
            if line is None:
                raise EngineError(f"vLLM loader check, rank {rank} of {world}, printed no result (exit "
                                  f"{proc.returncode}): {last_error(err) or err[-500:]}")
            results.append(_load_result(line, err))
    finally:
        for proc in procs:
            stop(proc)
    return tuple(results)
