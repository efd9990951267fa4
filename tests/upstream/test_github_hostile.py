"""Issue 28 points 10, 11, 13: the GitHub client against a lying API (a local server on
127.0.0.1): a trickled answer meets a total deadline, a flood meets a size bound, and JSON of
the wrong shape (a list, a number where a string belongs, nesting deeper than the parser's
stack) is an unavailable fact with the reason, so the verdict is `unknown`, never exit 3."""

from __future__ import annotations

import time
import tracemalloc

import pytest

from manager.upstream import FactCache, GitHubClient, Unavailable, pr_facts
from manager.upstream.facts import PRUnavailable
from tests.helpers.hostile_http import HostileServer, body, flood, trickle

REPO = "vllm-project/vllm"
PULL = f"/repos/{REPO}/pulls/7"


def _client(srv, tmp_path, **kw):
    return GitHubClient(FactCache(tmp_path / "gh"), api_url=srv.url, token="", **kw)


def test_a_trickling_api_is_given_up_at_the_total_deadline(tmp_path):
    with HostileServer({PULL: trickle(seconds=20, every=0.2)}) as srv:
        started = time.monotonic()
        got = _client(srv, tmp_path, timeout=1.0, deadline=1.5).pull(REPO, 7)
        assert time.monotonic() - started < 6
    assert isinstance(got, Unavailable) and "deadline" in got.reason


def test_a_flooding_api_is_refused_at_the_size_bound_without_holding_the_body(tmp_path):
    with HostileServer({PULL: flood(total=256 << 20)}) as srv:
        tracemalloc.start()
        try:
            got = _client(srv, tmp_path, max_body=1 << 20).pull(REPO, 7)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert isinstance(got, Unavailable) and "limit" in got.reason
    assert peak < 32 << 20, peak


@pytest.mark.parametrize("payload, why", [
    (b"[1, 2, 3]", "a list, not an object"),
    (b'{"state": 5, "number": 7}', "'state'"),
    (b'{"state": "open", "merged": "yes"}', "'merged'"),
    (b'{"state": "open", "head": {"sha": 12}}', "'head_sha'"),
    (b"[" * 200_000 + b"]" * 200_000, "nested"),
    (b'{"state": "open", "number": ' + b"9" * 5000 + b"}", "integer"),
])
def test_a_pull_answer_of_the_wrong_shape_is_unavailable_with_the_reason(tmp_path, payload, why):
    with HostileServer({PULL: body(payload)}) as srv:
        c = _client(srv, tmp_path)
        got = c.pull(REPO, 7)
        facts = pr_facts(c, REPO, 7, None)
    assert isinstance(got, Unavailable) and why in got.reason, got
    assert isinstance(facts, PRUnavailable)


def test_a_compare_answer_with_a_string_count_is_unavailable(tmp_path):
    path = f"/repos/{REPO}/compare/a1b2c3...d4e5f6"
    with HostileServer({path: body(b'{"status": "ahead", "ahead_by": "3"}')}) as srv:
        got = _client(srv, tmp_path).compare(REPO, "a1b2c3", "d4e5f6")
    assert isinstance(got, Unavailable) and "'ahead_by'" in got.reason


def test_a_rate_limit_header_of_5000_digits_is_no_crash(tmp_path):
    from manager.upstream import github

    now = github.utcnow()
    assert github._retry_after({"retry-after": "9" * 5000}, now) is None
    assert github._retry_after({"x-ratelimit-reset": "9" * 5000}, now) is None
