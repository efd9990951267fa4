"""Data on stdout, talk on stderr; one --json shape; readable at 80 columns with ids never cut
(issue 12, points 3 and 4)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT
from tests.helpers.cli import overlay_process

OVERLAY_IDS = sorted(p.name for p in (REPO_ROOT / "overlays").iterdir() if (p / "overlay.yaml").is_file())


def _sub(*args: str, columns: int = 80) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(REPO_ROOT), "OVERLAY_CATALOG": str(REPO_ROOT), "COLUMNS": str(columns)}
    return overlay_process(*args, env=env, timeout=300)


@pytest.mark.parametrize("columns", [80, 50])
def test_list_is_data_on_stdout_one_line_per_overlay_ids_whole(columns: int) -> None:
    res = _sub("list", columns=columns)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    if columns == 80:  # the title gives way at 80; narrower, the row still is one line (ids are never cut)
        assert all(len(ln) <= columns for ln in lines), lines
    for oid in OVERLAY_IDS:  # `overlay list | grep ID` finds the whole row
        rows = [ln for ln in lines if ln.split() and ln.split()[0] == oid]
        assert len(rows) == 1, (oid, lines)
    assert len(lines) == 1 + len(OVERLAY_IDS)  # header + one row each
    assert "catalog" in res.stderr and "catalog" not in res.stdout


def test_list_wide_shows_targets() -> None:
    res = _sub("list", "--wide", columns=160)
    assert res.returncode == 0 and "vllm/platforms/cuda.py" in res.stdout


def test_status_piped_is_one_line_per_target_naming_its_overlay_paths_whole(tmp_path: Path) -> None:
    """issue 26 point 5: `overlay status | grep gemma4.py` finds every target row, whole, with its overlay."""
    from manager.catalog import Catalog
    from manager.overlays import load_overlays

    (tmp_path / "vllm").mkdir()
    res = _sub("status", "--root", str(tmp_path))
    lines = res.stdout.splitlines()[2:]  # title, header
    targets = [(o.id, t) for o in load_overlays(Catalog(REPO_ROOT)) for t in o.manifest.targets]
    assert len(lines) == len(targets), lines
    for (oid, target), ln in zip(targets, lines):
        assert ln.split()[0] == oid and target in ln.split(), (oid, target, ln)
    assert len([ln for ln in lines if "gemma4.py" in ln]) == sum("gemma4.py" in t for _, t in targets) > 0


@pytest.mark.parametrize(
    "argv, key",
    [
        (["list", "--json"], "overlays"),
        (["compose", "list", "--json"], "deployments"),
        (["compose", "check", "--json"], "findings"),
        (["profiles", "list", "--json"], "models"),
        (["plan", "--model", "gemma-4-26b-a4b", "--hardware", "v100-sxm2-16gb", "--gpus", "2", "--json"], "options"),
        (["upstream", "check", "--offline", "--no-probe", "--json"], "results"),
    ],
)
def test_every_query_json_is_an_object_with_a_key_per_collection(argv: list[str], key: str, cli_run, tmp_path: Path) -> None:
    if argv[0] == "upstream":
        argv = [*argv, "--cache", str(tmp_path / "gh")]
    rc, out, _ = cli_run("--catalog", str(REPO_ROOT), *argv)
    assert rc in (0, 1)
    data = json.loads(out)
    assert isinstance(data, dict) and isinstance(data[key], list) and data[key]


def test_plan_says_how_many_more_it_did_not_show(cli_run) -> None:
    # 2x RTX 3090: several options (on 2x V100 only one fits: float16 KV on the 0.19.1 engine)
    plan = ["--catalog", str(REPO_ROOT), "plan", "--model", "gemma-4-26b-a4b", "--hardware", "rtx-3090", "--gpus", "2"]
    rc, out, _ = cli_run(*plan, "--limit", "1")
    full = json.loads(cli_run(*plan, "--json").stdout)
    n_opt, n_rej = len(full["options"]), len(full["rejected"])
    assert n_opt > 1 and n_rej > 1
    text = " ".join(out.split())
    assert f"{n_opt} deployments fit (best 1 shown, +{n_opt - 1} more)" in text
    assert f"rejected ({n_rej})" in text and " more rejected, for " in text
    shown = text.count(" x TP")
    assert shown == 1


def test_compose_check_findings_are_data_on_stdout_and_the_count_is_talk_on_stderr(tmp_path):
    """`overlay compose check | grep FAIL` works: FAIL/WARN lines are the answer (stdout); the tally is talk."""
    cat = tmp_path / "cat"
    for d in ("overlays", "profiles", "compose"):
        shutil.copytree(REPO_ROOT / d, cat / d)
    # a generated file that is no longer current is one FAIL finding
    gen = sorted((cat / "compose" / "generated").glob("*.yml"))[0]
    gen.write_text(gen.read_text() + "# hand edit\n")
    proc = overlay_process("--catalog", str(cat), "compose", "check", timeout=None)
    assert proc.returncode == 1, proc.stderr
    assert any(line.startswith("FAIL ") and "generated-current" in line for line in proc.stdout.splitlines()), proc.stdout
    assert "FAIL" not in proc.stderr.replace("failed", "")
    assert "checks passed" in proc.stderr and "checks passed" not in proc.stdout


def _records(argv: list[str], key: str, tmp_path: Path, keep=lambda r: True) -> int:
    res = _sub(*argv, "--json")
    return sum(1 for r in json.loads(res.stdout)[key] if keep(r))


@pytest.mark.parametrize("argv, key, header, keep", [
    (["list"], "overlays", 1, None),
    (["list", "--wide"], "overlays", 1, None),
    (["compose", "list"], "deployments", 1, None),
    (["compose", "check"], "findings", 0, lambda f: not f["ok"] or f.get("warn")),
    (["upstream", "check", "--offline", "--no-probe"], "results", 0, None),
])
def test_every_listing_piped_is_one_record_per_line(argv, key, header, keep, tmp_path: Path) -> None:
    """issue 26 point 5: piped (not a terminal), a record never spans lines and no word is split."""
    if argv[0] == "upstream":
        argv = [*argv, "--cache", str(tmp_path / "gh")]
    res = _sub(*argv, columns=80)
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    assert len(lines) == header + _records(argv, key, tmp_path, keep or (lambda r: True)), lines


def test_profiles_list_piped_is_one_profile_per_line() -> None:
    res = _sub("profiles", "list")
    kinds = json.loads(_sub("profiles", "list", "--json").stdout)
    assert res.stdout.splitlines() == [f"{k}/{p}" for k in ("models", "engines", "drafters", "hardware") for p in kinds[k]]


def test_plan_piped_is_one_option_per_line() -> None:
    res = _sub("plan", "--model", "gemma-4-26b-a4b", "--hardware", "rtx-3090", "--gpus", "2", "--limit", "50")
    n = len(json.loads(_sub("plan", "--model", "gemma-4-26b-a4b", "--hardware", "rtx-3090", "--gpus", "2", "--json").stdout)["options"])
    import re

    options = [ln for ln in res.stdout.splitlines() if re.match(r"^\s*\d+\. (fits|tight)\s+TP\d+ ", ln)]
    assert len(options) == min(n, 50) and all(" drafter=" in ln and "overlays=" in ln for ln in options)
