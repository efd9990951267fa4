"""Issue 28, scope and integrity of the plan path (manager/overlays/plans.py): a prepared plan
writes only the targets of the overlays it applies, what is printed is what was written, and no
read of the plan path (plan file, inputs, overlay directories) blocks or reads without bound."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from manager.overlays import load_overlays
from manager.overlays.plans import PlanRefused, apply_plan, find_plan, manifest_targets
from manager.overlays.applying import apply_and_record
from manager.state import UnreadableFile, overlay_digest, read_bounded
from manager.fsutil import sha256_bytes
from tests.helpers.catalogs import GEMMA4
from tests.overlays.test_prepared_plans import ALL_IDS, _fresh, _tamper, _tree, prepared_020  # noqa: F401
from tests.helpers.catalogs import shipped_catalog
from tests.helpers.fifos import finishes


@pytest.fixture
def catalog(tmp_path):
    return shipped_catalog(tmp_path / "cat", ids=ALL_IDS)


def _unblock(fifo: Path) -> None:
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
    except OSError:
        pass


@pytest.mark.network
def test_a_self_consistent_plan_writing_a_file_no_overlay_targets_is_refused_and_nothing_is_written(
        tmp_path, catalog, prepared_020):
    every, plan_path = prepared_020
    evil = b"import os; os.system('echo pwned')\n"

    def edit(plan):  # a .pth at the root: runs at every interpreter start
        sha = sha256_bytes(evil)
        plan["inputs"]["zz.pth"] = "absent"
        plan["writes"].append({"path": "zz.pth", "pre_sha256": "absent", "post_sha256": sha,
                               "hunks": [[0, 0, evil.decode()]]})
        owner = next(iter(plan["ledger"]["overlays"]))
        plan["ledger"]["files"]["zz.pth"] = {"base_sha256": "absent", "post_sha256": sha, "overlays": {owner: 1}}
        plan["ledger"]["observed"]["zz.pth"] = sha

    _tamper(plan_path, edit)
    root = _fresh(tmp_path, every, "root")
    before = _tree(root)
    with pytest.raises(PlanRefused, match="writes zz.pth, which is not a target of"):
        apply_plan(str(catalog.root), str(root), [], [str(plan_path.parent)])
    assert _tree(root) == before and not (root / "zz.pth").exists()


@pytest.mark.network
def test_a_plan_whose_ledger_the_ledger_schema_refuses_is_refused_and_nothing_is_written(tmp_path, catalog,
                                                                                          prepared_020):
    """The ledger a plan carries is checked by the ledger's own schema (manager.state.validate_ledger)."""
    every, plan_path = prepared_020

    def edit(plan):  # a sentinel version that is not an int: what the next run would call a corrupt ledger
        rel = next(iter(plan["ledger"]["files"]))
        owner = next(iter(plan["ledger"]["files"][rel]["overlays"]))
        plan["ledger"]["files"][rel]["overlays"][owner] = {}

    _tamper(plan_path, edit)
    root = _fresh(tmp_path, every, "root")
    before = _tree(root)
    with pytest.raises(PlanRefused, match="the ledger it carries is malformed: files.*overlays"):
        apply_plan(str(catalog.root), str(root), [], [str(plan_path.parent)])
    assert _tree(root) == before


@pytest.mark.network
def test_printed_changes_are_the_files_written_not_the_plans_own_report(tmp_path, catalog, prepared_020):
    every, plan_path = prepared_020
    real = json.loads(plan_path.read_text())
    written = sorted(w["path"] for w in real["writes"])
    _tamper(plan_path, lambda p: p.__setitem__("report", {"changes": [["identical", "nothing-was-written.py", []]],
                                                          "skipped": []}))
    root = _fresh(tmp_path, every, "root")
    done = apply_plan(str(catalog.root), str(root), [], [str(plan_path.parent)])
    assert done is not None
    assert sorted(p for _, p, _ in done["changes"]) == written
    assert all(v in ("updated", "create", "delete") and ids for v, _, ids in done["changes"])


@pytest.mark.network
def test_a_plan_result_without_the_block_of_the_overlay_it_names_is_refused(tmp_path, catalog, prepared_020):
    """A write whose result carries no sentinel of the overlay the ledger records for it."""
    every, plan_path = prepared_020

    def edit(plan):
        w = next(w for w in plan["writes"] if w["path"] == GEMMA4)
        root = _fresh(tmp_path, every, "probe")
        base = (root / GEMMA4).read_bytes()
        w["hunks"] = [[len(base), len(base), "X = 1\n"]]
        post = sha256_bytes(base + b"X = 1\n")
        w["post_sha256"] = post
        plan["ledger"]["files"][GEMMA4]["post_sha256"] = post
        plan["ledger"]["observed"][GEMMA4] = post

    _tamper(plan_path, edit)
    root = _fresh(tmp_path, every, "root")
    before = _tree(root)
    with pytest.raises(PlanRefused, match=f"the result for {GEMMA4} carries no block of"):
        apply_plan(str(catalog.root), str(root), [], [str(plan_path.parent)])
    assert _tree(root) == before


def test_manifest_targets_reads_block_and_flow_lists_and_gives_up_on_anything_else(tmp_path):
    d = tmp_path / "o"
    d.mkdir()
    (d / "overlay.yaml").write_text("id: o\ntargets:\n  - vllm/a.py   # note\n  - 'vllm/b.py'\nedits: []\n")
    assert manifest_targets(str(d)) == {"vllm/a.py", "vllm/b.py"}
    (d / "overlay.yaml").write_text("id: o\ntargets: [vllm/a.py, \"vllm/c.py\"]\n")
    assert manifest_targets(str(d)) == {"vllm/a.py", "vllm/c.py"}
    for odd in ("targets:\n  - vllm/./a.py\n", "targets:\n  - ../a.py\n", "targets: vllm/a.py\n",
                "targets:\n  - a.py\ntargets:\n  - b.py\n", "targets:\n  - {x: 1}\n"):
        (d / "overlay.yaml").write_text("id: o\n" + odd)
        assert manifest_targets(str(d)) is None, odd


def test_a_fifo_at_the_plan_key_is_refused_without_blocking(tmp_path):
    plans = tmp_path / "plans"
    plans.mkdir()
    os.mkfifo(plans / "k.json")
    done, got = finishes(lambda: find_plan([str(plans)], "k"))
    _unblock(plans / "k.json")
    assert done, "find_plan blocked on a FIFO"
    assert isinstance(got, PlanRefused) and "FIFO" in str(got)


def test_bounded_read_refuses_devices_fifos_and_oversized_files_before_reading(tmp_path):
    (tmp_path / "zero").symlink_to("/dev/zero")
    with pytest.raises(UnreadableFile, match="character device"):
        read_bounded(str(tmp_path / "zero"))
    os.mkfifo(tmp_path / "fifo")
    done, got = finishes(lambda: read_bounded(str(tmp_path / "fifo")))
    _unblock(tmp_path / "fifo")
    assert done and isinstance(got, UnreadableFile) and "FIFO" in str(got)
    (tmp_path / "big").write_bytes(b"x" * 101)
    with pytest.raises(UnreadableFile, match="over the 100-byte limit"):
        read_bounded(str(tmp_path / "big"), 100)
    assert read_bounded(str(tmp_path / "big"), 101) == b"x" * 101


def test_overlay_digest_never_follows_a_symlink_out_of_the_directory_nor_blocks_on_a_fifo(tmp_path):
    d = tmp_path / "o"
    d.mkdir()
    (d / "overlay.yaml").write_text("id: o\n")
    secret = tmp_path / "secret"
    secret.write_text("one\n")
    (d / "link").symlink_to(secret)
    first = overlay_digest(d)
    secret.write_text("two\n")  # the host file's bytes are not part of the digest
    assert overlay_digest(d) == first
    os.mkfifo(d / "pipe")
    done, got = finishes(lambda: overlay_digest(d))
    _unblock(d / "pipe")
    assert done and isinstance(got, str) and got != first


@pytest.mark.network
def test_recording_a_plan_never_reads_a_fifo_target(tmp_path, catalog):
    """With $OVERLAY_PLAN_CACHE the engine hashes every input before its own checks: a FIFO in a
    target's place must be the engine's one-line error, not a hang holding nothing."""
    from manager.errors import OverlayError

    every = load_overlays(catalog)
    root = _fresh(tmp_path, every, "root")
    (root / GEMMA4).unlink()
    os.mkfifo(root / GEMMA4)
    from manager.overlays.plankey import load_key

    (tmp_path / "plan-key").write_bytes(os.urandom(32))  # with a key: the inputs are hashed for the record
    key = load_key(tmp_path / "plan-key")
    done, got = finishes(lambda: apply_and_record(every, root, cache=str(tmp_path / "cache"), key=key), limit=60)
    _unblock(root / GEMMA4)
    assert done, "recording blocked on a FIFO target"
    assert isinstance(got, OverlayError) and "FIFO" in str(got), got
    assert not list((tmp_path / "cache").rglob("*.json")) if (tmp_path / "cache").exists() else True
