"""Overlay x engine verdicts: gather PR facts, pin ancestry and source probes, then decide.

`evaluate()` works on plain inputs (OverlayInfo, EngineInfo, a GitHubClient, a prober) so it
can be tested without a catalog; `check()` loads those inputs from a catalog.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from collections.abc import Callable, Iterable, Mapping, Sequence

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from ..errors import UpstreamError
from ..overlays.info import OverlayInfo
from .ancestry import Ancestry, check_git_dir, compare_ancestry, git_ancestry, is_sha
from .facts import PRFacts, PRUnavailable, pr_facts
from .github import GitHubClient
from .ceilings import PinCeiling, ceiling_for
from .verdict import VERDICTS, ProbeFacts, Verdict, decide

if TYPE_CHECKING:
    from ..catalog import Catalog
    from ..overlays.loader import Overlay
    from ..profiles.schema import EngineProfile


@dataclass(frozen=True)
class EngineInfo:
    id: str
    vllm_version: str
    upstream_ref: str
    upstream_repo: str | None = None
    image: str | None = None
    target_sm: float | None = None  # the SM the engine is built for: its pin ceiling (ceilings.py)

    @property
    def ceiling(self) -> PinCeiling | None:
        return ceiling_for(self.target_sm)

    @property
    def is_stock_release(self) -> bool:
        return self.upstream_ref == f"v{self.vllm_version}"


@dataclass(frozen=True)
class EngineProbe:
    """What a prober learned about one engine's sources."""

    statuses: dict[str, ProbeFacts] = field(default_factory=dict)  # overlay id -> facts
    unavailable: str | None = None  # why there is no probe
    pin_commit: str | None = None  # commit the sources say they are (vllm/_version.py)
    pin_commit_source: str = ""


Prober = Callable[[EngineInfo, Sequence[OverlayInfo]], EngineProbe]


@dataclass(frozen=True)
class PairResult:
    overlay: str
    engine: str
    verdict: str
    evidence: tuple[str, ...]
    provisional: str | None
    pin: str
    pr_state: str | None

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = {
            "overlay": self.overlay,
            "engine": self.engine,
            "verdict": self.verdict,
            "evidence": list(self.evidence),
            "pin": self.pin,
            "pr_state": self.pr_state,
        }
        if self.provisional:
            data["provisional"] = self.provisional
        return data


@dataclass(frozen=True)
class OverlayRow:
    overlay: OverlayInfo
    pr: PRFacts | PRUnavailable | None


@dataclass(frozen=True)
class CheckReport:
    results: tuple[PairResult, ...]
    overlays: tuple[OverlayRow, ...]
    engines: tuple[EngineInfo, ...]
    offline: bool
    unreachable: str | None = None  # the API could not be reached: GitHub facts came from the cache

    def verdicts(self) -> set[str]:
        return {r.verdict for r in self.results}

    def failing(self, fail_on: Iterable[str]) -> list[PairResult]:
        wanted = set(fail_on)
        return [r for r in self.results if r.verdict in wanted]

    def to_json(self) -> dict[str, object]:
        return {
            "offline": self.offline,
            "unreachable": self.unreachable,
            "results": [r.to_json() for r in self.results],
            "overlays": [
                {
                    "overlay": row.overlay.id,
                    "repo": row.overlay.repo,
                    "pr": row.overlay.pr,
                    "state": row.pr.state if isinstance(row.pr, PRFacts) else None,
                    "merge_commit": row.pr.merge_commit if isinstance(row.pr, PRFacts) else None,
                    "checked_at": (row.pr.checked_at.isoformat()
                                   if isinstance(row.pr, PRFacts) and row.pr.checked_at else None),
                    "evidence": row.pr.evidence if row.pr is not None else "no upstream PR recorded",
                    "drop_when": row.overlay.drop_when,
                }
                for row in self.overlays
            ],
        }


def parse_fail_on(text: str | None) -> tuple[str, ...]:
    if not text:
        return ()
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in items if x not in VERDICTS]
    if bad:
        raise UpstreamError(f"--fail-on {text!r}: unknown verdict {bad[0]!r} (choose from {', '.join(VERDICTS)})")
    return items


def evaluate(
    overlays: Sequence[OverlayInfo],
    engines: Sequence[EngineInfo],
    client: GitHubClient,
    *,
    prober: Prober | None = None,
    git_dir: Path | None = None,
    now: dt.datetime | None = None,
    stop_if_unreachable: bool = False,
) -> CheckReport:
    """Verdicts for every overlay x engine. `now` adds relative ages ("3 min ago") to evidence.
    `stop_if_unreachable`: raise UpstreamError as soon as the API cannot be reached (before the
    source probes), for callers that would fail on `unknown` anyway."""
    if git_dir is not None:
        git_dir = check_git_dir(git_dir)
    rows: list[OverlayRow] = []
    prs: dict[str, PRFacts | PRUnavailable | None] = {}
    for ov in overlays:
        up = ov.upstream_pr
        pr = pr_facts(client, up[0], up[1], now) if up is not None else None
        prs[ov.id] = pr
        rows.append(OverlayRow(ov, pr))
        if stop_if_unreachable and client.unreachable:
            raise UpstreamError(f"{client.unreachable}; stopped (--fail-on unknown): no PR facts to decide with")

    results: list[PairResult] = []
    ancestry_memo: dict[tuple[str, str, str], Ancestry] = {}
    for eng in engines:
        probe = (prober(eng, overlays) if prober is not None
                 else EngineProbe(unavailable="source probes off (--no-probe)"))
        for ov in overlays:
            pr = prs[ov.id]
            facts = probe.statuses.get(ov.id)
            if facts is None:
                facts = ProbeFacts(None, (f"probe: none ({probe.unavailable or 'overlay not in the probe report'})",))
            ancestry = None
            merge = pr.merge_commit if isinstance(pr, PRFacts) and pr.state == "merged" else None
            if merge is None and isinstance(pr, PRUnavailable) and ov.state == "merged":
                merge = ov.merge_commit  # only feeds the provisional verdict
            if ov.has_upstream and merge:
                key = (ov.repo or "", merge, eng.upstream_ref)
                if key not in ancestry_memo:
                    ancestry_memo[key] = _ancestry(client, ov.repo or "", merge, eng, probe, git_dir, now)
                ancestry = ancestry_memo[key]
            v: Verdict = decide(
                has_upstream=ov.has_upstream, pr=pr, ancestry=ancestry, probe=facts, manifest_state=ov.state,
                in_versions=_in_versions(ov.versions, eng.vllm_version),
            )
            evidence = (_with_ceiling(v, eng, ov) if _in_versions(ov.versions, eng.vllm_version) is not False
                        else v.evidence)
            if probe.pin_commit and ancestry is not None and not _same_commit(probe.pin_commit, eng.upstream_ref):
                evidence = (f"pin {eng.upstream_ref} = {probe.pin_commit} ({probe.pin_commit_source})", *evidence)
            results.append(PairResult(
                ov.id, eng.id, v.verdict, evidence, v.provisional, eng.upstream_ref,
                pr.state if isinstance(pr, PRFacts) else None,
            ))
    return CheckReport(tuple(results), tuple(rows), tuple(engines), client.offline, client.unreachable)


def _with_ceiling(v: Verdict, eng: EngineInfo, ov: OverlayInfo) -> tuple[str, ...]:
    """For an engine with a pin ceiling, a verdict that points past the pin says the pin cannot move
    there: waiting (the fix merged after the pin), or keep/unknown for an overlay whose fix is native
    only in a release above the ceiling (`native_from`)."""
    ceiling = eng.ceiling
    if ceiling is None:
        return v.evidence
    later_native = ov.native_from is not None and _later(ov.native_from, ceiling.newest)
    waiting = v.verdict == "waiting" or v.provisional == "waiting"
    if not (waiting or (later_native and v.verdict in ("keep", "unknown"))):
        return v.evidence
    *head, last = v.evidence
    return (*head, ceiling.note(ov.native_from), f"{last}; {ceiling.drop_rule}")


def _later(a: str, b: str) -> bool:
    try:
        return Version(a) > Version(b)
    except InvalidVersion:
        return False


def _in_versions(spec: str, version: str) -> bool | None:
    if not spec:
        return True
    try:
        return SpecifierSet(spec).contains(version, prereleases=True)
    except (InvalidSpecifier, InvalidVersion, TypeError):
        return None


def _same_commit(a: str, b: str) -> bool:
    a, b = a.lower(), b.lower()
    return is_sha(a) and is_sha(b) and (a.startswith(b) or b.startswith(a))


def _ancestry(client: GitHubClient, repo: str, merge: str, eng: EngineInfo, probe: EngineProbe,
              git_dir: Path | None, now: dt.datetime | None) -> Ancestry:
    tried: list[str] = []
    if git_dir is not None:
        got = git_ancestry(git_dir, merge, eng.upstream_ref, probe.pin_commit, probe.pin_commit_source)
        if got.contains is not None:
            return got
        tried.extend(got.evidence)
    got = compare_ancestry(client, repo, merge, eng.upstream_ref, now)
    if got.contains is None and probe.pin_commit and not is_sha(eng.upstream_ref):
        # The tag may be unknown to this GitHub (a mirror): the sdist's commit id still names the pin.
        alt = compare_ancestry(client, repo, merge, probe.pin_commit, now)
        if alt.contains is not None:
            return Ancestry(alt.contains, alt.method, (*tried, *got.evidence, *alt.evidence))
    return Ancestry(got.contains, got.method, (*tried, *got.evidence))


# -- catalog adapters -----------------------------------------------------------------------
def _text(value: str | None) -> str:
    return "" if value is None else value.strip()


def overlay_info(overlay: Overlay) -> OverlayInfo:
    """The upstream facts of a loaded overlay's manifest."""
    return OverlayInfo.from_manifest(overlay.manifest)


def engine_info(engine_id: str, engine: EngineProfile) -> EngineInfo:
    """What a verdict needs of an engine profile: its pin (upstream_ref, else v<vllm_version>)."""
    version = _text(engine.vllm_version)
    ref = _text(engine.upstream_ref) or (f"v{version}" if version else "")
    if not ref:
        raise UpstreamError(f"engine profile {engine_id}: neither upstream_ref nor vllm_version is set")
    return EngineInfo(
        id=engine_id,
        vllm_version=version,
        upstream_ref=ref,
        upstream_repo=_text(engine.upstream_repo) or None,
        image=_text(engine.image) or None,
        target_sm=getattr(engine, "target_sm", None),
    )


def select(items: Mapping[str, object], wanted: Sequence[str] | None, what: str) -> list[str]:
    if not wanted:
        return sorted(items)
    missing = [w for w in wanted if w not in items]
    if missing:
        known = ", ".join(sorted(items)) or "none"
        raise UpstreamError(f"{what} {missing[0]!r} is not in the catalog (known: {known})")
    return list(dict.fromkeys(wanted))


def catalog_inputs(catalog: Catalog, ids: Sequence[str] | None = None, engine_ids: Sequence[str] | None = None,
                   ) -> tuple[list[OverlayInfo], list[EngineInfo]]:
    from ..overlays import load_overlays
    from ..profiles import load_profiles

    loaded = {o.manifest.id: o for o in load_overlays(catalog)}
    overlays = [overlay_info(loaded[i]) for i in select(loaded, ids, "overlay")]
    engines_all = dict(load_profiles(catalog).engines)
    engines = [engine_info(e, engines_all[e]) for e in select(engines_all, engine_ids, "engine")]
    return overlays, engines


_COMMIT_RE = re.compile(r"""__commit_id__\s*=\s*(?:commit_id\s*=\s*)?['"]g?([0-9a-f]{7,40})['"]""")


def sdist_commit(root: Path) -> str | None:
    """The commit a release's sources were built from: `__commit_id__ = 'g<sha>'` in vllm/_version.py."""
    try:
        text = (Path(root) / "vllm" / "_version.py").read_text()
    except OSError:
        return None
    m = _COMMIT_RE.search(text)
    return m.group(1) if m else None
