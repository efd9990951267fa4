"""The real catalog checked against real vLLM release sources (downloaded once from PyPI, then
offline): the probe path. Known facts: PR #40886 was closed unmerged, yet vLLM >= 0.22.0 handles
the keys natively and >= 0.31.0 no longer has the `_weight_iterator` scope; PR #49797's fix is
native from 0.28.0."""

from __future__ import annotations


import pytest
from packaging.version import Version

from manager import releases
from manager.catalog import Catalog
from manager.upstream import VERDICTS, check, render_markdown
from tests.helpers import REPO_ROOT
from tests.helpers.fake_github import FakeGitHub, pull_json

pytestmark = pytest.mark.network  # PyPI, the first time only

AWQ = "vllm-pr40886-gemma4-awq-moe-keys"
CONVERTOR = "gemma4-convertor-per-layer"


@pytest.fixture(scope="module")
def catalog():
    return Catalog.locate(REPO_ROOT)


@pytest.fixture(scope="module")
def stock_engines(catalog):
    from manager.profiles import load_profiles

    engines = load_profiles(catalog).engines
    stock = {eid: e.vllm_version for eid, e in engines.items() if e.upstream_ref == f"v{e.vllm_version}"}
    for version in sorted(set(stock.values())):
        releases.pristine_tree(version)  # cached for the offline checks below
    return stock


@pytest.fixture(scope="module")
def offline_report(catalog, stock_engines, tmp_path_factory):
    return check(catalog, offline=True, cache_dir=tmp_path_factory.mktemp("gh-empty"), relative_ages=False)


def by_pair(report):
    return {(r.overlay, r.engine): r for r in report.results}


def test_every_catalog_overlay_and_engine_gets_an_evidenced_verdict(catalog, offline_report):
    from manager.overlays import load_overlays
    from manager.profiles import load_profiles

    overlays = {o.manifest.id for o in load_overlays(catalog)}
    engines = set(load_profiles(catalog).engines)
    pairs = by_pair(offline_report)
    assert set(pairs) == {(o, e) for o in overlays for e in engines}
    for r in pairs.values():
        assert r.verdict in VERDICTS and r.evidence
        assert r.evidence[-1].startswith(f"verdict {r.verdict}")


def test_pr40886_overlay_verdicts_follow_the_release_sources(offline_report, stock_engines):
    pairs = by_pair(offline_report)
    for engine, version in stock_engines.items():
        r = pairs[(AWQ, engine)]
        v = Version(version)
        if v >= Version("0.31.0"):
            assert r.verdict == "superseded", (engine, r.evidence)
            assert any("_weight_iterator not found" in e for e in r.evidence)
        elif v >= Version("0.22.0"):
            assert r.verdict == "drop", (engine, r.evidence)
            assert f"probe: upstream at vllm {version} (release sources)" in " ".join(r.evidence)
        else:
            # offline with no cached GitHub fact: unknown, and the manifest's "closed" suggests keep
            assert r.verdict == "unknown" and r.provisional == "keep", (engine, r.evidence)
            assert f"probe: pending at vllm {version} (release sources)" in " ".join(r.evidence)
            assert any("offline; nothing cached" in e for e in r.evidence)


def test_convertor_overlay_is_native_from_0_28(offline_report, stock_engines):
    pairs = by_pair(offline_report)
    for engine, version in stock_engines.items():
        r = pairs[(CONVERTOR, engine)]
        if Version(version) >= Version("0.28.0"):
            assert r.verdict == "drop", (engine, r.evidence)
        else:
            assert r.verdict == "unknown" and r.provisional == "waiting", (engine, r.evidence)


def test_stock_pins_name_the_sdist_commit_id(offline_report):
    r = by_pair(offline_report)[(CONVERTOR, "vllm-0.20.0")]
    assert "pin v0.20.0 = b8160878f (vllm/_version.py __commit_id__ in the 0.20.0 sdist)" in r.evidence


def test_closed_unmerged_pr_from_github_gives_keep_until_the_native_fix(catalog, stock_engines, tmp_path):
    with FakeGitHub() as gh:
        gh.pulls[("vllm-project/vllm", 40886)] = pull_json("vllm-project/vllm", 40886, "closed")
        online = check(catalog, [AWQ], api_url=gh.url, cache_dir=tmp_path / "gh")
        offline = check(catalog, [AWQ], api_url=gh.url, cache_dir=tmp_path / "gh", offline=True)
    for report in (online, offline):
        pairs = by_pair(report)
        for engine, version in stock_engines.items():
            r = pairs[(AWQ, engine)]
            v = Version(version)
            expected = "superseded" if v >= Version("0.31.0") else "drop" if v >= Version("0.22.0") else "keep"
            assert r.verdict == expected, (engine, r.evidence)
            assert r.evidence[0].startswith("PR #40886 closed unmerged")
            if expected == "drop":
                assert any("reached the pin another way" in e for e in r.evidence)
    assert any("cache (offline), checked" in e and " ago" in e for r in offline.results for e in r.evidence)


def test_docs_upstream_md_is_what_the_tool_generates(offline_report):
    doc = (REPO_ROOT / "docs" / "UPSTREAM.md").read_text()
    assert doc.startswith("<!-- generated by `overlay upstream report --format markdown`")
    fresh = render_markdown(offline_report)
    if "GitHub facts: 0 of" in doc:
        # generated offline without cached GitHub facts (as here): must be byte-identical
        assert doc == fresh, "docs/UPSTREAM.md is stale: run `overlay upstream report --format markdown --offline -o docs/UPSTREAM.md`"
    else:  # generated with GitHub facts: at least the same overlays and engines
        rows = lambda text: sorted(l.split("|")[1] for l in text.splitlines() if l.startswith("| `"))
        assert rows(doc) == rows(fresh)


@pytest.fixture(scope="module")
def fork_catalog(tmp_path_factory):
    """The shipped catalog plus a commit-pinned engine (the shipped engines are all stock releases now):
    stock 0.20.0's profile with v0.20.0's commit as its pin, as a fork image built on it would record."""
    import shutil

    import yaml

    root = tmp_path_factory.mktemp("fork-catalog")
    for d in ("profiles", "overlays"):
        shutil.copytree(REPO_ROOT / d, root / d)
    data = yaml.safe_load((REPO_ROOT / "profiles/engines/vllm-0.20.0.yaml").read_text())
    data.update(id="vllm-fork-test", fork=True, upstream_ref="b8160878f", image="example.invalid/vllm-fork:test")
    (root / "profiles/engines/vllm-fork-test.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return Catalog(root)


def test_probe_root_reads_the_given_sources_for_a_commit_pinned_engine(fork_catalog, stock_engines, tmp_path):
    root = releases.pristine_tree("0.22.0")  # stands in for sources copied out of a fork image
    report = check(fork_catalog, [AWQ], ["vllm-fork-test"], offline=True, cache_dir=tmp_path / "gh",
                   probe_roots={"vllm-fork-test": root})
    r = report.results[0]
    assert r.verdict == "drop"
    assert any(e.startswith(f"probe: upstream at vllm-fork-test sources in {root}") for e in r.evidence)


def test_commit_pin_equal_to_a_release_commit_is_probed_on_that_release(fork_catalog, stock_engines, tmp_path):
    report = check(fork_catalog, [AWQ], ["vllm-fork-test"], offline=True, cache_dir=tmp_path / "gh")
    r = report.results[0]
    assert any("vllm 0.20.0 release sources = pin b8160878f" in e for e in r.evidence)
    assert r.verdict == "unknown" and r.provisional == "keep"


def test_sm70_engine_verdicts_say_the_pin_cannot_move_past_0_19_1(offline_report):
    """issue 24 (7): for the V100 engine a fix native only in a later release is not an upgrade away."""
    from manager.upstream.ceilings import CEILINGS

    ceiling = CEILINGS[7.0]
    assert ceiling.newest == "0.19.1" and "docs/audit.md" in ceiling.source
    sm70 = [r for r in offline_report.results if r.engine == "vllm-0.19.1-sm70"]
    capped = [r for r in sm70 if any(e.startswith("pin ceiling: for sm 7.0") for e in r.evidence)]
    assert capped, [r.evidence for r in sm70]
    for r in capped:
        assert r.evidence[-1].startswith(f"verdict {r.verdict}")
        assert r.evidence[-1].endswith("drop needs a Volta-capable build of a release containing the fix")
    # engines without a ceiling never carry the note
    assert not any("pin ceiling" in e for r in offline_report.results if r.engine != "vllm-0.19.1-sm70" for e in r.evidence)
    doc = render_markdown(offline_report)
    assert "## Pin ceilings" in doc and "`vllm-0.19.1-sm70` (built for sm 7.0): the newest usable release is vLLM 0.19.1" in doc
