"""`overlay apply --plans DIR --json` carries the plan the text mode prints (issue 26 point 7)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from manager.overlays import load_overlays
from manager.overlays.prepare import input_paths, prepare
from tests.helpers.catalogs import PR40886, shipped_catalog
from tests.helpers.cli import overlay_process

pytestmark = pytest.mark.network


def _root(dest: Path, rels) -> Path:
    from manager.releases import pristine_tree

    src = pristine_tree("0.20.0")
    for info in src.glob("vllm-*.dist-info"):
        shutil.copytree(info, dest / info.name)
    (dest / "vllm").mkdir(parents=True, exist_ok=True)
    for rel in rels:
        if (src / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes((src / rel).read_bytes())
    return dest


def test_apply_json_with_plans_names_the_plan_it_replayed(tmp_path: Path) -> None:
    catalog = shipped_catalog(tmp_path / "cat", ids=(PR40886,))  # one overlay: a lean plan
    every = load_overlays(catalog)
    (made,) = prepare(every, ["0.20.0"], [PR40886], tmp_path / "plans")
    root = _root(tmp_path / "site", input_paths(every))
    proc = overlay_process("--catalog", str(catalog.root), "apply", PR40886, "--root", str(root), "--plans",
                           str(tmp_path / "plans"), "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["plan"] == made.path and out["changes"], out
    assert {c["path"] for c in out["changes"]} == set(made.changes)
