"""Write `overlays/release-status.json` (manager.fits.releasestatus) from the real vLLM sdists:

    python -m manager.fits.writestatus

Each engine profile's release is read through the overlay engine's status on its pristine sources
(downloaded once, cached); tests/fits/test_release_status.py checks the shipped file the same way.
"""

from __future__ import annotations

import json
import sys

from ..catalog import Catalog
from .releasestatus import status_path


def compute(catalog: Catalog, versions: list[str]) -> dict:
    """The file's content, from each release's pristine sources (downloads what is not cached)."""
    from .overlays import build_index

    idx = build_index(catalog, use_releases=True, cache_dir=None)
    valid = {oid: info for oid, info in idx.overlays.items() if info.invalid is None}
    releases = {}
    for v in versions:
        got = idx.status_fn(v) if idx.status_fn is not None else {}
        releases[v] = {oid: {"digest": valid[oid].digest, "status": got[oid]} for oid in sorted(got) if oid in valid}
    return {"generated_by": "python -m manager.fits.writestatus", "releases": releases}


def engine_versions(catalog: Catalog) -> list[str]:
    from ..profiles import load_profiles
    from packaging.version import Version

    profiles = load_profiles(catalog)
    return sorted({e.vllm_version for e in profiles.engines.values()}, key=Version)


def main() -> None:
    catalog = Catalog.locate()
    data = compute(catalog, engine_versions(catalog))
    status_path(catalog).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    sys.stderr.write(f"wrote {status_path(catalog)}: {len(data['releases'])} releases\n")


if __name__ == "__main__":
    main()
