"""The rank check in a real POSIX shell: each rank computes its plan hash from the vLLM it imports and the bundle's
overlays and tool, and refuses to join (one line, exit 3) when it differs from the pod annotation."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from manager.catalog import Catalog
from manager.compose.plan import plan_all
from manager.compose.registry import load_registry
from manager.k8s.planhash import PLAN_HASH_ANNOTATION, plan_hash, rank_check_script, selected_ids
from tests.helpers import REPO_ROOT

CATALOG = Catalog.locate(None)
SLUG = "gemma4-26b-a4b-awq-3090-tp2"  # vLLM 0.20.0, one overlay
PLAN = plan_all(load_registry(CATALOG), CATALOG)[SLUG]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    """The parts of a bundle the check reads: site/manager (this checkout's) and catalog/overlays."""
    b = tmp_path_factory.mktemp("bundle")
    (b / "site").mkdir()
    (b / "site" / "manager").symlink_to(REPO_ROOT / "manager")
    (b / "catalog").mkdir()
    (b / "catalog" / "overlays").symlink_to(CATALOG.overlays_dir)
    return b


def _run(bundle: Path, vllm_tree: Path, annotation: str | None, rank_flags: bool = False,
         lws: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    script = "set -eu\n" + rank_check_script(selected_ids(PLAN), str(bundle), rank_flags) + 'printf "%s\\n" "$@"\n'
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(vllm_tree), **(lws or {})}
    if annotation is not None:
        env["OVERLAY_PLAN_HASH"] = annotation
    return subprocess.run(["/bin/sh", "-c", script, "entrypoint", "--model", "m"], env=env, capture_output=True,
                          text=True, timeout=60)


def test_the_rank_with_the_rendered_plan_starts_with_its_rank_flags(bundle, pristine_release):
    res = _run(bundle, pristine_release("0.20.0"), plan_hash(PLAN, CATALOG), rank_flags=True,
               lws={"LWS_WORKER_INDEX": "1", "LWS_LEADER_ADDRESS": "leader.example"})
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["--model", "m", "--node-rank", "1", "--master-addr", "leader.example"]


@pytest.mark.parametrize("annotation", ["0" * 64, "", None])
def test_a_different_or_missing_annotation_is_refused_in_one_line(bundle, pristine_release, annotation):
    res = _run(bundle, pristine_release("0.20.0"), annotation)
    assert res.returncode == 3 and res.stdout == ""
    (line,) = res.stderr.strip().splitlines()
    assert f"differs from the pod annotation {PLAN_HASH_ANNOTATION}=" in line and "refusing to join" in line


def test_a_rank_whose_image_holds_another_vllm_is_refused(bundle, pristine_release):
    res = _run(bundle, pristine_release("0.19.1"), plan_hash(PLAN, CATALOG))
    assert res.returncode == 3
    assert "rank 0: plan hash" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_a_worker_without_the_lws_environment_does_not_start(bundle, pristine_release):
    res = _run(bundle, pristine_release("0.20.0"), plan_hash(PLAN, CATALOG), rank_flags=True)
    assert res.returncode != 0 and "LeaderWorkerSet" in res.stderr and res.stdout == ""
