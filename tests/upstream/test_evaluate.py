"""evaluate(): overlay x engine verdicts from a local GitHub server, real git history and probe
answers, reaching every verdict; offline with and without cache; --git-dir vs compare API."""

from __future__ import annotations

import datetime as dt

import pytest

from manager.upstream import (
    EngineInfo, EngineProbe, FactCache, GitHubClient, OverlayInfo, ProbeFacts, VERDICTS, evaluate,
    parse_fail_on, render_markdown,
)
from manager.errors import UpstreamError
from tests.helpers.fake_github import UPSTREAM_REPO as REPO
from tests.helpers.fake_github import pull_json

T0 = dt.datetime(2026, 11, 29, 20, 0, tzinfo=dt.timezone.utc)


@pytest.fixture
def gh(gh, upstream):
    """tests/upstream/conftest.py's local GitHub, also answering three PRs: open, closed, merged (upstream's merge)."""
    gh.pulls[(REPO, 1)] = pull_json(REPO, 1, "open")
    gh.pulls[(REPO, 2)] = pull_json(REPO, 2, "closed")
    gh.pulls[(REPO, 3)] = pull_json(REPO, 3, "merged", merge_commit=upstream.merge)
    return gh


OVERLAYS = [
    OverlayInfo("fix-open", repo=REPO, pr=1, state="open", drop_when="PR 1 merged and in the pin"),
    OverlayInfo("fix-closed", repo=REPO, pr=2, state="closed", drop_when="never by merge"),
    OverlayInfo("fix-merged", repo=REPO, pr=3, state="merged", drop_when="pin contains the merge"),
    OverlayInfo("fix-typo", repo=REPO, pr=999, state="open"),
]


def engines(upstream):
    return [
        EngineInfo("old", "1.0.0", "v1.0.0", REPO),
        EngineInfo("new", "2.0.0", "v2.0.0", REPO),
        EngineInfo("side", "1.0.0", upstream.commits["s1"], REPO),
    ]


def prober(table):
    """Probe answers per (engine, overlay): what the overlay engine would say on those sources."""

    def probe(engine, overlays):
        statuses = {o.id: ProbeFacts(table[(engine.id, o.id)], (f"probe: {table[(engine.id, o.id)]} on {engine.id}",))
                    for o in overlays if (engine.id, o.id) in table}
        return EngineProbe(statuses=statuses, unavailable=None if statuses else "no sources")

    return probe


def run(gh, upstream, tmp_path, table=None, **kw):
    client = GitHubClient(FactCache(tmp_path / "gh"), api_url=gh.url, offline=kw.pop("offline", False))
    return evaluate(OVERLAYS, engines(upstream), client, prober=prober(table or {}), **kw)


def verdicts(report):
    return {(r.overlay, r.engine): r.verdict for r in report.results}


def test_every_pair_gets_a_verdict_from_pr_state_and_compare_api(gh, upstream, tmp_path):
    report = run(gh, upstream, tmp_path)
    v = verdicts(report)
    assert len(report.results) == 12
    assert {v[("fix-open", e)] for e in ("old", "new", "side")} == {"keep"}
    assert {v[("fix-closed", e)] for e in ("old", "new", "side")} == {"keep"}
    assert v[("fix-merged", "old")] == "waiting"  # tag before the merge
    assert v[("fix-merged", "new")] == "drop"  # tag after the merge
    assert v[("fix-merged", "side")] == "waiting"  # side branch without the merge (diverged)
    assert {v[("fix-typo", e)] for e in ("old", "new", "side")} == {"unknown"}
    new = next(r for r in report.results if (r.overlay, r.engine) == ("fix-merged", "new"))
    assert any(e.startswith(f"compare {upstream.merge[:12]}...v2.0.0: ahead") and "compare API" in e
               for e in new.evidence)
    side = next(r for r in report.results if (r.overlay, r.engine) == ("fix-merged", "side"))
    assert any(": diverged, the pin does not contain the merge" in e for e in side.evidence)
    typo = next(r for r in report.results if r.overlay == "fix-typo")
    assert any("PR #999 not found in acme/engine (GitHub 404" in e for e in typo.evidence)


def test_pr_and_compare_are_fetched_once_per_run(gh, upstream, tmp_path):
    run(gh, upstream, tmp_path)
    paths = [p for p, _ in gh.requests]
    assert len([p for p in paths if "/pulls/" in p]) == 4
    assert len([p for p in paths if "/compare/" in p]) == 3  # one per pin, for the merged PR only


def test_probes_decide_drop_superseded_and_drift(gh, upstream, tmp_path):
    table = {("new", "fix-closed"): "upstream", ("new", "fix-open"): "superseded", ("old", "fix-open"): "drift",
             ("old", "fix-closed"): "pending"}
    v = verdicts(run(gh, upstream, tmp_path, table))
    assert v[("fix-closed", "new")] == "drop"  # closed unmerged, fixed natively another way
    assert v[("fix-open", "new")] == "superseded"
    assert v[("fix-open", "old")] == "drift"
    assert v[("fix-closed", "old")] == "keep"


def test_all_six_verdicts_are_reachable(gh, upstream, tmp_path):
    table = {("new", "fix-open"): "superseded", ("old", "fix-open"): "drift"}
    assert {r.verdict for r in run(gh, upstream, tmp_path, table).results} == set(VERDICTS)


def test_offline_without_cache_is_unknown_and_asks_nobody(gh, upstream, tmp_path):
    report = run(gh, upstream, tmp_path, offline=True)
    assert {r.verdict for r in report.results} == {"unknown"}
    assert gh.requests == []
    closed = next(r for r in report.results if r.overlay == "fix-closed")
    assert closed.provisional == "keep"
    assert any("offline; nothing cached" in e for e in closed.evidence)


def test_offline_with_cache_repeats_the_online_verdicts_with_their_age(gh, upstream, tmp_path):
    online = verdicts(run(gh, upstream, tmp_path))
    gh.requests.clear()
    later = T0 + dt.timedelta(days=2)
    report = run(gh, upstream, tmp_path, offline=True, now=later)
    assert verdicts(report) == online and gh.requests == []
    merged = next(r for r in report.results if (r.overlay, r.engine) == ("fix-merged", "old"))
    assert any("cache (offline), checked" in e and "ago" in e for e in merged.evidence)


def test_offline_probe_still_decides_without_github_facts(gh, upstream, tmp_path):
    v = verdicts(run(gh, upstream, tmp_path, {("new", "fix-closed"): "upstream"}, offline=True))
    assert v[("fix-closed", "new")] == "drop" and v[("fix-closed", "old")] == "unknown"


def test_git_dir_answers_ancestry_without_compare_requests(gh, upstream, tmp_path):
    report = run(gh, upstream, tmp_path, git_dir=upstream.path)
    v = verdicts(report)
    assert (v[("fix-merged", "old")], v[("fix-merged", "new")], v[("fix-merged", "side")]) == ("waiting", "drop", "waiting")
    assert not [p for p, _ in gh.requests if "/compare/" in p]
    new = next(r for r in report.results if (r.overlay, r.engine) == ("fix-merged", "new"))
    assert any("(local clone)" in e for e in new.evidence) and "(git)" in new.evidence[-1]


def test_git_dir_offline_still_gives_ancestry_for_a_cached_merged_pr(gh, upstream, tmp_path):
    run(gh, upstream, tmp_path, git_dir=upstream.path)  # caches the PRs only
    v = verdicts(run(gh, upstream, tmp_path, offline=True, git_dir=upstream.path))
    assert v[("fix-merged", "new")] == "drop" and v[("fix-merged", "old")] == "waiting"


def test_rate_limited_run_falls_back_to_cached_facts(gh, upstream, tmp_path):
    online = verdicts(run(gh, upstream, tmp_path))
    gh.rate_limited = "403"
    gh.requests.clear()
    report = run(gh, upstream, tmp_path)
    assert verdicts(report) == online
    assert len(gh.requests) == 1  # one refused request, then nothing more
    assert any("rate limit" in e for r in report.results for e in r.evidence)


def test_pin_commit_from_sources_is_named_in_evidence(gh, upstream, tmp_path):
    def probe(engine, overlays):
        return EngineProbe(pin_commit=upstream.commits["c3"][:9], pin_commit_source="vllm/_version.py __commit_id__")

    client = GitHubClient(FactCache(tmp_path / "gh"), api_url=gh.url)
    report = evaluate(OVERLAYS[2:3], [EngineInfo("new", "2.0.0", "v2.0.0", REPO)], client, prober=probe)
    assert report.results[0].evidence[0] == f"pin v2.0.0 = {upstream.commits['c3'][:9]} (vllm/_version.py __commit_id__)"


def test_unknown_tag_falls_back_to_the_sdist_commit_in_compare(gh, upstream, tmp_path):
    def probe(engine, overlays):
        return EngineProbe(pin_commit=upstream.commits["c3"], pin_commit_source="sdist")

    client = GitHubClient(FactCache(tmp_path / "gh"), api_url=gh.url)
    report = evaluate(OVERLAYS[2:3], [EngineInfo("mirror", "2.0.0", "v2.0.0-mirror", REPO)], client, prober=probe)
    assert report.results[0].verdict == "drop"
    assert any("GitHub does not know one of the refs" in e for e in report.results[0].evidence)


def test_no_probe_says_so_in_evidence(gh, upstream, tmp_path):
    client = GitHubClient(FactCache(tmp_path / "gh"), api_url=gh.url)
    report = evaluate(OVERLAYS[:1], engines(upstream)[:1], client, prober=None)
    assert "probe: none (source probes off (--no-probe))" in report.results[0].evidence


def test_json_shape_has_results_with_overlay_engine_verdict_evidence(gh, upstream, tmp_path):
    data = run(gh, upstream, tmp_path).to_json()
    assert set(data["results"][0]) >= {"overlay", "engine", "verdict", "evidence"}
    assert all(isinstance(e, str) for r in data["results"] for e in r["evidence"])


def test_fail_on_selects_results_and_rejects_unknown_names(gh, upstream, tmp_path):
    report = run(gh, upstream, tmp_path)
    assert [(r.overlay, r.engine) for r in report.failing(parse_fail_on("drop,drift"))] == [("fix-merged", "new")]
    with pytest.raises(UpstreamError, match="unknown verdict 'dropp'"):
        parse_fail_on("drop,dropp")


def test_markdown_report_is_stable_offline_and_lists_every_pair(gh, upstream, tmp_path):
    run(gh, upstream, tmp_path)
    first = render_markdown(run(gh, upstream, tmp_path, offline=True))
    second = render_markdown(run(gh, upstream, tmp_path, offline=True))
    assert first == second
    assert "| `fix-merged` | [acme/engine#3](https://github.com/acme/engine/pull/3) | merged 2026-01-02 as" in first
    assert "**drop**: `new`<br>**waiting**: `old`, `side` |" in first
    assert " ago" not in first  # no wall-clock-relative text in the document
    assert first.count("- `old` (pin `v1.0.0`)") == 4


def test_not_applicable_probe_drops_only_inside_the_overlay_versions(gh, upstream, tmp_path):
    ovs = [OverlayInfo("old-only", repo=REPO, pr=1, state="open", versions="<2.0"), OverlayInfo("any")]
    table = {("new", "old-only"): "not-applicable", ("new", "any"): "not-applicable"}
    client = GitHubClient(FactCache(tmp_path / "gh"), api_url=gh.url)
    report = evaluate(ovs, [EngineInfo("new", "2.0.0", "v2.0.0", REPO)], client, prober=prober(table))
    v = verdicts(report)
    assert v[("old-only", "new")] == "keep"  # outside versions: says nothing about upstream
    assert v[("any", "new")] == "drop"  # in range and nothing left to do


def test_a_waiting_verdict_on_an_engine_with_a_pin_ceiling_says_the_pin_cannot_move(gh, upstream, tmp_path):
    """issue 24 (7): an sm70 engine pinned at its ceiling is not told to upgrade to a release it cannot run."""
    client = GitHubClient(FactCache(tmp_path / "gh"), api_url=gh.url)
    capped = EngineInfo("old-sm70", "1.0.0", "v1.0.0", REPO, target_sm=7.0)
    plain = EngineInfo("old", "1.0.0", "v1.0.0", REPO)
    report = evaluate(OVERLAYS, [capped, plain], client, prober=prober({}))
    by = {(r.overlay, r.engine): r for r in report.results}
    capped_r, plain_r = by[("fix-merged", "old-sm70")], by[("fix-merged", "old")]
    assert capped_r.verdict == plain_r.verdict == "waiting"
    assert any(e.startswith("pin ceiling: for sm 7.0 the newest usable release is vLLM 0.19.1 (docs/audit.md") for e in capped_r.evidence)
    assert capped_r.evidence[-1].startswith("verdict waiting") and capped_r.evidence[-1].endswith(
        "drop needs a Volta-capable build of a release containing the fix")
    assert not any("pin ceiling" in e for e in plain_r.evidence)
    # an open PR is no upgrade advice: no ceiling line there
    assert not any("pin ceiling" in e for e in by[("fix-open", "old-sm70")].evidence)
    assert "## Pin ceilings" in render_markdown(report) and "`old-sm70` (built for sm 7.0)" in render_markdown(report)


def test_keep_on_a_capped_engine_names_the_ceiling_when_the_fix_is_native_only_later(gh, upstream, tmp_path):
    client = GitHubClient(FactCache(tmp_path / "gh"), api_url=gh.url)
    capped = EngineInfo("sm70", "0.19.1", "v0.19.1", REPO, target_sm=7.0)
    later = [OverlayInfo("fix-closed-native-later", repo=REPO, pr=2, state="closed", native_from="0.22.0"),
             OverlayInfo("fix-closed-native-before", repo=REPO, pr=2, state="closed", native_from="0.19.0")]
    report = evaluate(later, [capped], client, prober=prober({}))
    by = {r.overlay: r for r in report.results}
    assert by["fix-closed-native-later"].verdict == "keep"
    assert any("(the fix is native from 0.22.0)" in e for e in by["fix-closed-native-later"].evidence)
    assert not any("pin ceiling" in e for e in by["fix-closed-native-before"].evidence)
