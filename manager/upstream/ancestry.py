"""Does the engine's pin contain the PR's merge commit? From a local clone or the compare API."""

from __future__ import annotations

import datetime as dt
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..errors import UpstreamError
from .facts import age_text
from .github import GitHubClient, Unavailable

_SHA_RE = re.compile(r"^[0-9a-f]{7,40}$")


@dataclass(frozen=True)
class Ancestry:
    """`contains`: True / False, or None when neither git nor GitHub could tell."""

    contains: bool | None
    method: str  # "git" | "compare API" | "none"
    evidence: tuple[str, ...]


def short(sha: str | None) -> str:
    return (sha or "?")[:12]


# -- local clone ---------------------------------------------------------------------------
def _git(git_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(git_dir), *args], capture_output=True, text=True)


def check_git_dir(git_dir: Path) -> Path:
    git_dir = Path(git_dir).expanduser()
    proc = _git(git_dir, "rev-parse", "--git-dir")
    if not git_dir.is_dir() or proc.returncode != 0:
        raise UpstreamError(f"--git-dir {git_dir}: not a git repository")
    return git_dir


def resolve(git_dir: Path, ref: str) -> str | None:
    """The commit sha `ref` (tag, branch, sha) names in the clone, or None."""
    for candidate in (f"refs/tags/{ref}", ref):
        proc = _git(git_dir, "rev-parse", "--verify", "--quiet", f"{candidate}^{{commit}}")
        if proc.returncode == 0 and proc.stdout.strip():
            return proc.stdout.strip()
    return None


def git_ancestry(git_dir: Path, merge_commit: str, pin: str, pin_commit_hint: str | None = None,
                 hint_source: str = "") -> Ancestry:
    """`git merge-base --is-ancestor merge_commit pin` in a local clone."""
    ev: list[str] = []
    merge = resolve(git_dir, merge_commit)
    if merge is None:
        return Ancestry(None, "none",
                        (f"git: merge commit {short(merge_commit)} not in the clone {git_dir} (fetch it)",))
    pin_sha = resolve(git_dir, pin)
    if pin_sha is not None and pin_commit_hint and not pin_sha.startswith(pin_commit_hint):
        ev.append(f"git: warning: {pin} is {short(pin_sha)} in the clone but {hint_source} says {pin_commit_hint}")
    if pin_sha is None and pin_commit_hint:
        pin_sha = resolve(git_dir, pin_commit_hint)
        if pin_sha is not None:
            ev.append(f"git: {pin} not in the clone; using {short(pin_sha)} from {hint_source}")
    if pin_sha is None:
        return Ancestry(None, "none", (*ev, f"git: pin {pin} not in the clone {git_dir} (fetch tags)"))
    proc = _git(git_dir, "merge-base", "--is-ancestor", merge, pin_sha)
    if proc.returncode == 0:
        return Ancestry(True, "git", (*ev, f"git merge-base --is-ancestor {short(merge)} {pin}: "
                                           "yes, the pin contains the merge (local clone)"))
    if proc.returncode == 1:
        return Ancestry(False, "git", (*ev, f"git merge-base --is-ancestor {short(merge)} {pin}: "
                                            "no, the pin does not contain the merge (local clone)"))
    msg = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
    return Ancestry(None, "none", (*ev, f"git merge-base failed in {git_dir}: {msg[0]}"))


# -- compare API ---------------------------------------------------------------------------
_CONTAINS = {"ahead": True, "identical": True, "behind": False, "diverged": False}


def compare_ancestry(client: GitHubClient, repo: str, merge_commit: str, pin: str,
                     now: dt.datetime | None) -> Ancestry:
    """GET compare/{merge}...{pin}: ahead/identical = the pin contains the merge; behind/diverged = not."""
    fact = client.compare(repo, merge_commit, pin)
    label = f"compare {short(merge_commit)}...{pin}"
    if isinstance(fact, Unavailable):
        return Ancestry(None, "none", (f"{label}: unavailable ({fact.reason})",))
    when = age_text(fact, now)
    if fact.status == 404:
        msg = (fact.body or {}).get("message", "not found")
        return Ancestry(None, "none", (f"{label}: GitHub does not know one of the refs in {repo} ({msg}; {when})",))
    status = (fact.body or {}).get("status")
    if status not in _CONTAINS:
        return Ancestry(None, "none", (f"{label}: unexpected status {status!r} ({when})",))
    contains = _CONTAINS[status]
    meaning = "the pin contains the merge" if contains else "the pin does not contain the merge"
    return Ancestry(contains, "compare API", (f"{label}: {status}, {meaning} (compare API, {when})",))


def is_sha(ref: str) -> bool:
    return bool(_SHA_RE.match(ref or ""))
