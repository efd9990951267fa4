"""The compose CLI: thin callbacks over the library (list, render one/all)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from manager.catalog import Catalog

SLUG = "gemma4-26b-a4b-awq-3090-tp2"


def test_list_json_holds_every_registry_entry(cli_run) -> None:
    res = cli_run("compose", "list", "--json")
    assert res.exit_code == 0
    rows = {r["slug"]: r for r in json.loads(res.stdout)["deployments"]}
    assert rows[SLUG]["port"] == 8042 and rows[SLUG]["tp"] == 2


def test_render_one_to_stdout_equals_the_committed_file(repo_root: Path, cli_run) -> None:
    res = cli_run("compose", "render", SLUG)
    assert res.exit_code == 0
    assert res.stdout == (repo_root / "compose" / "generated" / f"{SLUG}.yml").read_text()


def test_render_no_gpu_to_a_file_leaves_out_the_reservation(tmp_path: Path, cli_run) -> None:
    out = tmp_path / "x.yml"
    res = cli_run("compose", "render", SLUG, "--no-gpu", "-o", str(out))
    assert res.exit_code == 0
    assert "deploy" not in yaml.safe_load(out.read_text())["services"][SLUG]


def test_render_needs_exactly_one_of_slug_or_all(cli_run) -> None:
    for args in (("compose", "render"), ("compose", "render", SLUG, "--all")):
        res = cli_run(*args)
        assert res.exit_code == 1 and res.err_lines == ["error: give exactly one of SLUG or --all"]


def test_render_all_reports_identical_then_updated(tmp_path: Path, cli_run) -> None:
    cat = Catalog.locate()
    for part in ("profiles", "overlays", "compose"):
        shutil.copytree(cat.root / part, tmp_path / part)
    target = tmp_path / "compose" / "generated" / f"{SLUG}.yml"
    target.write_text("stale\n")
    res = cli_run("--catalog", str(tmp_path), "compose", "render", "--all")
    assert res.exit_code == 0
    assert target.read_text() == (cat.root / "compose" / "generated" / f"{SLUG}.yml").read_text()
    assert "updated" in res.stderr and "identical" in res.stderr
