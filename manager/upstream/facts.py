"""Upstream facts about an overlay's PR, and how their age is written in evidence."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from .github import Fetched, GitHubClient, Unavailable


def age_text(fact: Fetched, now: dt.datetime | None) -> str:
    """`GitHub, checked 2026-11-29 21:00 UTC` (+ `, 3 min ago` when `now` is given).

    Reports pass now=None so that regenerating them from the cache is byte-stable.
    """
    where = fact.origin if fact.origin != "cache" else f"cache ({fact.note})" if fact.note else "cache"
    text = f"{where}, checked {fact.checked_at:%Y-%m-%d %H:%M} UTC"
    if now is not None:
        text += f", {ago(now - fact.checked_at)}"
    return text


def ago(delta: dt.timedelta) -> str:
    s = max(0, int(delta.total_seconds()))
    if s < 90:
        return f"{s} s ago"
    if s < 90 * 60:
        return f"{round(s / 60)} min ago"
    if s < 36 * 3600:
        return f"{round(s / 3600)} h ago"
    return f"{round(s / 86400)} days ago"


@dataclass(frozen=True)
class PRFacts:
    """What GitHub says about a PR. state: open / closed (unmerged) / merged / not-found."""

    repo: str
    number: int
    state: str
    merge_commit: str | None
    merged_at: str | None
    head_sha: str | None
    checked_at: dt.datetime | None
    evidence: str

    @property
    def ref(self) -> str:
        return f"{self.repo}#{self.number}"


@dataclass(frozen=True)
class PRUnavailable:
    repo: str
    number: int
    reason: str

    @property
    def evidence(self) -> str:
        return f"PR #{self.number} ({self.repo}): no facts ({self.reason})"


def pr_facts(client: GitHubClient, repo: str, number: int, now: dt.datetime | None) -> PRFacts | PRUnavailable:
    fact = client.pull(repo, number)
    if isinstance(fact, Unavailable):
        return PRUnavailable(repo, number, fact.reason)
    when = age_text(fact, now)
    if fact.status == 404:
        msg = (fact.body or {}).get("message", "Not Found")
        return PRFacts(repo, number, "not-found", None, None, None, fact.checked_at,
                       f"PR #{number} not found in {repo} (GitHub 404 {msg!r}; {when}) "
                       "- check upstream.pr in the manifest")
    body = fact.body or {}
    merged = bool(body.get("merged")) or bool(body.get("merged_at"))
    head = body.get("head_sha")
    if merged:
        merge = body.get("merge_commit_sha")
        return PRFacts(repo, number, "merged", merge, body.get("merged_at"), head, fact.checked_at,
                       f"PR #{number} merged {body.get('merged_at') or '?'} as {str(merge)[:12]} ({when})")
    state = body.get("state")
    if state == "open":
        return PRFacts(repo, number, "open", None, None, head, fact.checked_at, f"PR #{number} open ({when})")
    if state == "closed":
        return PRFacts(repo, number, "closed", None, None, head, fact.checked_at,
                       f"PR #{number} closed unmerged {body.get('closed_at') or ''} ({when})".replace("  ", " "))
    return PRUnavailable(repo, number, f"GitHub answered an unknown PR state {state!r} ({when})")
