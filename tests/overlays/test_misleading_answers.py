"""Issue 28 point 14: answers that were true but misleading, or false: a ledger that cannot be
written after every target was, a ledger whose records list no target, an EIO on a directory
fsync, a no-op apply on a read-only root."""

from __future__ import annotations

import errno
import os
import json
from pathlib import Path

import pytest

from manager import fsutil
from manager.catalog import Catalog
from manager.errors import OverlayError
from manager.overlays import apply, ledger, load_overlays, select
from tests.helpers.catalogs import OVERLAY_IDS, TARGETS, shipped_catalog_dir

VERSION = "0.20.0"


@pytest.fixture(scope="module")
def catalog_dir(tmp_path_factory) -> Path:
    return shipped_catalog_dir(tmp_path_factory.mktemp("catalog"))


def _every(catalog_dir):
    return select(load_overlays(Catalog(catalog_dir)), list(OVERLAY_IDS))


def test_a_full_disk_at_the_ledger_says_the_targets_are_written_and_the_journal_kept(vllm_root, catalog_dir, monkeypatch):
    root = vllm_root(VERSION)
    real = ledger.atomic_write

    def full(path, data, mode=None):
        if Path(path).name == "ledger.json":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, data, mode=mode)

    monkeypatch.setattr(ledger, "atomic_write", full)
    with pytest.raises(OverlayError) as info:
        apply(_every(catalog_dir), root)
    msg = str(info.value)
    assert "cannot write the ledger" in msg and "3 target(s) are written" in msg and "journal.json" in msg, msg
    assert (root / ".overlay-manager" / "journal.json").exists()
    monkeypatch.undo()
    again = apply(_every(catalog_dir), root)  # the next apply recovers from the journal
    assert any("interrupted apply" in n for n in again.notes)
    assert (root / ".overlay-manager" / "ledger.json").exists()


def test_a_ledger_record_listing_no_target_is_corrupt_not_applied(vllm_root, catalog_dir):
    root = vllm_root(VERSION)
    apply(_every(catalog_dir), root)
    for t in TARGETS:  # pristine files again, and a ledger claiming every overlay applied with no targets
        (root / t).write_bytes((root / t).read_bytes())
    p = root / ".overlay-manager" / "ledger.json"
    led = json.loads(p.read_text())
    for rec in led["overlays"].values():
        rec["targets"] = []
    p.write_text(json.dumps(led))
    with pytest.raises(OverlayError, match=r"targets.*empty"):
        ledger.Ledger.load(root)


def test_fastpath_does_not_call_an_overlay_with_no_recorded_target_applied(vllm_root, catalog_dir):
    from manager import fastpath

    root = vllm_root(VERSION)
    apply(_every(catalog_dir), root)
    p = root / ".overlay-manager" / "ledger.json"
    led = json.loads(p.read_text())
    for rec in led["overlays"].values():
        rec["targets"] = []
    p.write_text(json.dumps(led))
    assert fastpath.nothing_to_do(["--catalog", str(catalog_dir), "apply", "--root", str(root)]) is None


def test_eio_on_a_directory_fsync_is_an_error_while_einval_is_skipped(tmp_path, monkeypatch):
    real = os.fsync
    calls = []

    def fsync(fd):
        import stat as st

        if st.S_ISDIR(os.fstat(fd).st_mode):
            calls.append(fd)
            raise OSError(calls_errno[0], os.strerror(calls_errno[0]))
        return real(fd)

    calls_errno = [errno.EINVAL]
    monkeypatch.setattr(fsutil.os, "fsync", fsync)
    fsutil.atomic_write(tmp_path / "a", b"x")  # a filesystem that cannot fsync a directory
    assert calls and (tmp_path / "a").read_bytes() == b"x"
    calls_errno[0] = errno.EIO
    with pytest.raises(OSError) as info:
        fsutil.atomic_write(tmp_path / "b", b"y")
    assert info.value.errno == errno.EIO


def test_a_no_op_apply_on_a_read_only_applied_root_needs_no_lock(vllm_root, catalog_dir, monkeypatch):
    """`apply A B C` where A, B are applied and C is not-applicable, on a read-only root: nothing
    to write, so no lock is needed and the entrypoint goes on to start the server."""
    from manager.overlays import transaction

    root = vllm_root(VERSION)
    every = load_overlays(Catalog(catalog_dir))
    applied = select(every, list(OVERLAY_IDS))
    apply(applied, root)
    extra = shipped_catalog_dir(catalog_dir.parent / "with-mtp", ids=OVERLAY_IDS + ("gemma4-mtp-per-layer",))
    wanted = select(load_overlays(Catalog(extra)), list(OVERLAY_IDS) + ["gemma4-mtp-per-layer"])

    def read_only(*a, **k):
        raise OverlayError(f"{root}/.overlay-manager/lock: cannot open the lock: Read-only file system")

    monkeypatch.setattr(transaction, "_lock", read_only)
    monkeypatch.setattr(transaction, "_writable", lambda path: False, raising=False)
    result = apply(wanted, root, explicit=True)
    assert not result.changes
    assert {o.id: o.status for o in result.statuses.overlays}["gemma4-mtp-per-layer"] == "not-applicable"
