"""Test doubles with real behaviour for the upstream tests: a local GitHub REST server
(http.server on 127.0.0.1, answering the documented JSON shapes, ETag/304, 404, rate limits)
whose compare answers come from a real git repository, and a builder for such repositories.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# The repository the upstream tests' local GitHub answers compare for, from a build_upstream_repo() history.
UPSTREAM_REPO = "acme/engine"

_GIT_ENV = {
    "GIT_AUTHOR_NAME": "Upstream Dev", "GIT_AUTHOR_EMAIL": "dev@example.invalid",
    "GIT_COMMITTER_NAME": "Upstream Dev", "GIT_COMMITTER_EMAIL": "dev@example.invalid",
    "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_SYSTEM": "/dev/null",
}


def git(repo: Path, *args: str, date: int = 0) -> str:
    env = dict(os.environ, **_GIT_ENV)
    stamp = f"{1_700_000_000 + date * 60} +0000"
    env.update(GIT_AUTHOR_DATE=stamp, GIT_COMMITTER_DATE=stamp)
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout.strip()


@dataclass
class UpstreamRepo:
    """A real repository shaped like the upstream history the verdicts care about.

        c1 (tag v1.0.0, before the merge) -- c2 -- M (merge of PR branch f1) -- c3 (tag v2.0.0)
                                              \\-- s1 (branch side-old: a pin on a side branch, no merge)
        PR branch:  c2 -- f1 (the PR head)
        M -- s2 (branch side-new: a side branch that contains the merge)
    """

    path: Path
    commits: dict[str, str] = field(default_factory=dict)

    @property
    def merge(self) -> str:
        return self.commits["M"]


def build_upstream_repo(root: Path) -> UpstreamRepo:
    path = root / "vllm-upstream"
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    repo = UpstreamRepo(path)
    n = 0

    def commit(name: str, fname: str) -> str:
        nonlocal n
        n += 1
        (path / fname).write_text(f"{name}\n")
        git(path, "add", fname, date=n)
        git(path, "commit", "-q", "-m", name, date=n)
        repo.commits[name] = git(path, "rev-parse", "HEAD")
        return repo.commits[name]

    commit("c1", "a.py")
    git(path, "tag", "v1.0.0")
    commit("c2", "b.py")
    git(path, "checkout", "-q", "-b", "pr-branch")
    commit("f1", "fix.py")
    git(path, "checkout", "-q", "main")
    git(path, "checkout", "-q", "-b", "side-old", repo.commits["c2"])
    commit("s1", "side.py")
    git(path, "checkout", "-q", "main")
    n += 1
    git(path, "merge", "-q", "--no-ff", "-m", "Merge pull request #101", "pr-branch", date=n)
    repo.commits["M"] = git(path, "rev-parse", "HEAD")
    commit("c3", "c.py")
    git(path, "tag", "v2.0.0")
    git(path, "checkout", "-q", "-b", "side-new", repo.commits["M"])
    commit("s2", "side2.py")
    git(path, "checkout", "-q", "main")
    return repo


def pull_json(repo: str, number: int, state: str, *, merge_commit: str | None = None,
              head_sha: str = "f" * 40, merged_at: str = "2026-01-02T03:04:05Z") -> dict[str, Any]:
    """The documented shape of GET /repos/{owner}/{repo}/pulls/{n} (the fields that matter, and a few more)."""
    merged = state == "merged"
    return {
        "url": f"https://api.github.com/repos/{repo}/pulls/{number}",
        "id": 1000 + number,
        "html_url": f"https://github.com/{repo}/pull/{number}",
        "number": number,
        "state": "open" if state == "open" else "closed",
        "locked": False,
        "title": f"PR {number}",
        "user": {"login": "contributor"},
        "created_at": "2026-01-01T00:00:00Z",
        "closed_at": None if state == "open" else "2026-01-02T03:04:05Z",
        "merged_at": merged_at if merged else None,
        # GitHub fills this for unmerged PRs too (a test merge): it must not be read as merged.
        "merge_commit_sha": merge_commit or "e" * 40,
        "head": {"label": "contributor:fix", "ref": "fix", "sha": head_sha},
        "base": {"label": "upstream:main", "ref": "main", "sha": "b" * 40},
        "merged": merged,
        "mergeable": None,
        "commits": 1,
        "additions": 10,
        "deletions": 2,
        "changed_files": 1,
    }


class FakeGitHub:
    """GET /repos/{o}/{r}/pulls/{n} and /repos/{o}/{r}/compare/{base}...{head} on 127.0.0.1."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix  # e.g. "/api/v3" as on GitHub Enterprise Server
        self.pulls: dict[tuple[str, int], dict[str, Any]] = {}
        self.repos: dict[str, Path] = {}  # repo -> git dir answering compare
        self.rate_limited: str | None = None  # None, "403" (primary limit) or "429" (Retry-After)
        self.fail_status: int | None = None
        self.requests: list[tuple[str, dict[str, str]]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                fake.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                status, headers, body = fake.answer(self.path, self.headers)
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeGitHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- answers ---------------------------------------------------------------------
    def _limits(self) -> dict[str, str]:
        return {"X-RateLimit-Limit": "60", "X-RateLimit-Remaining": "59",
                "X-RateLimit-Reset": str(int(time.time()) + 3600), "X-GitHub-Api-Version-Selected": "2022-11-28"}

    def answer(self, path: str, headers: Any) -> tuple[int, dict[str, str], Any]:
        if self.rate_limited == "403":
            h = dict(self._limits(), **{"X-RateLimit-Remaining": "0"})
            return 403, h, {"message": "API rate limit exceeded for 127.0.0.1.",
                            "documentation_url": "https://docs.github.com/rest/overview/resources-in-the-rest-api#rate-limiting"}
        if self.rate_limited == "429":
            return 429, {"Retry-After": "120"}, {"message": "You have exceeded a secondary rate limit."}
        if self.fail_status:
            return self.fail_status, {}, {"message": "Server Error"}
        path = path.split("?", 1)[0]
        if self.prefix:
            if not path.startswith(self.prefix + "/"):
                return 404, {}, {"message": "Not Found"}
            path = path[len(self.prefix):]
        m = re.fullmatch(r"/repos/([^/]+/[^/]+)/pulls/(\d+)", path)
        body: Any = None
        if m:
            body = self.pulls.get((m.group(1), int(m.group(2))))
        m2 = re.fullmatch(r"/repos/([^/]+/[^/]+)/compare/([^/]+)\.\.\.([^/]+)", path)
        if m2 and m2.group(1) in self.repos:
            body = self._compare(self.repos[m2.group(1)], m2.group(2), m2.group(3))
        if body is None:
            return 404, self._limits(), {"message": "Not Found",
                                         "documentation_url": "https://docs.github.com/rest", "status": "404"}
        etag = 'W/"' + hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:32] + '"'
        if headers.get("If-None-Match") == etag:
            return 304, dict(self._limits(), ETag=etag), None
        return 200, dict(self._limits(), ETag=etag), body

    def _compare(self, gitdir: Path, base: str, head: str) -> dict[str, Any] | None:
        def rev(ref: str) -> str | None:
            try:
                return git(gitdir, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
            except RuntimeError:
                return None

        b, h = rev(base), rev(head)
        if not b or not h:
            return None
        mb = git(gitdir, "merge-base", b, h)
        ahead = int(git(gitdir, "rev-list", "--count", f"{b}..{h}"))
        behind = int(git(gitdir, "rev-list", "--count", f"{h}..{b}"))
        status = "identical" if b == h else "ahead" if mb == b else "behind" if mb == h else "diverged"
        return {
            "url": f"https://api.github.com/repos/x/compare/{base}...{head}",
            "status": status, "ahead_by": ahead, "behind_by": behind, "total_commits": ahead,
            "base_commit": {"sha": b}, "merge_base_commit": {"sha": mb},
            "commits": [], "files": [],
        }
