"""Run vLLM's own test files in an engine venv (manager.engines.venv) and read back each test's outcome.

pytest comes from a `pip install --no-deps --target` layer of the versions vLLM's test requirements pin, put after
the overlay root on PYTHONPATH (the shared engine venvs are not modified); the hub is off (HF_HUB_OFFLINE /
TRANSFORMERS_OFFLINE, engine_environ), no GPU is visible (CUDA_VISIBLE_DEVICES=""), each test has a timeout
(pytest-timeout). A small plugin of ours (written into the layer) records one JSON line per test id: the outcome,
its first message line, its seconds, and any `overlay-trace:` line (manager/overlays/trace.py) pytest captured.

Cache: engines/pytest-8.3.5-<hash>-target/ under manager.releases.cache_dir(), `.ready` written last.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Sequence

from ..errors import UpstreamError

# vLLM's pinned test requirements: requirements/test/cuda.txt of the 0.20.0 sdist and requirements/test.txt of the
# 0.19.1 sdist list the same versions of these (read 2026-12-02). pytest-timeout gives the per-test timeout; the
# asyncio and mock plugins are what the picked files' async tests and `mocker` fixtures need.
PYTEST_PINS = ("pytest==8.3.5", "pluggy==1.5.0", "iniconfig==2.0.0", "pytest-timeout==2.3.1",
               "pytest-asyncio==0.24.0", "pytest-mock==3.14.0", "tblib==3.1.0")  # tblib: tests/conftest.py imports it
RUN_LIMIT = float(os.environ.get("OVERLAY_UPSTREAM_RUN_LIMIT", "1800"))  # seconds for one pytest run

# Our pytest plugin (runs in the engine venv, imports nothing of ours): one JSON line per test id.
_PLUGIN = r'''
"""overlay-manager's outcome recorder for vLLM's own tests (manager/upstream/runner.py)."""
import json, os

_OUT = os.environ["OVERLAY_OUTCOMES"]


def _message(report):
    lr = report.longrepr
    if lr is None:
        return ""
    if isinstance(lr, tuple) and len(lr) == 3:
        return str(lr[2])[:300]
    crash = getattr(lr, "reprcrash", None)
    text = crash.message if crash is not None else str(lr)
    return text.strip().splitlines()[0][:300] if text.strip() else ""


def _write(nodeid, outcome, message, seconds=0.0):
    with open(_OUT, "a") as fh:
        fh.write(json.dumps({"id": nodeid, "outcome": outcome, "message": message, "seconds": seconds}) + "\n")


_SECONDS = {}


def pytest_runtest_logfinish(nodeid, location):
    with open(_OUT, "a") as fh:
        fh.write(json.dumps({"id": nodeid, "seconds": round(_SECONDS.pop(nodeid, 0.0), 3)}) + "\n")


def _traces(report):
    # OVERLAY_TRACE=1 guards (manager/overlays/trace.py) print to stderr, which pytest captures per test phase
    for line in (getattr(report, "capstderr", "") or "").splitlines():
        if line.startswith("overlay-trace: "):
            with open(_OUT, "a") as fh:
                fh.write(json.dumps({"trace": line, "id": report.nodeid}) + "\n")


def pytest_runtest_logreport(report):
    _traces(report)
    _SECONDS[report.nodeid] = _SECONDS.get(report.nodeid, 0.0) + report.duration
    xfail = hasattr(report, "wasxfail")
    if report.when == "setup" and report.failed:
        _write(report.nodeid, "error", _message(report))
    elif report.when == "setup" and report.skipped:
        _write(report.nodeid, "xfailed" if xfail else "skipped", _message(report))
    elif report.when == "call":
        if xfail:
            outcome = "xfailed" if report.skipped else "xpassed"
        else:
            outcome = report.outcome
        _write(report.nodeid, outcome, _message(report))
    elif report.when == "teardown" and report.failed:
        _write(report.nodeid, "error", _message(report))


def pytest_collection_modifyitems(config, items):
    shard = os.environ.get("OVERLAY_SHARD")  # "i/n": keep the tests whose id hashes to i modulo n
    if not shard:
        return
    import zlib

    i, n = (int(x) for x in shard.split("/"))
    # by the test id, not the position: two processes may collect in different orders (parametrizations over sets)
    mine = [zlib.crc32(it.nodeid.encode()) % n == i for it in items]
    config.hook.pytest_deselected(items=[it for it, m in zip(items, mine) if not m])
    items[:] = [it for it, m in zip(items, mine) if m]


def pytest_collectreport(report):
    _traces(report)
    if report.failed:
        errors = [l[1:].strip() for l in str(report.longrepr).splitlines() if l.startswith("E ")]
        _write(report.nodeid, "error", "collection: " + (errors[-1][:300] if errors else _message(report)))
'''
_RUNNER_VERSION = "1"  # part of the cache key: bump when what the plugin records or the command line changes


@dataclass(frozen=True)
class Outcome:
    outcome: str  # passed | failed | error | skipped | xfailed | xpassed | absent
    message: str = ""
    seconds: float = 0.0  # setup + call + teardown


# ---------------------------------------------------------------------------------------------- the pytest layer


def pytest_layer(env) -> Path:  # env: manager.engines.venv.EngineEnv
    """A `pip install --no-deps --target` directory with PYTEST_PINS and our plugin, for the engine venv's python
    (put after the overlay root on PYTHONPATH); built once under the engines cache."""
    from filelock import FileLock

    from ..engines.venv import engines_dir

    base = engines_dir()
    tag = hashlib.sha256(json.dumps([PYTEST_PINS, _PLUGIN]).encode()).hexdigest()[:10]
    name = f"{PYTEST_PINS[0].replace('==', '-')}-{tag}-target"
    final = base / name
    plugin = final / "overlay_outcomes.py"
    if (final / ".ready").is_file() and plugin.is_file() and plugin.read_text() == _PLUGIN:
        return final
    with FileLock(str(base / f"{name}.lock")):
        if (final / ".ready").is_file() and plugin.is_file() and plugin.read_text() == _PLUGIN:
            return final
        tmp = base / f".{name}.building-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        penv = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        penv["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        proc = subprocess.run([str(env.python), "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp),
                               *PYTEST_PINS], capture_output=True, text=True, env=penv)
        if proc.returncode != 0:
            tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
            raise UpstreamError(f"pip install --target {' '.join(PYTEST_PINS)} failed: {tail}")
        (tmp / "overlay_outcomes.py").write_text(_PLUGIN)
        check = subprocess.run([str(env.python), "-c", "import pytest, pytest_timeout, overlay_outcomes; "
                                "print(pytest.__version__)"], capture_output=True, text=True,
                               env={**penv, "PYTHONPATH": str(tmp), "OVERLAY_OUTCOMES": os.devnull})
        if check.returncode != 0:
            raise UpstreamError(f"the pytest layer does not import: {check.stderr.strip().splitlines()[-1:]}")
        (tmp / ".ready").write_text("\n".join(PYTEST_PINS) + "\n")
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
    return final


# ------------------------------------------------------------------------------------------------------ running


def run_tests(env, root: Path | None, tree: Path, tests: Sequence[str], *, timeout: float, work: Path,
              label: str, shards: int = 1) -> dict[str, Outcome]:
    """Run `tests` (paths or node ids relative to `tree`) with the engine venv, `root` first on PYTHONPATH (None:
    the venv's own vllm); test id -> outcome. A run past RUN_LIMIT is stopped and what it reported is kept.
    `shards` > 1: that many pytest processes side by side, each running the tests whose id hashes to its index."""
    if shards > 1:
        with ThreadPoolExecutor(max_workers=shards) as pool:
            parts = list(pool.map(lambda i: _run_pytest(env, root, tree, tests, timeout=timeout, work=work,
                                                       label=f"{label}-{i}", shard=f"{i}/{shards}"),
                                  range(shards)))
        merged: dict[str, Outcome] = {}
        for part in parts:
            merged.update(part)
        return merged
    return _run_pytest(env, root, tree, tests, timeout=timeout, work=work, label=label, shard=None)


def _run_pytest(env, root: Path | None, tree: Path, tests: Sequence[str], *, timeout: float, work: Path,
                label: str, shard: str | None) -> dict[str, Outcome]:
    from ..engines.venv import engine_environ

    layer = pytest_layer(env)
    out = work / f"outcomes-{label}.jsonl"
    out.unlink(missing_ok=True)
    environ = engine_environ(env, root, trace=root is not None, extra={
        "OVERLAY_OUTCOMES": str(out), "PYTHONDONTWRITEBYTECODE": "1", "CUDA_VISIBLE_DEVICES": "",
        "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(work / "hf-home"), "PYTHONHASHSEED": "0",
    })
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (environ.get("PYTHONPATH"), str(layer)) if p)
    if shard:
        environ["OVERLAY_SHARD"] = shard
    args_file = work / f"args-{label}.txt"
    args_file.write_text("\n".join(tests) + "\n")
    cmd = [str(env.python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "overlay_outcomes",
           "-o", "addopts=", "--continue-on-collection-errors", f"--timeout={timeout:g}", "--rootdir", str(tree),
           f"@{args_file}"]
    log = work / f"pytest-{label}.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, cwd=tree, env=environ, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            proc.wait(timeout=RUN_LIMIT)
        except subprocess.TimeoutExpired:
            from ..engines.venv import stop

            stop(proc)
    results: dict[str, Outcome] = {}
    seconds: dict[str, float] = {}
    if out.is_file():
        for line in out.read_text().splitlines():
            rec = json.loads(line)
            if "trace" in rec:
                continue  # read by traced_blocks()
            if "outcome" not in rec:
                seconds[rec["id"]] = rec["seconds"]
                continue
            prev = results.get(rec["id"])
            if prev is None or prev.outcome in ("passed", "skipped"):  # a teardown error wins over a pass
                results[rec["id"]] = Outcome(rec["outcome"], rec["message"])
    results = {t: Outcome(o.outcome, o.message, seconds.get(t, 0.0)) for t, o in results.items()}
    if proc.returncode not in (0, 1, None) and not results:
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
        raise UpstreamError(f"pytest ({label}) ended with exit {proc.returncode} and no results: {tail}")
    return results


def traced_blocks(work: Path, label: str = "patched") -> dict[str, tuple[str, ...]]:
    """`overlay/edit` -> the test ids in which that traced block ran first in its process (from the outcome files
    of the runs named `label*` under `work`)."""
    from ..overlays.trace import read_trace

    out: dict[str, set[str]] = {}
    for f in sorted(work.glob(f"outcomes-{label}*.jsonl")):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            if "trace" in rec:
                for t in read_trace(rec["trace"] + "\n"):
                    out.setdefault(f"{t.overlay}/{t.edit}", set()).add(rec["id"])
    return {k: tuple(sorted(v)) for k, v in sorted(out.items())}

