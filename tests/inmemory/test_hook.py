"""The import hook (manager/inmemory/hook.py) in real interpreters: a synthetic vLLM root and overlay
(testing/memory.py) whose signed plan the real engine recorded; the bundle's memory/ directory as `overlay bundle`
writes it (manager/compose/bundle.write_memory_dir), first on PYTHONPATH of a fresh python."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from manager.compose.bundle import write_memory_dir
from testing.memory import OVERLAY_ID, MemoryFixture, make_fixture, memory_env

PYTHON = sys.executable


@pytest.fixture
def fx(tmp_path) -> MemoryFixture:
    return make_fixture(tmp_path)


@pytest.fixture
def memory_dir(tmp_path) -> Path:
    d = tmp_path / "memory"
    write_memory_dir(d)
    return d


def _run(memory_dir: Path, fx: MemoryFixture, code: str, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("OVERLAY_")}
    full.update(memory_env(fx, **env) if "pycache" not in env else memory_env(fx, Path(env.pop("pycache")), **env))
    full["PYTHONPATH"] = f"{memory_dir}{os.pathsep}{fx.root}"
    return subprocess.run([PYTHON, "-c", code], env=full, capture_output=True, text=True, timeout=60)


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_patched_module_and_new_module_run_from_memory_and_nothing_is_written(fx, memory_dir, tmp_path):
    before = _tree(fx.root)
    proc = _run(memory_dir, fx, "import vllm.demo, vllm.demo_new, sys\n"
                                "print(vllm.demo.answer(), vllm.demo_new.created(), vllm.demo.__file__)\n"
                                "print(sorted(sys._overlay_memory))", pycache=str(tmp_path / "pyc"))
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.splitlines()
    assert first == f"42 created by the overlay {fx.root}/vllm/demo.py"
    assert second == "['vllm.demo', 'vllm.demo_new']"
    assert _tree(fx.root) == before  # no bytecode, no state, no new file in the tree
    assert not (fx.root / "vllm" / "demo_new.py").exists()


def test_without_the_hook_the_same_interpreter_runs_the_original(fx, memory_dir):
    proc = _run(memory_dir, fx, "import vllm.demo; print(vllm.demo.answer())", OVERLAY_MEMORY_IDS="")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "41"


def test_linecache_tracebacks_and_inspect_getsource_see_the_patched_text(fx, memory_dir):
    code = ("import inspect, linecache, traceback, vllm.demo as d\n"
            "src = inspect.getsource(d.answer)\n"
            "print(repr('value += 1' in src), repr('overlay:demo-memory' in src))\n"
            "linecache.clearcache()\n"  # a cleared cache is filled again with the patched lines, not the disk's
            "print(repr(any('value += 1' in ln for ln in linecache.getlines(d.__file__))))\n"
            "try:\n    d.boom()\nexcept ValueError:\n    tb = traceback.format_exc()\n"
            "print(tb.strip().splitlines()[-2].strip())\n"
            "import re; n = int(re.findall(r'line (\\d+), in boom', tb)[0])\n"
            "print(repr(linecache.getline(d.__file__, n).strip()))")
    proc = _run(memory_dir, fx, code)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "True True" and lines[1] == "True"
    assert lines[2] == 'raise ValueError("boom from demo")'
    # the line number of the patched text names the patched line (the original has boom's raise 7 lines earlier)
    assert lines[3] == repr('raise ValueError("boom from demo")')
    on_disk = (fx.root / "vllm" / "demo.py").read_text().splitlines()
    assert "value += 1" not in "\n".join(on_disk)


def test_bytecode_goes_only_to_the_cache_named_by_the_patched_hash_and_is_reused(fx, memory_dir, tmp_path):
    cache = tmp_path / "pyc"
    code = "import vllm.demo, vllm.demo_new; print(vllm.demo.answer())"
    assert _run(memory_dir, fx, code, pycache=str(cache)).stdout.strip() == "42"
    made = sorted(p.name for p in cache.iterdir())
    assert len(made) == 2 and all(n.endswith(f".{sys.implementation.cache_tag}.pyc") for n in made)
    stamps = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    assert _run(memory_dir, fx, code, pycache=str(cache)).stdout.strip() == "42"
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == stamps  # read, not written again
    assert not list(fx.root.rglob("*.pyc"))


def test_a_target_changed_after_the_check_fails_its_import_naming_overlay_file_and_hashes(fx, memory_dir):
    target = fx.root / "vllm" / "demo.py"
    target.write_text(target.read_text() + "# edited\n")
    proc = _run(memory_dir, fx, "import vllm.demo")
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: overlay demo-memory: ") and str(target) in last and "sha256" in last


def test_a_plan_signed_with_another_key_is_not_installed(fx, memory_dir, tmp_path):
    other = tmp_path / "other-key"
    other.write_bytes(os.urandom(32))
    proc = _run(memory_dir, fx, "import vllm.demo; print(vllm.demo.answer())", OVERLAY_PLAN_KEY=str(other))
    assert proc.stdout.strip() == "41"
    assert "overlay-memory: not installed:" in proc.stderr and "does not verify" in proc.stderr


def test_trace_marks_each_process_spawned_and_forked(fx, memory_dir):
    code = ("import multiprocessing as mp, os, vllm.demo\n"
            "def child():\n    import vllm.demo\n"
            "if __name__ == '__main__':\n"
            "    for method in ('fork', 'spawn'):\n"
            "        p = mp.get_context(method).Process(target=child); p.start(); p.join()\n"
            "    print(os.getpid())\n")
    script = fx.root.parent / "spawner.py"
    script.write_text(code)
    full = {k: v for k, v in os.environ.items() if not k.startswith("OVERLAY_")}
    full.update(memory_env(fx), OVERLAY_TRACE="1", PYTHONPATH=f"{memory_dir}{os.pathsep}{fx.root}")
    proc = subprocess.run([PYTHON, str(script)], env=full, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    from manager.inmemory.marker import read_memory_lines

    per_pid = read_memory_lines(proc.stderr)
    assert len(per_pid) == 3, proc.stderr  # the parent, the forked child, the spawned child
    assert all(v == {OVERLAY_ID: ["vllm.demo"]} for v in per_pid.values())
    assert int(proc.stdout.strip()) in per_pid


def test_the_image_sitecustomize_still_runs_after_the_hook(fx, memory_dir, tmp_path):
    theirs = tmp_path / "image-site"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import builtins\nbuiltins.IMAGE_SITECUSTOMIZE = True\n")
    full = {k: v for k, v in os.environ.items() if not k.startswith("OVERLAY_")}
    full.update(memory_env(fx), PYTHONPATH=os.pathsep.join([str(memory_dir), str(theirs), str(fx.root)]))
    proc = subprocess.run([PYTHON, "-c", "import vllm.demo; print(vllm.demo.answer(), IMAGE_SITECUSTOMIZE)"],
                          env=full, capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "42 True", proc.stderr


def test_the_hook_imports_only_the_standard_library(fx, memory_dir):
    code = "import sys, json; import vllm.demo\nprint(json.dumps(sorted(m.split('.')[0] for m in sys.modules)))"
    with_hook = set(json.loads(_run(memory_dir, fx, code).stdout))
    without = set(json.loads(_run(memory_dir, fx, code, OVERLAY_MEMORY_IDS="").stdout))
    added = with_hook - without
    assert "overlay_memory" in added
    assert added - {"overlay_memory"} <= set(sys.stdlib_module_names), added
    assert not {"manager", "yaml", "pydantic", "click", "rich", "libcst"} & with_hook
