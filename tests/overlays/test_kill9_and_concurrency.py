"""kill -9 at random points of `overlay apply`, `overlay revert` and `overlay build`, and
concurrent applies, on real vLLM 0.20.0 files (issue 10, "keep and extend").

Fixed seed; a bounded number of trials per run (CI). More with
`OVERLAY_TEST_KILL_TRIALS=N` (per operation) and `OVERLAY_TEST_CONCURRENT_TRIALS=N`.
Each test prints its figures (run with -s to see them): trials, kills that landed before the
process ended, corrupted files (neither original nor fully patched), recoveries.

Invariants after every kill: each target holds its original or its fully patched bytes; the next
run completes (apply) or undoes (revert) without help; no temp file survives that next run;
revert afterwards gives every original byte back. For builds: no object the next build serves
has the wrong hash, and no temp or trash directory survives it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from manager.catalog import Catalog
from manager.fsutil import is_temp_name
from manager.overlays import apply, load_overlays, revert, status
from tests.helpers import REPO_ROOT
from tests.helpers.catalogs import OVERLAY_IDS, TARGETS, shipped_catalog_dir, slim_root
from tests.helpers.cli import overlay_popen

VERSION = "0.20.0"
SEED = 20261130
KILL_TRIALS = int(os.environ.get("OVERLAY_TEST_KILL_TRIALS", "2"))
CONCURRENT_TRIALS = int(os.environ.get("OVERLAY_TEST_CONCURRENT_TRIALS", "1"))
WRITE_DELAY = "0.3"  # seconds before each file write (after the journal too): widens the windows


@pytest.fixture(scope="module")
def catalog_dir(tmp_path_factory) -> Path:
    return shipped_catalog_dir(tmp_path_factory.mktemp("catalog"))


@pytest.fixture(scope="module")
def expected(tmp_path_factory, catalog_dir) -> dict[str, tuple[bytes, bytes]]:
    root = slim_root(VERSION, tmp_path_factory.mktemp("reference") / "site")
    before = {t: (root / t).read_bytes() for t in TARGETS}
    apply(load_overlays(Catalog(catalog_dir)), root)
    return {t: (before[t], (root / t).read_bytes()) for t in TARGETS}


def _overlays(cat: Path):
    return load_overlays(Catalog(cat))


def _litter(root: Path) -> list[str]:
    """Temp files of ours (or of 0.1.0: `.<target>.XXXXXXXX.tmp`) anywhere under root."""
    names = {Path(t).name for t in TARGETS}
    out = []
    for p in root.rglob(".*"):
        legacy = p.name.endswith(".tmp") and any(p.name.startswith(f".{n}.") for n in names)
        if is_temp_name(p.name) or legacy:
            out.append(str(p.relative_to(root)))
    return out


def _states(root: Path, expected) -> dict[str, str]:
    out = {}
    for t in TARGETS:
        data = (root / t).read_bytes()
        out[t] = "original" if data == expected[t][0] else "patched" if data == expected[t][1] else "CORRUPT"
    return out


def _duration(args: list[str], env: dict) -> float:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "testing.faults", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, cwd=REPO_ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return time.monotonic() - start


def _kill_at(args: list[str], env: dict, at: float, journal: Path | None = None, wait_for=None) -> bool:
    """Start `overlay ARGS`; SIGKILL it `at` seconds after start (or, with `journal`, `at` seconds
    after that file appears: the window between the journal and the writes; or after `wait_for()`
    first holds). True when the process was still running when killed."""
    proc = overlay_popen(*args, env=env)
    if journal is not None:
        wait_for = journal.exists
    try:
        if wait_for is not None:
            deadline = time.monotonic() + 120
            while not wait_for() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.002)
        time.sleep(at)
        alive = proc.poll() is None
        if alive:
            os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.communicate(timeout=120)
    return alive


def _report(name: str, figures: dict) -> None:
    print(f"\n[kill -9 {name}] " + ", ".join(f"{k}={v}" for k, v in figures.items()))


def test_kill9_at_random_points_of_apply_then_next_runs_recover(tmp_path, catalog_dir, expected):
    rng = random.Random(SEED)
    env = {"OVERLAY_TEST_WRITE_DELAY": WRITE_DELAY}
    probe = slim_root(VERSION, tmp_path / "probe")
    total = _duration(["--catalog", str(catalog_dir), "apply", "--root", str(probe)], env)
    fig = {"trials": 0, "killed_running": 0, "journal_window": 0, "corrupted_files": 0,
           "temp_files_after_kill": 0, "recovered": 0, "temp_files_left_after_next_run": 0}
    for i in range(KILL_TRIALS * 2):
        root = slim_root(VERSION, tmp_path / f"t{i}")
        journal = root / ".overlay-manager" / "journal.json"
        # even trials: anywhere in the run; odd ones timed from the journal's appearance, inside
        # the journal window (before the first write) or among the file writes, alternately
        in_window = i % 2 == 1
        d = float(WRITE_DELAY)
        at = rng.uniform(0, total) if not in_window else rng.uniform(0, d * 0.8) if i % 4 == 1 else rng.uniform(d, 3 * d)
        alive = _kill_at(["--catalog", str(catalog_dir), "apply", "--root", str(root)], env, at,
                         journal if in_window else None)
        fig["trials"] += 1
        fig["killed_running"] += alive
        states = _states(root, expected)
        fig["corrupted_files"] += sum(s == "CORRUPT" for s in states.values())
        assert "CORRUPT" not in states.values(), (i, at, states)
        if journal.exists() and all(s == "original" for s in states.values()):
            fig["journal_window"] += 1
        fig["temp_files_after_kill"] += len(_litter(root))
        if i % 3 == 2:  # recovery by revert straight after the kill: originals back, journal gone
            revert(_overlays(catalog_dir), _overlays(catalog_dir), root)
            assert _states(root, expected) == {t: "original" for t in TARGETS}
            assert not journal.exists() and not status(_overlays(catalog_dir), root).failing
        # the next apply completes the job; status is clean; no litter; revert restores all
        result = apply(_overlays(catalog_dir), root)
        assert {o.status for o in result.statuses.overlays} == {"applied"}, (i, result.statuses)
        assert _states(root, expected) == {t: "patched" for t in TARGETS}
        assert not journal.exists()
        left = _litter(root)
        fig["temp_files_left_after_next_run"] += len(left)
        assert left == [], left
        assert not status(_overlays(catalog_dir), root).failing
        revert(_overlays(catalog_dir), _overlays(catalog_dir), root)
        assert _states(root, expected) == {t: "original" for t in TARGETS}
        fig["recovered"] += 1
    _report("apply", fig)
    assert fig["killed_running"] >= 1  # at least one kill landed while the apply was running


def test_kill9_at_random_points_of_revert_then_next_runs_recover(tmp_path, catalog_dir, expected):
    rng = random.Random(SEED + 1)
    env = {"OVERLAY_TEST_WRITE_DELAY": WRITE_DELAY}
    probe = slim_root(VERSION, tmp_path / "probe")
    apply(_overlays(catalog_dir), probe)
    total = _duration(["--catalog", str(catalog_dir), "revert", "--root", str(probe)], env)
    fig = {"trials": 0, "killed_running": 0, "mixed_after_kill": 0, "corrupted_files": 0,
           "temp_files_after_kill": 0, "recovered": 0, "temp_files_left_after_next_run": 0}
    for i in range(KILL_TRIALS * 2):
        root = slim_root(VERSION, tmp_path / f"t{i}")
        apply(_overlays(catalog_dir), root)

        def first_restored(root=root) -> bool:
            return any((root / t).read_bytes() == expected[t][0] for t in TARGETS)

        in_writes = i % 2 == 1  # every other trial: kill between the file writes
        at = rng.uniform(0, float(WRITE_DELAY) * 2) if in_writes else rng.uniform(0, total)
        alive = _kill_at(["--catalog", str(catalog_dir), "revert", "--root", str(root)], env, at,
                         wait_for=first_restored if in_writes else None)
        fig["trials"] += 1
        fig["killed_running"] += alive
        states = _states(root, expected)
        fig["corrupted_files"] += sum(s == "CORRUPT" for s in states.values())
        assert "CORRUPT" not in states.values(), (i, states)
        fig["mixed_after_kill"] += len(set(states.values())) > 1
        fig["temp_files_after_kill"] += len(_litter(root))
        # the next revert finishes the job; then status says pending and apply works again
        revert(_overlays(catalog_dir), _overlays(catalog_dir), root)
        assert _states(root, expected) == {t: "original" for t in TARGETS}
        left = _litter(root)
        fig["temp_files_left_after_next_run"] += len(left)
        assert left == [], left
        report = status(_overlays(catalog_dir), root)
        assert {o.status for o in report.overlays} == {"pending"} and not report.failing
        apply(_overlays(catalog_dir), root)
        assert _states(root, expected) == {t: "patched" for t in TARGETS}
        fig["recovered"] += 1
    _report("revert", fig)
    assert fig["killed_running"] >= 1


def test_concurrent_applies_end_with_the_bytes_of_one(tmp_path, catalog_dir, expected):
    wrong = 0
    for i in range(CONCURRENT_TRIALS):
        root = slim_root(VERSION, tmp_path / f"t{i}")
        procs = [overlay_popen("--catalog", str(catalog_dir), "apply", "--root", str(root)) for _ in range(3)]
        outs = [p.communicate(timeout=300) for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0], outs
        states = _states(root, expected)
        wrong += sum(s != "patched" for s in states.values())
        assert states == {t: "patched" for t in TARGETS}
        assert len([o for o in outs if "updated" in o[1]]) == 1, outs  # one wrote, the others found it done
        ledger = json.loads((root / ".overlay-manager" / "ledger.json").read_text())
        assert sorted(ledger["files"]) == sorted(TARGETS) and set(ledger["overlays"]) == set(OVERLAY_IDS)
        assert _litter(root) == [] and not (root / ".overlay-manager" / "journal.json").exists()
    _report("concurrent", {"trials": CONCURRENT_TRIALS, "processes": 3, "wrong_files": wrong})


# --- overlay build ---------------------------------------------------------------------------


@pytest.mark.network
def test_kill9_at_random_points_of_build_then_next_build_serves_only_verified_objects(tmp_path):
    from tests.helpers import SHIPPED_OVERLAYS
    from tests.helpers.nvrtc12 import nvrtc12_lib

    from manager.kernels import builder

    cat = tmp_path / "catalog"
    shutil.copytree(SHIPPED_OVERLAYS / "sm70-d512-attention", cat / "overlays" / "sm70-d512-attention")
    lib = str(nvrtc12_lib())
    env = {"OVERLAY_CATALOG": str(cat), "OVERLAY_NVRTC": lib}
    rng = random.Random(SEED + 2)
    total = _duration(["build", "--cache", str(tmp_path / "probe")], env)
    fig = {"trials": 0, "killed_running": 0, "objects_before_kill": 0, "bad_objects_served": 0, "recovered": 0,
           "temp_dirs_left_after_next_build": 0}
    for i in range(KILL_TRIALS):
        cache = tmp_path / f"c{i}"
        alive = _kill_at(["build", "--cache", str(cache)], env, rng.uniform(0, total))
        fig["trials"] += 1
        fig["killed_running"] += alive
        fig["objects_before_kill"] += len(list(cache.glob("objects/*/*/meta.json")))
        result = builder.build(cat / "overlays", ["sm70-d512-attention"], cache=cache, nvrtc_path=lib, progress=False)
        assert len(result.items) == 4
        for item in result.items:
            meta = json.loads((Path(item.path).parent / "meta.json").read_text())
            ok = builder.sha256_bytes(Path(item.path).read_bytes()) == meta["sha256"] and meta["key"] == item.key
            fig["bad_objects_served"] += not ok
            assert ok, item
        index = json.loads((cache / "index" / "sm70-d512-attention.json").read_text())
        assert {o["key"] for o in index["objects"]} == {i.key for i in result.items}
        left = [p for p in cache.rglob(".*") if p.name != ".locks"]
        fig["temp_dirs_left_after_next_build"] += len(left)
        assert left == [], left
        fig["recovered"] += 1
    _report("build", fig)


@pytest.mark.network
def test_next_build_removes_what_a_killed_build_left_in_the_cache(tmp_path):
    """The leftovers of a kill inside _publish (temp and trash directories of a key) and inside the
    index write (a marked temp file) go with the next build of that key / overlay."""
    from tests.helpers import SHIPPED_OVERLAYS
    from tests.helpers.nvrtc12 import nvrtc12_lib

    from manager.fsutil import TMP_MARK
    from manager.kernels import builder

    cat = tmp_path / "overlays"
    shutil.copytree(SHIPPED_OVERLAYS / "sm70-d512-attention", cat / "sm70-d512-attention")
    lib, cache = str(nvrtc12_lib()), tmp_path / "cache"
    first = builder.build(cat, ["sm70-d512-attention"], cache=cache, nvrtc_path=lib, progress=False)
    victim = first.items[0]
    obj = Path(victim.path).parent
    shutil.rmtree(obj)  # killed between moving the old entry aside and publishing the new one
    stale = [obj.parent / f".{victim.key[:12]}.k1ll3d", obj.parent / f".trash-{victim.key[:12]}-123-456",
             cache / "index" / f".sm70-d512-attention.json{TMP_MARK}k1ll3d99"]
    for p in stale[:2]:
        (p / "image.ptx").parent.mkdir(parents=True)
        (p / "image.ptx").write_bytes(b"half")
    stale[2].write_text("{")
    r = builder.build(cat, ["sm70-d512-attention"], cache=cache, nvrtc_path=lib, progress=False)
    assert {i.key: i.action for i in r.items}[victim.key] == "compiled"
    assert [p for p in stale if p.exists()] == []
