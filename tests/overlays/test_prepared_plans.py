"""Prepared plans (manager/overlays/plans.py, prepare.py): the engine's first apply replayed
by the standard-library path must write exactly what the engine writes, on every release."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from manager.overlays import apply, load_overlays, revert, status
from manager.overlays.plans import PlanRefused, apply_plan
from manager.overlays.prepare import input_paths, prepare
from tests.helpers import SHIPPED_OVERLAYS
from tests.helpers.catalogs import GEMMA4, PR40886, RELEASES, shipped_catalog
from tests.helpers.cli import overlay_process, run_entry

ALL_IDS = tuple(sorted(p.name for p in SHIPPED_OVERLAYS.iterdir() if (p / "overlay.yaml").is_file()))
HEAVY = ("click", "rich", "pydantic", "libcst", "yaml", "jinja2", "filelock")


def _input_root(version: str, dest: Path, rels) -> Path:
    """A writable root with the release's dist-info and every input file that exists there."""
    from manager.releases import pristine_tree

    src = pristine_tree(version)
    for info in src.glob("vllm-*.dist-info"):
        shutil.copytree(info, dest / info.name)
    (dest / "vllm").mkdir(parents=True, exist_ok=True)
    for rel in rels:
        if (src / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes((src / rel).read_bytes())
    return dest


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under the root (the ledger without its timestamp, the lock file left out)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if not p.is_file() or p.name == "lock":
            continue
        rel = p.relative_to(root).as_posix()
        data = p.read_bytes()
        if p.name == "ledger.json":
            led = json.loads(data)
            led.pop("updated_at")
            data = json.dumps(led, sort_keys=True).encode()
        out[rel] = data
    return out


def _statuses(report) -> list:
    return [(o.id, o.status, [(t.path, t.status, t.detail) for t in o.targets]) for o in report.overlays]


@pytest.fixture
def catalog(tmp_path):
    return shipped_catalog(tmp_path / "cat", ids=ALL_IDS)


@pytest.fixture
def prepared_020(tmp_path, catalog):
    every = load_overlays(catalog)
    (made,) = prepare(every, ["0.20.0"], [], tmp_path / "plans")
    return every, Path(made.path)


def _fresh(tmp_path: Path, every, name: str, version: str = "0.20.0") -> Path:
    return _input_root(version, tmp_path / name, input_paths(every))


@pytest.mark.network
@pytest.mark.parametrize("version", RELEASES)
def test_plan_apply_is_byte_identical_to_the_engine_and_reverts_exactly(tmp_path, catalog, version):
    every = load_overlays(catalog)
    (made,) = prepare(every, [version], [], tmp_path / "plans")
    by_engine, by_plan = _fresh(tmp_path, every, "engine", version), _fresh(tmp_path, every, "plan", version)
    pristine = _tree(by_plan)

    apply(every, by_engine)
    done = apply_plan(str(catalog.root), str(by_plan), [], [str(tmp_path / "plans")])

    assert done is not None and done["plan"] == made.path
    assert _tree(by_plan) == _tree(by_engine)
    assert _statuses(status(every, by_plan)) == _statuses(status(every, by_engine))
    assert _statuses(status(every, by_plan, use_ledger=False)) == _statuses(status(every, by_engine, use_ledger=False))
    # the next start is the warm no-op, and revert restores the original bytes exactly
    again = apply(every, by_plan)
    assert again.fast_path and not again.changes
    revert(every, every, by_plan)
    after = _tree(by_plan)
    assert {k: v for k, v in after.items() if not k.startswith(".overlay-manager/")} == pristine


@pytest.mark.network
def test_named_ids_plan_matches_the_engine_and_only_that_request(tmp_path, catalog):
    every = load_overlays(catalog)
    prepare(every, ["0.20.0"], [PR40886], tmp_path / "plans")
    by_engine, by_plan = _fresh(tmp_path, every, "engine"), _fresh(tmp_path, every, "plan")
    dirs = [str(tmp_path / "plans")]
    assert apply_plan(str(catalog.root), str(by_plan), [], dirs) is None  # another request: no plan
    from manager.overlays import select

    apply(select(every, [PR40886]), by_engine, explicit=True)
    assert apply_plan(str(catalog.root), str(by_plan), [PR40886], dirs) is not None
    assert _tree(by_plan) == _tree(by_engine)


def _tamper(plan_path: Path, fn) -> None:
    plan = json.loads(plan_path.read_text())
    fn(plan)
    plan_path.write_text(json.dumps(plan))


@pytest.mark.network
def test_tampered_result_is_refused_and_nothing_changes(tmp_path, catalog, prepared_020):
    every, plan_path = prepared_020

    def edit(plan):
        w = next(w for w in plan["writes"] if w["path"] == GEMMA4)
        w["hunks"][0][2] = w["hunks"][0][2] + "import os; os.system('echo pwned')\n"

    _tamper(plan_path, edit)
    root = _fresh(tmp_path, every, "root")
    before = _tree(root)
    with pytest.raises(PlanRefused, match=f"result hash mismatch for {GEMMA4}"):
        apply_plan(str(catalog.root), str(root), [], [str(plan_path.parent)])
    assert _tree(root) == before and not (root / ".overlay-manager").exists()


@pytest.mark.network
def test_tampered_plan_through_the_cli_says_so_and_the_full_engine_applies(tmp_path, catalog, prepared_020):
    every, plan_path = prepared_020
    _tamper(plan_path, lambda p: p["writes"][0]["hunks"][0].__setitem__(2, "# evil\n"))
    root, ref = _fresh(tmp_path, every, "root"), _fresh(tmp_path, every, "ref")
    apply(every, ref)
    proc = overlay_process("--catalog", str(catalog.root), "apply", "--root", str(root), "--plans", str(plan_path.parent),
                           timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "refused" in proc.stderr and "result hash mismatch" in proc.stderr and "running the full engine" in proc.stderr
    assert _tree(root) == _tree(ref)


@pytest.mark.network
@pytest.mark.parametrize("bad", ["../outside.py", "/etc/passwd", "vllm/../../outside.py", ".overlay-manager/ledger.json"])
def test_plan_naming_a_path_outside_the_root_is_refused(tmp_path, catalog, prepared_020, bad):
    every, plan_path = prepared_020

    def edit(plan):
        plan["inputs"][bad] = "absent"
        plan["writes"].append({"path": bad, "pre_sha256": "absent", "post_sha256": "0" * 64, "hunks": [[0, 0, "x"]]})

    _tamper(plan_path, edit)
    root = _fresh(tmp_path, every, "root")
    before = _tree(root)
    with pytest.raises(PlanRefused, match="not a relative path inside the root"):
        apply_plan(str(catalog.root), str(root), [], [str(plan_path.parent)])
    assert _tree(root) == before and not (tmp_path / "outside.py").exists()


@pytest.mark.network
def test_plan_through_a_symlinked_directory_leaving_the_root_is_refused(tmp_path, catalog, prepared_020):
    every, plan_path = prepared_020
    root = _fresh(tmp_path, every, "root")
    outside = tmp_path / "elsewhere"
    shutil.move(str(root / "vllm" / "platforms"), outside)
    (root / "vllm" / "platforms").symlink_to(outside, target_is_directory=True)
    before = (outside / "cuda.py").read_bytes()
    with pytest.raises(PlanRefused, match="resolves outside the root"):
        apply_plan(str(catalog.root), str(root), [], [str(plan_path.parent)])
    assert (outside / "cuda.py").read_bytes() == before


@pytest.mark.network
def test_plan_whose_ledger_disagrees_with_its_writes_is_refused(tmp_path, catalog, prepared_020):
    every, plan_path = prepared_020
    _tamper(plan_path, lambda p: p["ledger"]["observed"].__setitem__(GEMMA4, "f" * 64))
    root = _fresh(tmp_path, every, "root")
    with pytest.raises(PlanRefused, match="observed hash"):
        apply_plan(str(catalog.root), str(root), [], [str(plan_path.parent)])


@pytest.mark.network
def test_no_plan_is_used_for_a_hand_edited_target_a_changed_overlay_or_an_applied_root(tmp_path, catalog, prepared_020):
    every, plan_path = prepared_020
    dirs = [str(plan_path.parent)]
    edited = _fresh(tmp_path, every, "edited")
    (edited / GEMMA4).write_bytes((edited / GEMMA4).read_bytes() + b"# local change\n")
    assert apply_plan(str(catalog.root), str(edited), [], dirs) is None
    assert not (edited / ".overlay-manager").exists()

    applied = _fresh(tmp_path, every, "applied")
    apply(every, applied)
    assert apply_plan(str(catalog.root), str(applied), [], dirs) is None

    link = catalog.overlays_dir / PR40886
    src = link.resolve()
    link.unlink()
    shutil.copytree(src, link)
    (link / "overlay.yaml").write_text((link / "overlay.yaml").read_text() + "\n# edited\n")
    assert apply_plan(str(catalog.root), str(_fresh(tmp_path, every, "other")), [], dirs) is None


@pytest.mark.network
def test_plan_apply_process_imports_none_of_the_heavy_modules(tmp_path, catalog, prepared_020):
    every, plan_path = prepared_020
    root, ref = _fresh(tmp_path, every, "root"), _fresh(tmp_path, every, "ref")
    apply(every, ref)
    argv = ["--catalog", str(catalog.root), "apply", "--root", str(root), "--plans", str(plan_path.parent)]
    proc, heavy = run_entry(argv, HEAVY, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert heavy == []
    assert "prepared plan, hashes verified" in proc.stderr
    assert _tree(root) == _tree(ref)


@pytest.mark.network
def test_first_engine_apply_fills_the_plan_cache_and_the_next_container_uses_it(tmp_path, catalog):
    every = load_overlays(catalog)
    cache, key = tmp_path / "cache", tmp_path / "plan-key"
    key.write_bytes(os.urandom(32))
    first, second = _fresh(tmp_path, every, "first"), _fresh(tmp_path, every, "second")

    def run(root: Path) -> subprocess.CompletedProcess:
        return overlay_process("--catalog", str(catalog.root), "apply", "--root", str(root),
                               env={"OVERLAY_PLAN_CACHE": str(cache), "OVERLAY_PLAN_KEY": str(key)}, timeout=300)

    p1 = run(first)
    assert p1.returncode == 0, p1.stderr
    from manager.overlays.plankey import load_key

    # recorded signed, under the key's id (plans of other keys in a shared cache never collide)
    assert "recorded" in p1.stderr and len(list((cache / load_key(key).key_id).glob("*.json"))) == 1
    p2 = run(second)
    assert p2.returncode == 0, p2.stderr
    assert f"prepared plan, hashes verified; signature verified (plan key {load_key(key).key_id})" in p2.stderr
    assert _tree(second) == _tree(first)


@pytest.mark.network
def test_an_unwritable_plan_cache_is_a_note_not_a_failure(tmp_path, catalog):
    every = load_overlays(catalog)
    cache = tmp_path / "not-a-dir"
    cache.write_text("a file where the cache directory should be\n")
    from manager.overlays.applying import apply_and_record

    key = tmp_path / "plan-key"
    key.write_bytes(os.urandom(32))
    from manager.overlays.plankey import load_key

    rec = apply_and_record(every, _fresh(tmp_path, every, "root"), cache=str(cache), key=load_key(key))
    assert rec.result.changes and rec.plan is None and "plan not recorded" in (rec.note or "")


def test_prepare_cli_rejects_an_unknown_overlay_with_one_line(tmp_path, cli_run):

    rc, out, err = cli_run("prepare", "--vllm", "0.20.0", "no-such-overlay", "--out", str(tmp_path / "p"))
    assert rc == 1 and "unknown overlay 'no-such-overlay'" in err
    assert not (tmp_path / "p").exists()


@pytest.mark.network
@pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="needs a bare system python3")
def test_bundle_carries_plans_for_its_deployments_and_its_wrapper_uses_them(tmp_path):
    """The bundle's wrapper sets $OVERLAY_PLANS: a bare python3 (no click, pydantic, libcst) applies
    a deployment's overlays on its pinned release from the prepared plan."""
    from tests.helpers import containers as dh
    from manager.catalog import Catalog
    from manager.overlays import select

    bundle = dh.bundle_dir(Catalog.locate())
    lines = json.loads((bundle / "BUNDLE.json").read_text())["plans"]
    line = next(ln for ln in lines if ln.endswith(".json") and f"vllm 0.20.0 {PR40886}:" in ln)
    assert (bundle / "plans" / line.rsplit(" ", 1)[1]).is_file()
    every = load_overlays(Catalog(bundle / "catalog"))
    root, ref = _fresh(tmp_path, every, "root"), _fresh(tmp_path, every, "ref")
    apply(select(every, [PR40886]), ref, explicit=True)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "OVERLAY_PYTHON": "/usr/bin/python3"}
    proc = subprocess.run([str(bundle / "bin" / "overlay"), "apply", PR40886, "--root", str(root)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "prepared plan, hashes verified; signature verified (plan key " in proc.stderr  # the bundle's key
    assert _tree(root) == _tree(ref)


def test_plan_writes_name_their_temp_files_like_the_engine_so_a_killed_replay_is_cleaned(tmp_path, monkeypatch):
    """A replay killed mid-write leaves `.<file>.overlay-manager-tmp-…`, which the next run removes."""
    from manager import fsutil
    from manager.overlays import writeset

    assert writeset.TMP_MARK == fsutil.TMP_MARK
    target = tmp_path / "a.py"
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        seen.append(os.path.basename(src))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    staged = writeset.WriteSet()
    staged.stage(str(target), b"x = 1\n")
    staged.sync()
    staged.commit(str(target))
    assert target.read_bytes() == b"x = 1\n"
    assert len(seen) == 1 and fsutil._TMP_RE.match(seen[0]), seen


@pytest.mark.network
def test_a_fifo_in_place_of_an_input_never_blocks_the_plan_path_and_a_held_lock_is_not_waited_for(tmp_path, catalog, prepared_020):
    every, plan_path = prepared_020
    dirs = [str(plan_path.parent)]
    fifo_root = _fresh(tmp_path, every, "fifo")
    (fifo_root / GEMMA4).unlink()
    os.mkfifo(fifo_root / GEMMA4)
    started = time.monotonic()
    assert apply_plan(str(catalog.root), str(fifo_root), [], dirs) is None  # the engine reports it
    assert time.monotonic() - started < 30

    held = _fresh(tmp_path, every, "held")
    from manager.overlays.lock import LockBusy, root_lock

    with root_lock(held / ".overlay-manager"):
        with pytest.raises(LockBusy):  # fastpath then leaves it to the full CLI, which waits visibly (--wait)
            apply_plan(str(catalog.root), str(held), [], dirs)
    assert not (held / ".overlay-manager" / "ledger.json").exists()


@pytest.mark.network
def test_plan_replay_makes_journal_and_originals_durable_before_any_target_and_unlinks_the_journal_last(
        tmp_path, catalog, prepared_020, monkeypatch):
    """The replay's fsync order (power loss, not only kill -9): every byte fsynced before the first
    rename; the journal and the originals renamed and their directories fsynced before any target
    is replaced; the ledger renamed after every target; every target's directory and the state
    directory fsynced after that and before the journal is removed (plans.py, "the stdlib
    transaction")."""
    every, plan_path = prepared_020
    root = _fresh(tmp_path, every, "root")
    state = os.path.realpath(root / ".overlay-manager")
    events: list[tuple[str, str]] = []
    real_fsync, real_replace, real_unlink = os.fsync, os.replace, os.unlink

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", os.path.realpath(dst)))
        return real_replace(src, dst)

    def unlink(path, *a, **kw):
        events.append(("unlink", os.path.realpath(path)))
        return real_unlink(path, *a, **kw)

    planned_dirs = {os.path.dirname(os.path.realpath(root / w["path"])) for w in json.loads(plan_path.read_text())["writes"]}
    ancestors = {a for d in planned_dirs for a in [d, *Path(d).parents] if str(a).startswith(os.path.realpath(root))}
    missing_before = {str(a) for a in ancestors if not os.path.isdir(a)}  # a new file's folder the replay creates
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "unlink", unlink)
    done = apply_plan(str(catalog.root), str(root), [], [str(plan_path.parent)])
    monkeypatch.undo()
    assert done is not None

    def first(kind, pred):
        return next(i for i, (k, p) in enumerate(events) if k == kind and pred(p))

    def last(kind, pred):
        return max(i for i, (k, p) in enumerate(events) if k == kind and pred(p))

    journal, ledger = os.path.join(state, "journal.json"), os.path.join(state, "ledger.json")
    writes = json.loads(plan_path.read_text())["writes"]
    targets = {os.path.realpath(root / w["path"]) for w in writes}
    originals = {p for k, p in events if k == "replace" and os.path.dirname(p) == os.path.join(state, "originals")}
    assert targets and originals == {os.path.join(state, "originals", w["pre_sha256"]) for w in writes
                                     if w["pre_sha256"] != "absent"}  # every file that existed is kept
    renames = [i for i, (k, _) in enumerate(events) if k == "replace"]
    # barrier 1: every renamed file's temp was fsynced before the first rename, each exactly once
    temps = [p for k, p in events[: renames[0]] if k == "fsync" and ".overlay-manager-tmp-" in p]
    assert len(temps) == len(renames) == len(set(temps))
    # barrier 2: journal and originals renamed, their directories fsynced, before any target
    first_target = first("replace", lambda p: p in targets)
    assert last("replace", lambda p: p in originals or p == journal) < first_target
    assert last("replace", lambda p: p == journal) < first("fsync", lambda p: p == state) < first_target
    assert first("fsync", lambda p: p == os.path.join(state, "originals")) < first_target
    # ledger last; barrier 3: every target's directory and the state directory fsynced after it,
    # before the journal goes
    led_at = first("replace", lambda p: p == ledger)
    assert led_at == renames[-1] and last("replace", lambda p: p in targets) < led_at
    gone = first("unlink", lambda p: p == journal)
    for d in {os.path.dirname(t) for t in targets} | {state}:
        assert any(k == "fsync" and p == d for k, p in events[led_at:gone]), d
    # instead of the engine's 2 fsyncs per file: each temp file once, then directories once each
    # (state, originals/ and the root, which got the state directory; the target directories and state)
    # and, for each folder the replay had to create, its parent once (the new entry made durable)
    tdirs = {os.path.dirname(t) for t in targets}
    created_parents = {os.path.dirname(d) for d in missing_before} - tdirs - {os.path.realpath(root), state}
    assert {p for k, p in events if k == "fsync"} >= created_parents
    assert sum(k == "fsync" for k, _ in events) == len(renames) + 3 + len(tdirs) + 1 + len(created_parents)
    assert not os.path.exists(journal)


@pytest.mark.network
def test_a_ledger_on_disk_before_a_target_rename_is_recovered_by_the_journal(tmp_path, catalog, prepared_020, monkeypatch):
    """What barrier 3 relies on: after a power loss the ledger may be on disk while a target's
    rename is not (the target still has its original bytes) and the journal is still there. The
    next apply completes the job to the engine's bytes, and revert gives every original back."""
    every, plan_path = prepared_020
    root, ref = _fresh(tmp_path, every, "root"), _fresh(tmp_path, every, "ref")
    pristine = _tree(root)
    apply(every, ref)
    real_unlink = os.unlink
    monkeypatch.setattr(os, "unlink", lambda p, *a, **kw: None if str(p).endswith("journal.json") else real_unlink(p, *a, **kw))
    assert apply_plan(str(catalog.root), str(root), [], [str(plan_path.parent)]) is not None
    monkeypatch.undo()
    journal = root / ".overlay-manager" / "journal.json"
    assert journal.exists() and (root / ".overlay-manager" / "ledger.json").exists()
    (root / GEMMA4).write_bytes(pristine[GEMMA4])  # its rename lost, the ledger's kept
    assert status(every, root).interrupted  # the ledger is not trusted while the journal is there
    result = apply(every, root)
    assert any(c.path == GEMMA4 for c in result.changes) and not journal.exists()
    assert {o.status for o in result.statuses.overlays} == {o.status for o in status(every, ref).overlays}
    assert _tree(root) == _tree(ref)
    revert(every, every, root)
    assert {k: v for k, v in _tree(root).items() if not k.startswith(".overlay-manager/")} == pristine


def test_fsync_all_syncs_every_fd_from_its_threads_and_reports_a_file_error(tmp_path):
    from manager.overlays import writeset

    fds = [os.open(tmp_path / f"f{i}", os.O_WRONLY | os.O_CREAT, 0o644) for i in range(5)]
    try:
        writeset.fsync_all(fds)  # every fd, concurrently; no error
        bad = os.open(tmp_path / "gone", os.O_WRONLY | os.O_CREAT, 0o644)
        os.close(bad)  # a closed descriptor: EBADF from whichever thread syncs it
        with pytest.raises(OSError):
            writeset.fsync_all([*fds, bad])
        writeset.fsync_all([*fds, bad], strict=False)  # directories: skipped, as fsutil.fsync_dir does
    finally:
        for fd in fds:
            os.close(fd)
