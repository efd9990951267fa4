"""What fits and plan need from vLLM releases ships with the catalog (issue 26 point 6):
overlays/release-status.json, generated from the real sdists, so plan on a fresh machine reads no
release and --offline never downloads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from manager.catalog import Catalog
from manager.fits import build_index, plan
from manager.fits.releasestatus import FILE
from manager.fits.writestatus import compute, engine_versions
from manager.profiles import load_profiles
from tests.helpers import REPO_ROOT

CATALOG = Catalog(REPO_ROOT)


@pytest.mark.network
def test_the_shipped_release_statuses_match_the_real_sdists() -> None:
    """Regenerate with `python -m manager.fits.writestatus` when this fails (a manifest changed)."""
    shipped = json.loads((REPO_ROOT / "overlays" / FILE).read_text())
    versions = engine_versions(CATALOG)
    assert sorted(shipped["releases"]) == sorted(versions)
    assert compute(CATALOG, versions)["releases"] == shipped["releases"]


def test_plan_on_a_fresh_machine_reads_no_release(tmp_path: Path) -> None:
    idx = build_index(CATALOG, cache_dir=tmp_path / "fits")
    assert idx.shipped
    pl = plan(load_profiles(CATALOG), model="gemma-4-26b-a4b", hardware="rtx-3090", gpus=2, overlay_index=idx)
    assert pl.options and idx.calls == 0  # every engine's statuses came from the shipped file
    assert not any("versions ranges" in c.message for r in pl.options for c in r.constraints)


def test_a_manifest_changed_since_the_file_falls_back_to_reading_the_release(tmp_path: Path) -> None:
    idx = build_index(CATALOG, use_releases=False)
    some = sorted(idx.overlays)[0]
    idx.overlays[some] = type(idx.overlays[some])(**{**vars(idx.overlays[some]), "digest": "changed"})
    statuses, why = idx.statuses("0.20.0")
    assert why and "versions ranges" in why  # offline: not the stale shipped answer, and no download


def test_cli_offline_with_an_empty_cache_downloads_nothing(tmp_path: Path, cli_run) -> None:
    res = cli_run("--catalog", str(REPO_ROOT), "plan", "--model", "gemma-4-e2b", "--hardware", "rtx-3090", "--gpus", "1",
                  "--offline", "--json", env={"OVERLAY_CACHE": str(tmp_path / "cache")})
    assert res.exit_code == 0 and json.loads(res.stdout)["options"], res.stderr
    assert not (tmp_path / "cache" / "sdists").exists() and "download" not in res.stderr
