"""Issue 28 point 6: the plan replay and the engine treat links and owners the same way. An
in-root file symlink is written through (the link is kept, by both paths); a target's owner
(uid/gid) is kept across apply and revert (a root run on a 1000:1000 tree leaves it 1000:1000)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from manager.overlays import apply, revert
from manager.overlays.plans import apply_plan
from tests.helpers.catalogs import GEMMA4
from tests.overlays.test_prepared_plans import ALL_IDS, _fresh, prepared_020  # noqa: F401
from tests.helpers.catalogs import shipped_catalog


@pytest.fixture
def catalog(tmp_path):
    return shipped_catalog(tmp_path / "cat", ids=ALL_IDS)


def _link_target(root: Path) -> Path:
    """GEMMA4 moved to vllm/real/gemma4.py, an in-root symlink left in its place."""
    real = root / "vllm" / "real" / "gemma4.py"
    real.parent.mkdir()
    os.replace(root / GEMMA4, real)
    (root / GEMMA4).symlink_to(os.path.relpath(real, (root / GEMMA4).parent))
    return real


@pytest.mark.network
def test_plan_replay_writes_through_an_in_root_symlink_like_the_engine(tmp_path, catalog, prepared_020):
    every, plan_path = prepared_020
    by_plan, by_engine = _fresh(tmp_path, every, "plan"), _fresh(tmp_path, every, "engine")
    real_plan, real_engine = _link_target(by_plan), _link_target(by_engine)
    original = real_plan.read_bytes()
    apply(every, by_engine)
    assert apply_plan(str(catalog.root), str(by_plan), [], [str(plan_path.parent)]) is not None
    assert (by_plan / GEMMA4).is_symlink(), "the plan replay replaced the link by a regular file"
    assert real_plan.read_bytes() == real_engine.read_bytes() != original
    revert(every, every, by_plan)
    assert (by_plan / GEMMA4).is_symlink() and real_plan.read_bytes() == original


@pytest.mark.network
@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")
@pytest.mark.parametrize("how", ["engine", "plan"])
def test_a_targets_owner_is_kept_by_apply_and_revert(tmp_path, catalog, prepared_020, how):
    every, plan_path = prepared_020
    root = _fresh(tmp_path, every, "root")
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            os.lchown(os.path.join(dirpath, n), 1000, 1000)
    if how == "engine":
        apply(every, root)
    else:
        assert apply_plan(str(catalog.root), str(root), [], [str(plan_path.parent)]) is not None
    st = os.stat(root / GEMMA4)
    assert (st.st_uid, st.st_gid) == (1000, 1000)
    assert b"overlay:" in (root / GEMMA4).read_bytes()
    revert(every, every, root)
    st = os.stat(root / GEMMA4)
    assert (st.st_uid, st.st_gid) == (1000, 1000)
