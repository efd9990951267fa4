"""The one write set (manager/overlays/writeset.py): staged temp files beside their destinations, one fsync
barrier, replaced in order, rolled back byte-exact (mode kept), temp files never left behind."""

from __future__ import annotations

import os
import stat

import pytest

from manager import fsutil
from manager.overlays import writeset
from manager.overlays.writeset import WriteSet


def _names(d) -> list[str]:
    return sorted(os.listdir(d))


def test_staging_touches_no_destination_until_commit_and_names_temps_like_fsutil(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "sub" / "b.txt"
    a.write_bytes(b"old\n")
    with WriteSet() as ws:
        ws.stage(str(a), b"new\n")
        ws.stage(str(b), b"made\n")
        ws.sync()
        assert a.read_bytes() == b"old\n" and not b.exists()
        temps = [n for n in _names(tmp_path) if n != "a.py" and n != "sub"]
        assert len(temps) == 1 and fsutil.is_temp_name(temps[0]), temps
        ws.commit(str(a))
        ws.commit(str(b))
        assert ws.dirs() == {str(tmp_path), str(tmp_path / "sub")}
        ws.sync_dirs()
    assert a.read_bytes() == b"new\n" and b.read_bytes() == b"made\n"
    assert _names(tmp_path) == ["a.py", "sub"] and _names(tmp_path / "sub") == ["b.txt"]
    assert stat.S_IMODE(b.stat().st_mode) == 0o644


def test_rollback_puts_back_the_byte_exact_originals_with_their_mode_newest_first(tmp_path):
    kept, made, gone = tmp_path / "kept.py", tmp_path / "made.py", tmp_path / "gone.py"
    kept.write_bytes(b"\xef\xbb\xbfx = 1\r\n")  # a BOM and CRLF: bytes, never text
    os.chmod(kept, 0o750)
    gone.write_bytes(b"y = 2\n")
    os.chmod(gone, 0o600)
    with WriteSet() as ws:
        ws.stage(str(kept), b"x = 2\n", undo=True, before=kept.read_bytes())
        ws.stage(str(made), b"z = 3\n", undo=True, before=None)
        ws.stage(str(gone), None, undo=True, before=gone.read_bytes())
        ws.sync()
        for p in (kept, made, gone):
            ws.commit(str(p))
        assert kept.read_bytes() == b"x = 2\n" and stat.S_IMODE(kept.stat().st_mode) == 0o750
        assert made.exists() and not gone.exists()
        assert ws.rollback() == []
    assert kept.read_bytes() == b"\xef\xbb\xbfx = 1\r\n" and stat.S_IMODE(kept.stat().st_mode) == 0o750
    assert not made.exists()
    assert gone.read_bytes() == b"y = 2\n" and stat.S_IMODE(gone.stat().st_mode) == 0o600
    assert _names(tmp_path) == ["gone.py", "kept.py"]


def test_rollback_leaves_paths_staged_without_undo_and_never_touches_uncommitted_ones(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"a0")
    b.write_bytes(b"b0")
    with WriteSet() as ws:
        ws.stage(str(a), b"a1")  # no undo: the replay's way (the journal covers it)
        ws.stage(str(b), b"b1", undo=True, before=b"b0")
        ws.sync()
        ws.commit(str(a))
        assert ws.rollback() == []
    assert a.read_bytes() == b"a1" and b.read_bytes() == b"b0"
    assert _names(tmp_path) == ["a", "b"]  # b's temp was discarded


def test_a_failed_stage_leaves_no_temp_file(tmp_path, monkeypatch):
    target = tmp_path / "t.py"
    target.write_bytes(b"t")

    def full(fd, mode):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fchmod", full)
    with WriteSet() as ws, pytest.raises(OSError, match="No space"):
        ws.stage(str(target), b"new")
    assert _names(tmp_path) == ["t.py"]


def test_commit_drops_the_cached_bytecode_of_the_source(tmp_path):
    src = tmp_path / "m.py"
    src.write_bytes(b"x = 1\n")
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    (cache / "m.cpython-311.pyc").write_bytes(b"pyc")
    (cache / "mm.cpython-311.pyc").write_bytes(b"other module")
    with WriteSet() as ws:
        ws.stage(str(src), b"x = 2\n")
        ws.sync()
        ws.commit(str(src))
    assert _names(cache) == ["mm.cpython-311.pyc"]


def test_directories_are_fsynced_once_each_after_the_files(tmp_path, monkeypatch):
    (tmp_path / "d").mkdir()
    paths = [tmp_path / "d" / f"f{i}" for i in range(3)] + [tmp_path / "g"]
    synced: list[str] = []
    real = os.fsync

    def spy(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    with WriteSet() as ws:
        for p in paths:
            ws.stage(str(p), b"x")
        ws.sync()
        for p in paths:
            ws.commit(str(p))
        ws.sync_dirs()
    assert len(synced) == 6
    assert all(fsutil.TMP_MARK in s for s in synced[:4])  # the files' bytes first, one barrier
    assert sorted(synced[4:]) == sorted([str(tmp_path), str(tmp_path / "d")])
    assert writeset.TMP_MARK == fsutil.TMP_MARK
