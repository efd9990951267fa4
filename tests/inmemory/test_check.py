"""The pre-start check of memory mode (manager/inmemory/check.py) and what `overlay status` says of delivery, on the
synthetic root and overlay of testing/memory.py (a plan the real engine recorded, signed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from manager.compose.bundle import write_memory_dir
from manager.inmemory.check import check, delivery, policy
from manager.inmemory.memplan import MemoryRefused
from manager.state import sha256
from testing.memory import OVERLAY_ID, make_fixture, memory_env
from tests.helpers.cli import overlay_process


def _edit(root: Path) -> tuple[str, str]:
    target = root / "vllm" / "demo.py"
    before = sha256(target.read_bytes()).hexdigest()
    target.write_text(target.read_text().replace("return value", "return value  # edited by hand"))
    return before, sha256(target.read_bytes()).hexdigest()


def _main(memory_dir: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """The entrypoint's command line (manager/templates/entrypoint-memory.sh.j2) with this python."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("OVERLAY_")}
    full.update(env)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from overlay_memory.inmemory.check import main; "
            "main(sys.argv[2:])")
    return subprocess.run([sys.executable, "-c", code, str(memory_dir), OVERLAY_ID], env=full, capture_output=True,
                          text=True, timeout=120)


def test_the_check_prints_the_verified_plan_and_what_it_serves(tmp_path):
    fx = make_fixture(tmp_path)
    memory_dir = tmp_path / "memory"
    write_memory_dir(memory_dir)
    proc = _main(memory_dir, memory_env(fx))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{fx.plan}\n"
    assert f"serving {OVERLAY_ID} from memory" in proc.stderr and "signature and file hashes verified" in proc.stderr


def test_a_hand_edited_target_is_refused_in_one_line_naming_overlay_file_and_both_hashes(tmp_path):
    fx = make_fixture(tmp_path)
    memory_dir = tmp_path / "memory"
    write_memory_dir(memory_dir)
    want, have = _edit(fx.root)
    proc = _main(memory_dir, memory_env(fx))
    assert proc.returncode == 1 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"overlay-memory: refused: overlay {OVERLAY_ID}: {fx.root}/vllm/demo.py has sha256 {have}")
    assert want in line


def test_no_plan_for_the_request_is_refused(tmp_path):
    fx = make_fixture(tmp_path)
    fx.plan.unlink()
    with pytest.raises(MemoryRefused, match="no prepared plan of demo-memory on vllm 0.20.0"):
        check([OVERLAY_ID], memory_env(fx))


def test_policy_engine_runs_the_full_engine_in_memory_and_serves_the_edited_file(tmp_path):
    fx = make_fixture(tmp_path, memory_policy="engine")
    assert policy(str(fx.catalog), OVERLAY_ID) == "engine"
    _edit(fx.root)
    before = {p: p.read_bytes() for p in fx.root.rglob("*") if p.is_file()}
    tool = fx.catalog.parent / "bin" / "overlay"  # where the bundle's wrapper is, beside its catalog
    tool.parent.mkdir()
    tool.write_text(f"#!/bin/sh\nexec {sys.executable} -m manager \"$@\"\n")
    tool.chmod(0o755)
    env = memory_env(fx, OVERLAY_PLAN_CACHE=str(tmp_path / "cache2"))
    mp, notes = check([OVERLAY_ID], env)
    assert mp.path.startswith(str(tmp_path / "cache2")) and mp.loaded == [OVERLAY_ID]
    assert any("policy `engine`" in n for n in notes)
    assert {p: p.read_bytes() for p in fx.root.rglob("*") if p.is_file()} == before  # the root was not written
    memory_dir = tmp_path / "memory"
    write_memory_dir(memory_dir)
    full = {k: v for k, v in os.environ.items() if not k.startswith("OVERLAY_")}
    full.update(env, OVERLAY_MEMORY_PLAN=mp.path, PYTHONPATH=f"{memory_dir}{os.pathsep}{fx.root}")
    proc = subprocess.run([sys.executable, "-c", "import inspect, vllm.demo as d; print(d.answer()); "
                           "print('edited by hand' in inspect.getsource(d.answer))"],
                          env=full, capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["42", "True"], proc.stderr


def test_status_names_how_each_overlay_is_delivered_in_memory_mode(tmp_path):
    fx = make_fixture(tmp_path)
    env = memory_env(fx)
    assert delivery([OVERLAY_ID], env) == [(OVERLAY_ID, "memory", f"plan {fx.plan}")]
    _edit(fx.root)
    ((oid, how, why),) = delivery([OVERLAY_ID], env)
    assert (oid, how) == (OVERLAY_ID, "refused") and "demo.py has sha256" in why
    proc = overlay_process("--catalog", str(fx.catalog), "status", "--root", str(fx.root), "--json",
                           env={**env, "OVERLAY_DELIVERY": "memory"})
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["delivery"][0][:2] == [OVERLAY_ID, "refused"]


def test_a_write_that_is_not_module_source_is_a_fallback(tmp_path):
    from manager.inmemory.memplan import MemoryPlan

    fx = make_fixture(tmp_path)
    plan = json.loads(fx.plan.read_text())
    plan["writes"][1]["path"] = "vllm/demo_data.json"
    plan["ledger"]["files"]["vllm/demo_data.json"] = plan["ledger"]["files"].pop("vllm/demo_new.py")
    mp = MemoryPlan(str(fx.plan), plan, str(fx.root))
    assert mp.fallback == {OVERLAY_ID: "writes vllm/demo_data.json, which is not a module's source"}
    assert mp.loaded == [] and list(mp.modules) == ["vllm.demo"]
