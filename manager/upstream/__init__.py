"""Upstream tracking (drop triggers): PR facts, pin ancestry and source probes -> verdicts.

Public API:
    GitHubClient, FactCache                     REST client with an on-disk ETag cache
    default_cache_dir()                         manager.releases.cache_dir()/github
    decide(...) -> Verdict                      pure verdict logic on plain inputs
    evaluate(overlays, engines, client, ...)    verdicts for plain OverlayInfo x EngineInfo
    check(catalog, ...) -> CheckReport          the same, inputs loaded from a catalog
    render_markdown(report) -> str              the docs/UPSTREAM.md table
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from collections.abc import Sequence

from .. import releases
from ..catalog import Catalog
from .ancestry import Ancestry, compare_ancestry, git_ancestry
from .cache import FactCache, utcnow
from .check import (
    CheckReport, EngineInfo, EngineProbe, OverlayInfo, PairResult, catalog_inputs, evaluate, parse_fail_on,
    sdist_commit,
)
from .facts import PRFacts, PRUnavailable, pr_facts
from .github import DEFAULT_API_URL, Fetched, GitHubClient, Unavailable
from .report import render_markdown
from .verdict import VERDICTS, ProbeFacts, Verdict, decide

__all__ = [
    "DEFAULT_API_URL",
    "VERDICTS",
    "Ancestry",
    "CheckReport",
    "EngineInfo",
    "EngineProbe",
    "FactCache",
    "Fetched",
    "GitHubClient",
    "OverlayInfo",
    "PRFacts",
    "PRUnavailable",
    "PairResult",
    "ProbeFacts",
    "Unavailable",
    "Verdict",
    "catalog_inputs",
    "check",
    "compare_ancestry",
    "decide",
    "default_cache_dir",
    "evaluate",
    "git_ancestry",
    "parse_fail_on",
    "pr_facts",
    "render_markdown",
    "sdist_commit",
]


def default_cache_dir() -> Path:
    return releases.cache_dir() / "github"


def check(
    catalog: Catalog,
    ids: Sequence[str] | None = None,
    engine_ids: Sequence[str] | None = None,
    *,
    offline: bool = False,
    api_url: str | None = None,
    token: str | None = None,
    git_dir: Path | None = None,
    cache_dir: Path | None = None,
    probe: bool = True,
    probe_roots: dict[str, Path] | None = None,
    probe_reports: dict[str, Path] | None = None,
    relative_ages: bool = True,
    now: dt.datetime | None = None,
    fail_fast: bool = False,
) -> CheckReport:
    """Verdicts for the catalog's overlays x engines (all of them unless ids / engine_ids narrow it)."""
    from .probe import CatalogProber

    overlays, engines = catalog_inputs(catalog, ids, engine_ids)
    cache = FactCache(Path(cache_dir) if cache_dir else default_cache_dir())
    prober = CatalogProber(catalog, offline=offline, roots=probe_roots, reports=probe_reports) if probe else None
    with GitHubClient(cache, api_url=api_url, token=token, offline=offline) as client:
        return evaluate(
            overlays, engines, client, prober=prober, git_dir=git_dir,
            now=(now or utcnow()) if relative_ages else None, stop_if_unreachable=fail_fast and not offline,
        )
