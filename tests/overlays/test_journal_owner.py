"""Issue 28 point 2: a journal is only ever removed by the run that completed or rolled back
everything it records. A run that finds another run's journal folds it into the ledger (saved)
before it writes a journal of its own, so its own roll-back can never drop those records."""

from __future__ import annotations

import errno
import json

import pytest

from manager.catalog import Catalog
from manager.errors import OverlayError
from manager.overlays import apply, load_overlays, revert, select, transaction, writeset
from manager.overlays.plans import apply_plan
from tests.helpers.catalogs import CONVERTOR_PY, OVERLAY_IDS, TARGETS, shipped_catalog_dir
from tests.overlays.test_prepared_plans import ALL_IDS, _fresh, _tree, prepared_020  # noqa: F401
from tests.helpers.catalogs import shipped_catalog

VERSION = "0.20.0"


@pytest.fixture
def catalog(tmp_path):
    return shipped_catalog(tmp_path / "cat", ids=ALL_IDS)


def _fail_writes_of(monkeypatch, rel: str) -> None:
    """EBUSY replacing `rel` (a file bind-mounted over it), in the one write set's commit."""
    real = writeset.WriteSet.commit

    def busy(self, path):
        if str(path).endswith(rel):
            raise OSError(errno.EBUSY, "Device or resource busy")
        return real(self, path)

    monkeypatch.setattr(writeset.WriteSet, "commit", busy)


def test_a_failed_apply_after_a_killed_one_keeps_the_killed_runs_records(vllm_root, tmp_path, monkeypatch):
    cat = shipped_catalog_dir(tmp_path / "cat-engine")
    every = select(load_overlays(Catalog(cat)), list(OVERLAY_IDS))
    root = vllm_root(VERSION)
    original = {t: (root / t).read_bytes() for t in TARGETS}
    calls = []

    def killed_before_third():  # stands for kill -9: no roll-back, the journal stays
        calls.append(1)
        if len(calls) == 3:
            raise SystemExit(137)

    monkeypatch.setattr(transaction, "BEFORE_WRITE", [killed_before_third])
    with pytest.raises(SystemExit):
        apply(every, root)
    monkeypatch.setattr(transaction, "BEFORE_WRITE", [])
    patched = [t for t in TARGETS if (root / t).read_bytes() != original[t]]
    assert len(patched) == 2 and CONVERTOR_PY not in patched
    assert (root / ".overlay-manager" / "journal.json").exists()

    _fail_writes_of(monkeypatch, CONVERTOR_PY)
    with pytest.raises(OverlayError, match="cannot write"):
        apply(every, root)
    monkeypatch.undo()
    led = json.loads((root / ".overlay-manager" / "ledger.json").read_text())
    assert sorted(led["files"]) == sorted(patched), "the killed run's records were dropped"
    revert(every, every, root)
    for t in TARGETS:
        assert (root / t).read_bytes() == original[t], t


@pytest.mark.network
def test_a_plan_replay_failing_on_its_last_rename_leaves_every_write_recorded(tmp_path, catalog, prepared_020, monkeypatch):
    every, plan_path = prepared_020
    root = _fresh(tmp_path, every, "root")
    pristine = {k: v for k, v in _tree(root).items()}
    writes = [w["path"] for w in json.loads(plan_path.read_text())["writes"] if w["post_sha256"] != "absent"]
    last = writes[-1]
    real_rename = writeset.WriteSet.commit

    def rename(self, path):
        if path.endswith(last):
            raise OSError(errno.EBUSY, "Device or resource busy")
        return real_rename(self, path)

    monkeypatch.setattr(writeset.WriteSet, "commit", rename)
    with pytest.raises(OSError):
        apply_plan(str(catalog.root), str(root), [], [str(plan_path.parent)])
    monkeypatch.undo()
    assert (root / ".overlay-manager" / "journal.json").exists()
    _fail_writes_of(monkeypatch, last)  # the engine that follows (fastpath) meets the same busy file
    with pytest.raises(OverlayError):
        apply(every, root)
    monkeypatch.undo()
    led = json.loads((root / ".overlay-manager" / "ledger.json").read_text())
    assert sorted(led["files"]) == sorted(w for w in writes if w != last)
    revert(every, every, root)
    after = {k: v for k, v in _tree(root).items() if not k.startswith(".overlay-manager/")}
    assert after == pristine
