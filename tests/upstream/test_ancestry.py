"""Pin ancestry: `git merge-base --is-ancestor` in a real clone, and the compare API (answered
by a local server from the same real repository)."""

from __future__ import annotations

import pytest

from manager.errors import UpstreamError
from manager.upstream import FactCache, GitHubClient, compare_ancestry, git_ancestry
from manager.upstream.ancestry import check_git_dir, resolve
from tests.helpers.fake_github import UPSTREAM_REPO as REPO
from tests.helpers.fake_github import build_upstream_repo, git


@pytest.mark.parametrize(
    ("pin", "contains"),
    [("v2.0.0", True), ("v1.0.0", False), ("side-old", False), ("side-new", True), ("main", True)],
)
def test_git_ancestry_answers_whether_the_pin_contains_the_merge(upstream, pin, contains):
    got = git_ancestry(upstream.path, upstream.merge, pin)
    assert got.contains is contains and got.method == "git"
    assert "local clone" in got.evidence[-1]
    assert ("yes" if contains else "no") in got.evidence[-1]


def test_git_ancestry_accepts_a_sha_pin(upstream):
    assert git_ancestry(upstream.path, upstream.merge, upstream.commits["s1"]).contains is False
    assert git_ancestry(upstream.path, upstream.merge, upstream.merge).contains is True


def test_git_ancestry_unknown_when_merge_commit_missing_from_clone(upstream):
    got = git_ancestry(upstream.path, "0123456789abcdef0123456789abcdef01234567", "v2.0.0")
    assert got.contains is None and "not in the clone" in got.evidence[0]


def test_git_ancestry_uses_sdist_commit_when_the_tag_is_missing(upstream):
    got = git_ancestry(upstream.path, upstream.merge, "v9.9.9", upstream.commits["c3"][:9],
                       "vllm/_version.py __commit_id__ in the 9.9.9 sdist")
    assert got.contains is True
    assert got.evidence[0].startswith("git: v9.9.9 not in the clone; using")
    assert "__commit_id__" in got.evidence[0]


def test_git_ancestry_warns_when_tag_and_sdist_commit_disagree(upstream):
    got = git_ancestry(upstream.path, upstream.merge, "v2.0.0", upstream.commits["c1"][:9], "the sdist")
    assert got.contains is True
    assert any("warning: v2.0.0 is" in e for e in got.evidence)


def test_unknown_pin_without_hint_is_unknown(upstream):
    got = git_ancestry(upstream.path, upstream.merge, "v9.9.9")
    assert got.contains is None and "pin v9.9.9 not in the clone" in got.evidence[-1]


def test_git_dir_must_be_a_repository(tmp_path):
    with pytest.raises(UpstreamError, match=f"--git-dir {tmp_path}: not a git repository"):
        check_git_dir(tmp_path)


def test_resolve_prefers_a_tag_over_a_branch_of_the_same_name(tmp_path):
    repo = build_upstream_repo(tmp_path)
    git(repo.path, "branch", "v1.0.0", repo.commits["c3"])
    assert resolve(repo.path, "v1.0.0") == repo.commits["c1"]


@pytest.mark.parametrize(
    ("pin", "status", "contains"),
    [("v2.0.0", "ahead", True), ("v1.0.0", "behind", False), ("side-old", "diverged", False),
     ("side-new", "ahead", True)],
)
def test_compare_api_status_decides_containment(upstream, gh, tmp_path, pin, status, contains):
    c = GitHubClient(FactCache(tmp_path / "gh"), api_url=gh.url)
    got = compare_ancestry(c, REPO, upstream.merge, pin, None)
    assert got.contains is contains and got.method == "compare API"
    assert got.evidence[0].startswith(f"compare {upstream.merge[:12]}...{pin}: {status}, ")
    assert "(compare API, GitHub, checked" in got.evidence[0]
    assert gh.requests[0][0].startswith(f"/repos/{REPO}/compare/{upstream.merge}...{pin}")


def test_compare_identical_means_contained(upstream, gh, tmp_path):
    c = GitHubClient(FactCache(tmp_path / "gh"), api_url=gh.url)
    got = compare_ancestry(c, REPO, upstream.merge, upstream.merge, None)
    assert got.contains is True and ": identical," in got.evidence[0]


def test_compare_with_unknown_ref_is_unknown(upstream, gh, tmp_path):
    c = GitHubClient(FactCache(tmp_path / "gh"), api_url=gh.url)
    got = compare_ancestry(c, REPO, upstream.merge, "v7.7.7", None)
    assert got.contains is None and "GitHub does not know one of the refs" in got.evidence[0]


def test_compare_offline_uses_cached_answer(upstream, gh, tmp_path):
    GitHubClient(FactCache(tmp_path / "gh"), api_url=gh.url).compare(REPO, upstream.merge, "v1.0.0")
    off = GitHubClient(FactCache(tmp_path / "gh"), api_url=gh.url, offline=True)
    got = compare_ancestry(off, REPO, upstream.merge, "v1.0.0", None)
    assert got.contains is False and "cache (offline)" in got.evidence[0]
    none = compare_ancestry(off, REPO, upstream.merge, "v2.0.0", None)
    assert none.contains is None and "unavailable (offline; nothing cached)" in none.evidence[0]


def test_compare_refuses_range_syntax_in_refs(gh, tmp_path):
    c = GitHubClient(FactCache(tmp_path / "gh"), api_url=gh.url)
    with pytest.raises(UpstreamError, match="not a plain ref"):
        c.compare(REPO, "a..b", "v1")
