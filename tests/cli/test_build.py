"""`overlay build` on the command line: JSON output, warm restarts, two processes at once."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.helpers import SHIPPED_OVERLAYS
from tests.helpers.cli import overlay_popen, overlay_process
from tests.helpers.nvrtc12 import nvrtc12_lib

pytestmark = pytest.mark.network


@pytest.fixture
def env(tmp_path: Path) -> dict:
    cat = tmp_path / "catalog"
    shutil.copytree(SHIPPED_OVERLAYS / "sm70-d512-attention", cat / "overlays" / "sm70-d512-attention")
    return dict(os.environ, OVERLAY_CATALOG=str(cat), OVERLAY_NVRTC=str(nvrtc12_lib()))


def _run(args, env):
    return overlay_process("build", *args, env=env, inherit_env=False, timeout=None)


def test_build_json_reports_compiles_then_a_warm_restart_reports_zero(env, tmp_path):
    cache = tmp_path / "cache"
    cold = _run(["sm70-d512-attention", "--cache", str(cache), "--json"], env)
    assert cold.returncode == 0, cold.stderr
    data = json.loads(cold.stdout)
    assert data["compiled"] == 4 and data["compiler"].startswith("nvrtc 12.")
    assert "compiled" in cold.stderr
    warm = _run(["--cache", str(cache), "--json"], env)
    assert warm.returncode == 0
    assert json.loads(warm.stdout)["compiled"] == 0
    assert "0 compilations" in warm.stderr


def test_two_concurrent_builds_of_one_key_compile_it_once(env, tmp_path):
    cache = tmp_path / "cache"
    procs = [overlay_popen("build", "--cache", str(cache), "--json", env=env) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    results = [json.loads(o[0]) for o in outs]
    assert sum(r["compiled"] for r in results) == 4
    assert all(len(r["items"]) == 4 for r in results)
    assert len(list((cache / "objects").glob("*/*/meta.json"))) == 4
    assert not list((cache / "objects").glob("*/.*"))  # no temporary or trash directories left


def test_arch_flag_and_env_cache(env, tmp_path):
    env = dict(env, OVERLAY_KERNEL_CACHE=str(tmp_path / "envcache"))
    r = _run(["--arch", "sm_70", "--json"], env)
    assert r.returncode == 0, r.stderr
    assert {i["arch"] for i in json.loads(r.stdout)["items"]} == {"compute_70", "sm_70"}
    assert (tmp_path / "envcache" / "index" / "sm70-d512-attention.json").is_file()


def test_unknown_overlay_exits_1_with_one_line(env, tmp_path):
    r = _run(["no-such-overlay", "--cache", str(tmp_path / "c")], env)
    assert r.returncode == 1
    assert "overlay 'no-such-overlay'" in r.stderr and "Traceback" not in r.stderr


def test_bad_nvrtc_path_exits_1(env, tmp_path):
    env = dict(env, OVERLAY_NVRTC=str(tmp_path / "missing.so"))
    r = _run(["--cache", str(tmp_path / "c")], env)
    assert r.returncode == 1 and "does not exist" in r.stderr


def test_build_progress_shows_the_arch_in_brackets_not_an_escape(capsys) -> None:
    """issue 26 point 7: `overlay build` printed `\\[compute_70]` (escaped twice)."""
    from types import SimpleNamespace

    from manager.cli.build import ConsoleProgress

    item = SimpleNamespace(action="compiled", overlay="sm70-d512-attention", source="attn.cu", arch="compute_70",
                           key="0123456789abcdef")
    ConsoleProgress().built(item, 1.25)
    line = capsys.readouterr().err
    assert "sm70-d512-attention/attn.cu [compute_70] 0123456789ab (1.2s)" in line and "\\[" not in line
