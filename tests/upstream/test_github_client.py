"""GitHub client: ETag revalidation, 404 facts, rate limits, offline answers (local HTTP server)."""

from __future__ import annotations

import datetime as dt
import socket

import pytest

from manager.errors import UpstreamError
from manager.upstream import FactCache, Fetched, GitHubClient, Unavailable, pr_facts
from manager.upstream.facts import PRFacts, PRUnavailable
from tests.helpers.fake_github import FakeGitHub, pull_json

REPO = "vllm-project/vllm"
T0 = dt.datetime(2026, 11, 29, 20, 0, tzinfo=dt.timezone.utc)


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> dt.datetime:
        return self.t


@pytest.fixture
def gh():
    with FakeGitHub() as fake:
        fake.pulls[(REPO, 40886)] = pull_json(REPO, 40886, "closed")
        yield fake


def client(fake, tmp_path, **kw):
    return GitHubClient(FactCache(tmp_path / "gh"), api_url=fake.url, **kw)


def test_second_fetch_revalidates_with_etag_and_keeps_fetched_at(gh, tmp_path):
    clock = Clock()
    c = client(gh, tmp_path, now=clock)
    first = c.pull(REPO, 40886)
    assert isinstance(first, Fetched) and first.origin == "GitHub" and first.body["state"] == "closed"
    assert "if-none-match" not in gh.requests[0][1]
    clock.t = T0 + dt.timedelta(minutes=30)
    second = c.pull(REPO, 40886)
    assert gh.requests[1][1]["if-none-match"].startswith('W/"')
    assert second.origin == "GitHub, 304"
    assert second.fetched_at == T0 and second.checked_at == clock.t
    assert second.body == first.body
    # the revalidation time is persisted: an offline client sees it
    off = GitHubClient(FactCache(tmp_path / "gh"), api_url=gh.url, offline=True).pull(REPO, 40886)
    assert off.checked_at == clock.t and off.origin == "cache"


def test_changed_pr_is_refetched_when_etag_no_longer_matches(gh, tmp_path):
    c = client(gh, tmp_path)
    assert c.pull(REPO, 40886).body["merged"] is False
    gh.pulls[(REPO, 40886)] = pull_json(REPO, 40886, "merged", merge_commit="a" * 40)
    again = c.pull(REPO, 40886)
    assert again.origin == "GitHub" and again.body["merged"] is True
    assert again.body["merge_commit_sha"] == "a" * 40


def test_cache_keeps_only_the_fields_used(gh, tmp_path):
    fact = client(gh, tmp_path).pull(REPO, 40886)
    assert set(fact.body) <= {"number", "state", "merged", "merged_at", "closed_at", "merge_commit_sha",
                              "title", "html_url", "head_sha"}
    assert fact.body["head_sha"] == "f" * 40


def test_unknown_pr_is_a_404_fact_and_cached_for_offline(gh, tmp_path):
    got = pr_facts(client(gh, tmp_path), REPO, 99999999, None)
    assert isinstance(got, PRFacts) and got.state == "not-found"
    assert "PR #99999999 not found in vllm-project/vllm (GitHub 404" in got.evidence
    off = pr_facts(client(gh, tmp_path, offline=True), REPO, 99999999, None)
    assert off.state == "not-found" and "cache (offline)" in off.evidence


def test_primary_rate_limit_stops_requests_and_answers_from_cache(gh, tmp_path):
    gh.pulls[(REPO, 1)] = pull_json(REPO, 1, "open")
    c = client(gh, tmp_path)
    assert c.pull(REPO, 40886).origin == "GitHub"
    gh.rate_limited = "403"
    limited = c.pull(REPO, 40886)
    assert isinstance(limited, Fetched) and limited.origin == "cache"
    assert "rate limit (HTTP 403" in limited.note
    before = len(gh.requests)
    nothing = c.pull(REPO, 1)  # not cached: no fact, and GitHub is not asked again
    assert isinstance(nothing, Unavailable) and "rate limit" in nothing.reason
    assert len(gh.requests) == before
    # a later run with the same cache does not hammer either (back-off persisted until the reset)
    again = client(gh, tmp_path).pull(REPO, 40886)
    assert again.origin == "cache" and len(gh.requests) == before


def test_secondary_rate_limit_429_honours_retry_after(gh, tmp_path):
    clock = Clock()
    gh.rate_limited = "429"
    c = client(gh, tmp_path, now=clock)
    got = c.pull(REPO, 40886)
    assert isinstance(got, Unavailable) and "HTTP 429" in got.reason
    assert "20:02 UTC" in got.reason  # Retry-After: 120 s from the clock
    blocked = FactCache(tmp_path / "gh").blocked_until(T0)
    assert blocked is not None and blocked[0] == T0 + dt.timedelta(seconds=120)
    # once the back-off has passed, a new run asks GitHub again
    gh.rate_limited = None
    clock.t = T0 + dt.timedelta(seconds=121)
    assert client(gh, tmp_path, now=clock).pull(REPO, 40886).origin == "GitHub"


def test_offline_without_cache_has_no_fact_and_makes_no_request(gh, tmp_path):
    got = client(gh, tmp_path, offline=True).pull(REPO, 40886)
    assert isinstance(got, Unavailable) and got.reason == "offline; nothing cached"
    assert gh.requests == []
    pr = pr_facts(client(gh, tmp_path, offline=True), REPO, 40886, None)
    assert isinstance(pr, PRUnavailable) and "offline; nothing cached" in pr.evidence


def test_offline_answer_says_how_old_the_fact_is(gh, tmp_path):
    client(gh, tmp_path, now=lambda: T0).pull(REPO, 40886)
    later = T0 + dt.timedelta(hours=5)
    pr = pr_facts(client(gh, tmp_path, offline=True), REPO, 40886, later)
    assert pr.state == "closed"
    assert pr.evidence == ("PR #40886 closed unmerged 2026-01-02T03:04:05Z "
                           "(cache (offline), checked 2026-11-29 20:00 UTC, 5 h ago)")


def test_closed_pr_with_test_merge_sha_is_not_read_as_merged(gh, tmp_path):
    pr = pr_facts(client(gh, tmp_path), REPO, 40886, None)
    assert pr.state == "closed" and pr.merge_commit is None


def test_merged_pr_gives_merge_commit(gh, tmp_path):
    gh.pulls[(REPO, 7)] = pull_json(REPO, 7, "merged", merge_commit="c" * 40)
    pr = pr_facts(client(gh, tmp_path), REPO, 7, None)
    assert pr.state == "merged" and pr.merge_commit == "c" * 40
    assert pr.evidence.startswith("PR #7 merged 2026-01-02T03:04:05Z as cccccccccccc (GitHub, checked")


def test_token_from_environment_is_sent_as_bearer(gh, tmp_path, monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_test123")
    client(gh, tmp_path).pull(REPO, 40886)
    assert gh.requests[0][1]["authorization"] == "Bearer ghp_test123"
    assert gh.requests[0][1]["accept"] == "application/vnd.github+json"


def test_no_token_sends_no_authorization(gh, tmp_path, monkeypatch):
    monkeypatch.delenv("GITHUB_TOKEN", raising=False)
    client(gh, tmp_path).pull(REPO, 40886)
    assert "authorization" not in gh.requests[0][1]


def test_server_error_falls_back_to_cache_with_the_reason(gh, tmp_path):
    client(gh, tmp_path).pull(REPO, 40886)
    gh.fail_status = 502
    got = client(gh, tmp_path).pull(REPO, 40886)
    assert got.origin == "cache" and got.note == "GitHub HTTP 502: Server Error"


def test_unreachable_api_falls_back_to_cache(gh, tmp_path):
    client(gh, tmp_path).pull(REPO, 40886)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = GitHubClient(FactCache(tmp_path / "gh2"), api_url=f"http://127.0.0.1:{port}", timeout=2)
    got = c.pull(REPO, 40886)
    assert isinstance(got, Unavailable) and "GitHub unreachable (ConnectError)" in got.reason


def test_api_url_must_be_http():
    with pytest.raises(UpstreamError, match="--api-url 'ftp://x'"):
        GitHubClient(FactCache("/nonexistent"), api_url="ftp://x")


def test_bad_repo_name_is_refused(gh, tmp_path):
    with pytest.raises(UpstreamError, match="expected owner/name"):
        client(gh, tmp_path).pull("not a repo", 1)


def test_torn_cache_file_is_ignored(gh, tmp_path):
    c = client(gh, tmp_path)
    c.pull(REPO, 40886)
    for p in (tmp_path / "gh").glob("*.json"):
        p.write_text("{not json")
    assert isinstance(client(gh, tmp_path, offline=True).pull(REPO, 40886), Unavailable)


def test_enterprise_api_url_with_path_prefix(tmp_path):
    with FakeGitHub(prefix="/api/v3") as ghe:
        ghe.pulls[(REPO, 5)] = pull_json(REPO, 5, "open")
        c = GitHubClient(FactCache(tmp_path / "gh"), api_url=ghe.url + "/api/v3/")
        got = pr_facts(c, REPO, 5, None)
        assert got.state == "open"
        assert ghe.requests[0][0] == f"/api/v3/repos/{REPO}/pulls/5"
