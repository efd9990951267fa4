"""Issue 28, integrity of the engine's transaction (manager/overlays/transaction.py) on real vLLM
0.20.0 sources: a concurrent write is never lost, a hand edit is never recorded as overlay bytes
(so no revert can drop it), target paths are in one normal form, a lock owner file that cannot be
written and a __pycache__ entry that cannot be removed are one line (or a warning), not exit 3."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from manager.catalog import Catalog
from manager.errors import OverlayError
from manager.overlays import apply, load_overlays, revert, select, transaction
from tests.helpers.catalogs import CONVERTOR, CONVERTOR_PY, OVERLAY_IDS, TARGETS, shipped_catalog_dir, tree_hashes

VERSION = "0.20.0"
MTP = "gemma4-unified-port"  # also edits the convertor module, applicable on 0.20.0


@pytest.fixture(scope="module")
def catalog_dir(tmp_path_factory) -> Path:
    return shipped_catalog_dir(tmp_path_factory.mktemp("catalog"), ids=OVERLAY_IDS + (MTP,))


def _every(catalog_dir: Path):
    return load_overlays(Catalog(catalog_dir))


def test_a_target_appended_to_after_apply_read_it_is_not_overwritten(vllm_root, catalog_dir, monkeypatch):
    """Lost update: another process appends to every target between the read and the replace."""
    root = vllm_root(VERSION)
    every = select(_every(catalog_dir), list(OVERLAY_IDS))
    fired = []

    def other_writer():
        if not fired:
            fired.append(1)
            for t in TARGETS:
                with open(root / t, "ab") as fh:
                    fh.write(b"OTHER = 1\n")

    monkeypatch.setattr(transaction, "BEFORE_WRITE", [other_writer])
    with pytest.raises(OverlayError, match="changed on disk while this run"):
        apply(every, root)
    for t in TARGETS:  # the other process's update is kept: nothing of ours was written over it
        assert (root / t).read_bytes().endswith(b"OTHER = 1\n"), t
        assert b"overlay:" not in (root / t).read_bytes(), t
    assert not (root / ".overlay-manager" / "journal.json").exists()


def test_applying_a_second_overlay_on_a_hand_edited_file_is_refused_naming_it(vllm_root, catalog_dir):
    """Apply A; the user appends a line; apply B on the same file would record the edit as B's
    post bytes, and `revert B` (original + A) would drop it: refused, naming the file."""
    root = vllm_root(VERSION)
    every = _every(catalog_dir)
    apply(select(every, [CONVERTOR]), root, explicit=True)
    target = root / CONVERTOR_PY
    target.write_bytes(target.read_bytes() + b"MY_SETTING = 42\n")
    before = tree_hashes(root)
    with pytest.raises(OverlayError, match=f"{CONVERTOR_PY}: changed since overlay apply.*hand edit"):
        apply(select(every, [MTP]), root, explicit=True)
    assert tree_hashes(root) == before
    assert target.read_bytes().endswith(b"MY_SETTING = 42\n")
    # revert of A still refuses (never drops the edit silently)
    with pytest.raises(OverlayError, match="revert refused"):
        revert(select(every, [CONVERTOR]), every, root)
    assert target.read_bytes().endswith(b"MY_SETTING = 42\n")


def test_no_space_for_the_lock_owner_text_is_a_warning_not_a_crash(vllm_root, catalog_dir, monkeypatch):
    """ENOSPC writing `{pid, host, command, since}` into the lock file (a full disk): the flock
    itself holds, so the run goes on; the owner text is only informative."""
    from manager.overlays import lock

    root = vllm_root(VERSION)
    every = select(_every(catalog_dir), list(OVERLAY_IDS))
    real_pwrite = os.pwrite

    def full(fd, data, offset):
        if b'"pid"' in bytes(data):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(lock.os, "pwrite", full)
    result = apply(every, root)
    assert sorted(c.path for c in result.changes) == sorted(TARGETS)


def test_a_pycache_entry_that_cannot_be_removed_rolls_nothing_half_way(vllm_root, catalog_dir):
    """A `__pycache__/<name>.cpython-*.pyc` that is a directory (cannot be unlinked): the stale
    bytecode cannot be dropped; that is a warning, never an exception outside the roll-back."""
    root = vllm_root(VERSION)
    every = select(_every(catalog_dir), list(OVERLAY_IDS))
    cache = (root / TARGETS[1]).parent / "__pycache__"
    cache.mkdir(exist_ok=True)
    stem = Path(TARGETS[1]).stem
    (cache / f"{stem}.cpython-312.pyc").mkdir()
    result = apply(every, root)
    assert sorted(c.path for c in result.changes) == sorted(TARGETS)


@pytest.mark.parametrize("bad", [float("nan")])
def test_a_lock_wait_that_is_not_a_number_of_seconds_is_refused(tmp_path, bad):
    from manager.overlays.lock import root_lock

    with pytest.raises(OverlayError, match="--wait"):
        with root_lock(tmp_path / ".overlay-manager", wait=bad):
            pass


def test_ledgerless_revert_of_two_overlays_on_one_file_removes_both_blocks(vllm_root, catalog_dir):
    root = vllm_root(VERSION)
    every = _every(catalog_dir)
    two = select(every, [CONVERTOR, MTP])
    original = (root / CONVERTOR_PY).read_bytes()
    apply(two, root, explicit=True)
    assert (root / CONVERTOR_PY).read_bytes().count(b"# overlay:") > 1
    (root / ".overlay-manager" / "ledger.json").unlink()
    revert(two, every, root)
    assert b"overlay:" not in (root / CONVERTOR_PY).read_bytes()
    assert (root / CONVERTOR_PY).read_bytes() == original
