"""Issue 28 points 7, 8: an overlay directory holding a FIFO or a symlink out of it. Hashing the
directory (the ledger's digest, the warm path, the plan key) never blocks and never reads the host."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from manager import fastpath
from manager.catalog import Catalog
from manager.overlays import apply, load_overlays, select, status
from tests.helpers.catalogs import PR40886, shipped_catalog_dir

VERSION = "0.20.0"


def _within(fn, limit: float = 60.0):
    box = {}

    def run():
        try:
            box["v"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["v"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit)
    return not t.is_alive(), box.get("v")


def test_a_fifo_in_an_overlay_directory_blocks_neither_apply_nor_status_nor_the_warm_path(vllm_root, tmp_path):
    cat = shipped_catalog_dir(tmp_path / "cat", ids=(PR40886,), copies=(PR40886,))
    fifo = cat / "overlays" / PR40886 / "snippets" / "pipe"
    os.mkfifo(fifo)
    root = vllm_root(VERSION)
    every = select(load_overlays(Catalog(cat)), [PR40886])
    try:
        done, got = _within(lambda: apply(every, root))
        assert done, "apply blocked on a FIFO in the overlay directory"
        assert not isinstance(got, BaseException), got
        done, got = _within(lambda: status(every, root))
        assert done and got.overlays[0].status == "applied", got
        done, got = _within(lambda: fastpath.nothing_to_do(["--catalog", str(cat), "apply", "--root", str(root)]))
        assert done and got == [(PR40886, "applied")], got
    finally:
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass


def test_a_symlink_out_of_an_overlay_directory_is_not_read_into_its_digest(tmp_path):
    cat = shipped_catalog_dir(tmp_path / "cat", ids=(PR40886,), copies=(PR40886,))
    host = tmp_path / "host-secret"
    host.write_text("one\n")
    (cat / "overlays" / PR40886 / "snippets" / "leak").symlink_to(host)
    (o,) = load_overlays(Catalog(cat))
    first = o.digest
    host.write_text("two\n")
    (o2,) = load_overlays(Catalog(cat))
    assert o2.digest == first
    assert Path(host).read_text() == "two\n"
