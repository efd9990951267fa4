"""The overlay statuses fits() and plan() need from vLLM releases, shipped with the catalog.

An overlay's status on a release (pending / upstream / not-applicable ...) is what the overlay
engine says on that release's pristine sources: static per (release, overlay manifest). Computing
it downloads the sdist (~35 MB each; a plan over every engine is ~350 MB), so the catalog carries
the answers in `overlays/release-status.json`, generated from the real sdists
(manager/fits/writestatus.py; this module only reads it):

    python -m manager.fits.writestatus          # rewrite the file for every engine profile's release

Each entry records the manifest digest it was computed for; an overlay whose manifest changed since
falls back to the cache or the sources, as without the file. tests/fits/test_release_status.py checks
the file against the real sdists.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..catalog import Catalog

FILE = "release-status.json"


def status_path(catalog: Catalog) -> Path:
    return catalog.overlays_dir / FILE


def load_shipped(catalog: Catalog) -> dict[str, dict[str, dict[str, str]]]:
    """version -> overlay id -> {"digest", "status"}; {} when the catalog has no (readable) file."""
    try:
        data = json.loads(status_path(catalog).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    rel = data.get("releases") if isinstance(data, dict) else None
    return rel if isinstance(rel, dict) else {}


def shipped_statuses(shipped: dict, version: str, digests: dict[str, str]) -> dict[str, str] | None:
    """id -> status on `version` when the file covers every overlay of the index at its digest."""
    entry = shipped.get(version)
    if not isinstance(entry, dict):
        return None
    out = {}
    for oid, digest in digests.items():
        got = entry.get(oid)
        if not isinstance(got, dict) or got.get("digest") != digest or not isinstance(got.get("status"), str):
            return None
        out[oid] = got["status"]
    return out
