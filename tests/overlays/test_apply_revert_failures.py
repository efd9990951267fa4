"""Failure paths of the overlay engine on a real vLLM 0.20.0 tree (issue 2, point 10).

One overlay of a set fails -> nothing changes; SIGKILL between file writes -> every file is
original or fully patched and the next status/apply/revert handle it; two concurrent applies
-> the bytes of one; revert refuses a file edited after apply and never touches foreign files.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from manager import releases
from manager.catalog import Catalog
from manager.errors import OverlayError
from manager.overlays import apply, load_overlays, revert, status
from tests.helpers.catalogs import OVERLAY_IDS, shipped_catalog_dir, tree_hashes
from tests.helpers.cli import overlay_popen, overlay_process

VERSION = "0.20.0"
TARGETS = (
    "vllm/model_executor/models/gemma4.py",
    "vllm/platforms/cuda.py",
    "vllm/transformers_utils/model_arch_config_convertor.py",
)


@pytest.fixture(scope="module")
def catalog_dir(tmp_path_factory) -> Path:
    return shipped_catalog_dir(tmp_path_factory.mktemp("catalog"))


@pytest.fixture(scope="module")
def expected(tmp_path_factory, catalog_dir) -> dict[str, tuple[bytes, bytes]]:
    """target -> (original bytes, fully patched bytes), from a separate copy of the release."""
    root = releases.copy_release(VERSION, tmp_path_factory.mktemp("reference") / "site")
    before = {t: (root / t).read_bytes() for t in TARGETS}
    result = apply(load_overlays(Catalog(catalog_dir)), root)
    assert sorted(c.path for c in result.changes) == sorted(TARGETS)
    return {t: (before[t], (root / t).read_bytes()) for t in TARGETS}


def _overlays(catalog_dir: Path):
    return load_overlays(Catalog(catalog_dir))


def _broken_catalog(tmp_path: Path, overlay_id: str, mutate) -> Path:
    cat = shipped_catalog_dir(tmp_path / "catalog", copies=(overlay_id,))
    mutate(cat / "overlays" / overlay_id)
    return cat


# --- (1) one overlay in a set fails -> nothing on disk changes -----------------------------


def _snippet_that_does_not_compile(d: Path) -> None:
    p = d / "snippets" / "compat_helper.py"
    p.write_text(p.read_text() + "\nreturn None  # module level: parses, does not compile\n")


def _anchor_that_drifts(d: Path) -> None:
    p = d / "overlay.yaml"
    text = p.read_text()
    assert 'anchor: \'if "moe.gate_up_proj" in name and weight.dim() == 3:\'' in text
    p.write_text(text.replace('"moe.gate_up_proj" in name and weight.dim() == 3', '"moe.gate_up_proj" in name and weight.dim() == 4'))


@pytest.mark.parametrize(
    "overlay_id, mutate, target, reason",
    [
        ("gemma4-convertor-per-layer", _snippet_that_does_not_compile,
         "vllm/transformers_utils/model_arch_config_convertor.py", "does not compile"),
        ("vllm-pr40886-gemma4-awq-moe-keys", _anchor_that_drifts,
         "vllm/model_executor/models/gemma4.py", "drift"),
    ],
    ids=["compile-error", "anchor-drift"],
)
def test_one_failing_overlay_in_a_set_changes_no_file(tmp_path, vllm_root, overlay_id, mutate, target, reason):
    root = vllm_root(VERSION)
    cat = _broken_catalog(tmp_path, overlay_id, mutate)
    before = tree_hashes(root)
    with pytest.raises(OverlayError) as info:
        apply(load_overlays(Catalog(cat)), root)
    msg = str(info.value)
    assert overlay_id in msg and target in msg and reason in msg
    after = tree_hashes(root)
    assert {k: v for k, v in after.items() if not k.startswith(".overlay-manager/")} == before
    assert set(after) - set(before) <= {".overlay-manager/lock"}  # only the lock file; no originals, no ledger
    assert not (root / ".overlay-manager" / "ledger.json").exists()
    assert not (root / ".overlay-manager" / "journal.json").exists()
    # through the CLI: exit 1, one line naming overlay and target, still nothing changed
    proc = overlay_process("--catalog", str(cat), "apply", "--root", str(root))
    assert proc.returncode == 1
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert lines and lines[0].startswith("error:") and overlay_id in proc.stderr and target in proc.stderr
    assert tree_hashes(root, without_state=True) == before


# --- (2) SIGKILL between file writes --------------------------------------------------------


def _kill_after_first_write(root: Path, cat: Path, expected, delay: float = 4.0) -> list[str]:
    """Start `overlay apply` with a pause between file writes; SIGKILL it once one target changed."""
    proc = overlay_popen("--catalog", str(cat), "apply", "--root", str(root),
                     env={"OVERLAY_TEST_WRITE_DELAY": str(delay)})
    written: list[str] = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            written = [t for t in TARGETS if (root / t).read_bytes() != expected[t][0]]
            if written:
                break
            time.sleep(0.01)
        assert proc.poll() is None, f"apply finished before it could be killed: {proc.communicate()}"
        assert written, "no file was written within 120 s"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return written


def _assert_each_original_or_patched(root: Path, expected) -> dict[str, str]:
    states = {}
    for t in TARGETS:
        data = (root / t).read_bytes()
        original, patched = expected[t]
        assert data in (original, patched), f"{t} is neither the original nor the fully patched bytes"
        states[t] = "patched" if data == patched else "original"
    return states


def test_sigkill_during_apply_leaves_whole_files_and_next_runs_repair(vllm_root, catalog_dir, expected):
    root = vllm_root(VERSION)
    written = _kill_after_first_write(root, catalog_dir, expected)
    states = _assert_each_original_or_patched(root, expected)
    assert "patched" in states.values() and "original" in states.values(), states
    assert set(written) == {t for t, s in states.items() if s == "patched"}
    assert not (root / ".overlay-manager" / "ledger.json").exists()
    assert (root / ".overlay-manager" / "journal.json").exists()

    # the next status sees the half state: never a silent "applied" for everything, and it
    # fails (exit 1) while the interrupted apply's journal is on disk (issue 10, item 4)
    proc = overlay_process("--catalog", str(catalog_dir), "status", "--root", str(root), "--json")
    assert proc.returncode == 1, proc.stderr
    assert "journal.json" in proc.stderr and "interrupted" in proc.stderr
    report = json.loads(proc.stdout)
    assert report["source"] == "sources"
    per_target = {t["path"]: t["status"] for o in report["overlays"] for t in o["targets"]}
    for t, s in states.items():
        assert per_target[t] == ("applied" if s == "patched" else "pending"), (t, per_target[t])
    assert {o["status"] for o in report["overlays"]} >= {"applied", "pending"}

    # the next apply completes it (and folds the journal into the ledger)
    proc = overlay_process("--catalog", str(catalog_dir), "apply", "--root", str(root))
    assert proc.returncode == 0, proc.stderr
    assert "interrupted apply" in proc.stderr
    for t in TARGETS:
        assert (root / t).read_bytes() == expected[t][1]
    assert not (root / ".overlay-manager" / "journal.json").exists()
    ledger = json.loads((root / ".overlay-manager" / "ledger.json").read_text())
    assert sorted(ledger["files"]) == sorted(TARGETS)
    assert all(o.status == "applied" for o in status(_overlays(catalog_dir), root).overlays)

    # revert afterwards restores every original byte, including the file the killed run wrote
    proc = overlay_process("--catalog", str(catalog_dir), "revert", "--root", str(root))
    assert proc.returncode == 0, proc.stderr
    for t in TARGETS:
        assert (root / t).read_bytes() == expected[t][0], t


def test_revert_straight_after_sigkill_restores_originals(vllm_root, catalog_dir, expected):
    root = vllm_root(VERSION)
    _kill_after_first_write(root, catalog_dir, expected)
    pristine = releases.pristine_tree(VERSION)
    proc = overlay_process("--catalog", str(catalog_dir), "revert", "--root", str(root))
    assert proc.returncode == 0, proc.stderr
    for t in TARGETS:
        assert (root / t).read_bytes() == (pristine / t).read_bytes(), t
    assert {o.status for o in status(_overlays(catalog_dir), root, use_ledger=False).overlays} == {"pending"}


# --- (3) two concurrent applies ---------------------------------------------------------------


def test_two_concurrent_applies_end_with_the_bytes_of_one(vllm_root, catalog_dir, expected):
    root = vllm_root(VERSION)
    before = tree_hashes(root)
    procs = [overlay_popen("--catalog", str(catalog_dir), "apply", "--root", str(root)) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    for t in TARGETS:
        assert (root / t).read_bytes() == expected[t][1]
    after = tree_hashes(root)
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert {k for k in changed if not k.startswith(".overlay-manager/") and "__pycache__" not in k} == set(TARGETS)
    ledger = json.loads((root / ".overlay-manager" / "ledger.json").read_text())
    assert sorted(ledger["files"]) == sorted(TARGETS)
    assert set(ledger["overlays"]) == set(OVERLAY_IDS)
    assert not (root / ".overlay-manager" / "journal.json").exists()
    # exactly one of the two wrote; the other found everything applied
    wrote = [o for o in outs if "updated" in o[1]]
    assert len(wrote) == 1, outs


# --- (4) revert refusals ----------------------------------------------------------------------


def test_revert_refuses_when_a_patched_file_was_edited_after_apply(vllm_root, catalog_dir, expected):
    root = vllm_root(VERSION)
    apply(_overlays(catalog_dir), root)
    edited = root / TARGETS[1]
    edited.write_bytes(edited.read_bytes() + b"# local hotfix\n")
    before = tree_hashes(root)
    proc = overlay_process("--catalog", str(catalog_dir), "revert", "--root", str(root))
    assert proc.returncode == 1
    assert "revert refused" in proc.stderr and TARGETS[1] in proc.stderr and "changed since" in proc.stderr
    assert len([l for l in proc.stderr.splitlines() if l.strip()]) == 1
    assert tree_hashes(root) == before
    with pytest.raises(OverlayError, match="revert refused"):
        revert(_overlays(catalog_dir), _overlays(catalog_dir), root)
    assert tree_hashes(root) == before


def test_revert_never_touches_a_file_without_our_sentinel(vllm_root, catalog_dir):
    root = vllm_root(VERSION)
    before = tree_hashes(root)
    result = revert(_overlays(catalog_dir), _overlays(catalog_dir), root)  # nothing applied, no ledger
    assert result.changes == ()
    assert tree_hashes(root, without_state=True) == before


def test_revert_without_ledger_removes_only_sentinel_blocks(vllm_root, catalog_dir, expected):
    """A tree patched elsewhere (ledger lost): revert removes our blocks, other files stay."""
    root = vllm_root(VERSION)
    apply(_overlays(catalog_dir), root)
    (root / ".overlay-manager" / "ledger.json").unlink()
    others = {k: v for k, v in tree_hashes(root, without_state=True).items() if k not in TARGETS}
    revert(_overlays(catalog_dir), _overlays(catalog_dir), root)
    for t in TARGETS:
        assert (root / t).read_bytes() == expected[t][0], t
    assert {k: v for k, v in tree_hashes(root).items() if k in others} == others


def test_revert_leaves_a_reinstalled_file_alone(vllm_root, catalog_dir, expected):
    """A patched file replaced by the original (package reinstalled) carries no sentinel: never rewritten."""
    root = vllm_root(VERSION)
    apply(_overlays(catalog_dir), root)
    (root / TARGETS[0]).write_bytes(expected[TARGETS[0]][0])
    proc = overlay_process("--catalog", str(catalog_dir), "revert", "--root", str(root))
    assert (root / TARGETS[0]).read_bytes() == expected[TARGETS[0]][0]
    if proc.returncode != 0:  # refused as a whole: then nothing else changed either
        assert proc.returncode == 1 and TARGETS[0] in proc.stderr
        for t in TARGETS[1:]:
            assert (root / t).read_bytes() == expected[t][1]
    else:
        for t in TARGETS:
            assert (root / t).read_bytes() == expected[t][0]
