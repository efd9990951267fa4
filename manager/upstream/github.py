"""A small GitHub REST client: ETag revalidation against an on-disk cache, rate-limit aware.

Only two endpoints are used:
    GET /repos/{owner}/{repo}/pulls/{number}
    GET /repos/{owner}/{repo}/compare/{base}...{head}

Every answer is a `Fetched` (a fact and how old it is, and where it came from) or an
`Unavailable` (why there is no fact). Network trouble never raises: the caller turns an
unavailable fact into an `unknown` verdict with the reason as evidence. When GitHub says
"rate limited" (403/429 with X-RateLimit-Remaining: 0 or Retry-After) the client stops
asking for the rest of the run, and records the back-off in the cache so the next run
does not hammer either.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import json
import os
import re
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any
from collections.abc import Callable

from ..boundedhttp import Answer
from ..errors import UpstreamError
from .cache import CacheEntry, FactCache, utcnow

if TYPE_CHECKING:  # httpx is the [upstream] extra: imported only when GitHub is asked
    import httpx

DEFAULT_API_URL = "https://api.github.com"
TOKEN_ENV = "GITHUB_TOKEN"
_REPO_RE = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
_REF_RE = re.compile(r"^[A-Za-z0-9_./:-]+$")

# Fields kept from each answer (the full compare answer lists commits and files: large).
_PULL_KEYS = ("number", "state", "merged", "merged_at", "closed_at", "merge_commit_sha", "title", "html_url")
_COMPARE_KEYS = ("status", "ahead_by", "behind_by", "total_commits")


@dataclass(frozen=True)
class Fetched:
    """A fact from GitHub: `status` 200 (body) or 404 (not found), with its age and origin."""

    url: str
    status: int
    body: Any
    fetched_at: dt.datetime
    checked_at: dt.datetime
    origin: str  # "GitHub" (fresh 200), "GitHub, 304" (revalidated), "cache" (not contacted)
    note: str | None = None  # why the cache answered: offline, rate limit, error

    @property
    def from_cache_only(self) -> bool:
        return self.origin == "cache"


@dataclass(frozen=True)
class Unavailable:
    url: str
    reason: str


def _slim(body: Any, keys: tuple[str, ...], extra: Callable[[dict[str, Any]], dict[str, Any]],
          types: dict[str, tuple[type, ...]] | None = None) -> Any:
    """The kept fields of a documented JSON object; ValueError for an answer of another shape."""
    if not isinstance(body, dict):
        raise ValueError(f"an unexpected answer: a {type(body).__name__}, not an object")
    slim = {k: body.get(k) for k in keys if k in body}
    slim.update(extra(body))
    return _shaped(slim, types) if types else slim


def _pull_extra(body: dict[str, Any]) -> dict[str, Any]:
    head = body.get("head") or {}
    return {"head_sha": head.get("sha")} if isinstance(head, dict) else {}


def _compare_extra(body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("merge_base_commit", "base_commit"):
        v = body.get(key)
        if isinstance(v, dict):
            out[f"{key}_sha"] = v.get("sha")
    return out


def _httpx() -> ModuleType:
    try:
        import httpx
    except ImportError:
        from ..extras import install_hint

        raise UpstreamError(f"asking GitHub needs httpx (or pass --offline); {install_hint('upstream')}") from None
    return httpx


def _retry_after(headers: httpx.Headers, now: dt.datetime) -> dt.datetime | None:
    raw = headers.get("retry-after")
    if raw:
        raw = raw.strip()
        if raw.isdigit() and len(raw) <= 9:  # a 5000-digit value is no delay (int() refuses it)
            return now + dt.timedelta(seconds=int(raw))
        try:
            parsed = email.utils.parsedate_to_datetime(raw)
            return parsed.astimezone(dt.timezone.utc)
        except (TypeError, ValueError):
            pass
    reset = headers.get("x-ratelimit-reset")
    if reset and reset.strip().isdigit() and len(reset.strip()) <= 11:
        try:
            return dt.datetime.fromtimestamp(int(reset), dt.timezone.utc)
        except (OverflowError, OSError, ValueError):
            return None
    return None


def _is_rate_limited(resp: Answer) -> bool:
    if resp.status not in (403, 429):
        return False
    if resp.status == 429 or resp.headers.get("retry-after"):
        return True
    return resp.headers.get("x-ratelimit-remaining", "").strip() == "0"


class GitHubClient:
    """GET with If-None-Match against a FactCache; never raises for network trouble."""

    def __init__(
        self,
        cache: FactCache,
        *,
        api_url: str | None = None,
        token: str | None = None,
        offline: bool = False,
        now: Callable[[], dt.datetime] = utcnow,
        timeout: float = 15.0,
        transport: httpx.BaseTransport | None = None,
        deadline: float = 60.0,
        max_body: int = 8 << 20,
    ) -> None:
        self.cache = cache
        self.api_url = (api_url or DEFAULT_API_URL).rstrip("/")
        if not self.api_url.startswith(("http://", "https://")):
            raise UpstreamError(f"--api-url {api_url!r}: expected an http(s) URL")
        self.token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        self.offline = offline
        self.now = now
        self.timeout = timeout
        self.deadline = deadline  # seconds for one request in all (httpx's timeout is per chunk)
        self.max_body = max_body  # the slimmed answers are a few hundred bytes; a compare lists files
        self._transport = transport
        self._http: httpx.Client | None = None
        self._blocked: str | None = None  # set once GitHub rate-limits us (or is unreachable)
        self.unreachable: str | None = None  # "<api url> unreachable (why)" after a failed connection
        self.requests_made = 0

    # -- plumbing ----------------------------------------------------------------------
    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    def __enter__(self) -> GitHubClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _client(self) -> httpx.Client:
        if self._http is None:
            headers = {
                "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": "2022-11-28",
                "User-Agent": "overlay-manager-upstream",
            }
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
            self._http = _httpx().Client(
                headers=headers, timeout=_httpx().Timeout(self.timeout, connect=min(self.timeout, 5.0)),
                transport=self._transport, follow_redirects=True
            )
        return self._http

    def _from_cache(self, url: str, note: str) -> Fetched | Unavailable:
        entry = self.cache.get(url)
        if entry is None:
            return Unavailable(url, f"{note}; nothing cached")
        return Fetched(url, entry.status, entry.body, entry.fetched_at, entry.checked_at, "cache", note)

    def get(self, path: str, slim: Callable[[Any], Any] = lambda b: b) -> Fetched | Unavailable:
        """GET `path` (relative to the API URL), revalidating the cached answer."""
        url = f"{self.api_url}{path}"
        if self.offline:
            return self._from_cache(url, "offline")
        if self._blocked is None:
            blocked = self.cache.blocked_until(self.now())
            if blocked is not None:
                until, reason = blocked
                self._blocked = f"{reason}; not asking again before {until:%Y-%m-%d %H:%M} UTC"
        if self._blocked is not None:
            return self._from_cache(url, self._blocked)

        cached = self.cache.get(url)
        headers = {}
        if cached is not None and cached.etag:
            headers["If-None-Match"] = cached.etag
        elif cached is not None and cached.last_modified:
            headers["If-Modified-Since"] = cached.last_modified
        from ..boundedhttp import RemoteRefused, get as bounded_get

        try:
            self.requests_made += 1
            resp = bounded_get(self._client(), url, headers=headers, deadline=self.deadline, limit=self.max_body)
        except RemoteRefused as exc:
            if "deadline" in str(exc):  # the client stays with the stuck request: a fresh one next time
                self._http = None
                self._blocked = f"GitHub too slow ({exc})"
            return self._from_cache(url, f"GitHub answer refused at {url}: {exc}")
        except _httpx().HTTPError as exc:
            self._blocked = f"GitHub unreachable ({type(exc).__name__})"
            self.unreachable = f"GitHub API {self.api_url} unreachable ({type(exc).__name__}: {str(exc)[:120]})"
            return self._from_cache(url, self._blocked)
        now = self.now()

        if resp.status == 304 and cached is not None:
            entry = CacheEntry(
                url, cached.status, resp.headers.get("etag") or cached.etag, cached.last_modified,
                cached.fetched_at, now, cached.body,
            )
            self.cache.put(entry)
            return Fetched(url, entry.status, entry.body, entry.fetched_at, now, "GitHub, 304")
        if resp.status == 200:
            try:
                body = slim(_json(resp.body))
            except ValueError as exc:  # not JSON, nested too deeply, or not the documented shape
                return self._from_cache(url, f"GitHub answered 200 with {exc} at {url}")
            entry = CacheEntry(
                url, 200, resp.headers.get("etag"), resp.headers.get("last-modified"), now, now, body
            )
            self.cache.put(entry)
            return Fetched(url, 200, body, now, now, "GitHub")
        if resp.status in (404, 422):
            # A fact too: the PR / commit does not exist there. Cached so --offline can say so.
            message = _message(resp)
            entry = CacheEntry(url, 404, None, None, now, now, {"message": message, "http_status": resp.status})
            self.cache.put(entry)
            return Fetched(url, 404, entry.body, now, now, "GitHub")
        if _is_rate_limited(resp):
            until = _retry_after(resp.headers, now) or now + dt.timedelta(minutes=1)
            reason = f"GitHub rate limit (HTTP {resp.status}, resets {until:%Y-%m-%d %H:%M} UTC)"
            self._blocked = reason
            self.cache.block(until, f"GitHub rate limit (HTTP {resp.status})")
            return self._from_cache(url, reason)
        reason = f"GitHub HTTP {resp.status}: {_message(resp)}"
        if resp.status == 401:
            self._blocked = reason  # a bad token fails every request the same way
        return self._from_cache(url, reason)

    # -- endpoints -------------------------------------------------------------------
    def pull(self, repo: str, number: int) -> Fetched | Unavailable:
        _check_repo(repo)
        return self.get(
            f"/repos/{repo}/pulls/{int(number)}",
            slim=lambda b: _slim(b, _PULL_KEYS, _pull_extra, _PULL_TYPES),
        )

    def compare(self, repo: str, base: str, head: str) -> Fetched | Unavailable:
        _check_repo(repo)
        for ref in (base, head):
            if not _REF_RE.match(ref) or ".." in ref:
                raise UpstreamError(f"compare {base}...{head}: {ref!r} is not a plain ref or sha")
        return self.get(
            f"/repos/{repo}/compare/{base}...{head}?per_page=1",
            slim=lambda b: _slim(b, _COMPARE_KEYS, _compare_extra, _COMPARE_TYPES),
        )


def _check_repo(repo: str) -> None:
    if not _REPO_RE.match(repo or ""):
        raise UpstreamError(f"upstream repo {repo!r}: expected owner/name")


def _message(resp: Answer) -> str:
    try:
        body = _json(resp.body)
        if isinstance(body, dict) and body.get("message"):
            return str(body["message"]).splitlines()[0][:200]
    except ValueError:
        pass
    return resp.reason or f"HTTP {resp.status}"


def _json(raw: bytes) -> Any:
    """The answer's JSON; ValueError (with what is wrong) for anything else, including nesting
    deeper than the parser's stack and integers longer than CPython converts."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except ValueError as exc:
        raise ValueError(f"no valid JSON ({str(exc)[:100]})") from None


# The documented types of the fields kept (None: absent or null is allowed for every one).
_PULL_TYPES: dict[str, tuple[type, ...]] = {
    "number": (int,), "state": (str,), "merged": (bool,), "merged_at": (str,), "closed_at": (str,),
    "merge_commit_sha": (str,), "title": (str,), "html_url": (str,), "head_sha": (str,),
}
_COMPARE_TYPES: dict[str, tuple[type, ...]] = {
    "status": (str,), "ahead_by": (int,), "behind_by": (int,), "total_commits": (int,),
    "merge_base_commit_sha": (str,), "base_commit_sha": (str,),
}


def _shaped(slim: dict[str, Any], types: dict[str, tuple[type, ...]]) -> dict[str, Any]:
    """`slim` when every kept field has its documented type; ValueError naming the first that has not."""
    for key, want in types.items():
        v = slim.get(key)
        if v is not None and (not isinstance(v, want) or (isinstance(v, bool) and bool not in want)):
            raise ValueError(f"an unexpected answer: {key!r} is {type(v).__name__} {str(v)[:40]!r}, "
                             f"not {' or '.join(t.__name__ for t in want)}")
    return slim
