"""The smaller defects a newcomer met (issue 26 point 7), each as it was reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

ENV = {"PYTHONPATH": str(REPO_ROOT), "OVERLAY_CATALOG": str(REPO_ROOT), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def _proc(*args: str, stdin: str = "", cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "manager", *args], input=stdin, capture_output=True, text=True,
                          timeout=300, env={**ENV, "HOME": os.environ.get("HOME", "/root")}, cwd=cwd)


def test_overlay_alone_prints_its_help_and_exits_0(cli_run) -> None:
    res = cli_run()
    assert res.exit_code == 0 and res.stdout.startswith("Usage: overlay") and "error" not in res.stderr


def test_import_config_with_a_relative_path_names_the_profile_for_its_directory(tmp_path: Path, monkeypatch, cli_run) -> None:
    d = tmp_path / "my-gemma"
    d.mkdir()
    (d / "config.json").write_text((REPO_ROOT / "tests" / "fixtures" / "hf-configs" / "gemma-4-e2b.json").read_text())
    monkeypatch.chdir(d)
    res = cli_run("profiles", "import-config", "config.json")
    assert res.exit_code == 0, res.stderr
    assert "id: my-gemma" in res.stdout.splitlines()


def test_trace_refuses_an_unknown_expect_id_in_one_line(tmp_path: Path, cli_run) -> None:
    log = tmp_path / "log"
    log.write_text("")
    res = cli_run("--catalog", str(REPO_ROOT), "trace", str(log), "--expect", "nope")
    assert res.exit_code == 1 and len(res.stderr.strip().splitlines()) == 1 and "'nope' is not in the catalog" in res.stderr


def test_trace_dash_reads_standard_input() -> None:
    line = "overlay-trace: sm70-d512-attention v1 attn pid=7 module=vllm.x\n"
    res = _proc("trace", "-", "--json", stdin="noise\n" + line)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["overlays"] == ["sm70-d512-attention"]


def test_an_unknown_engine_version_suggests_its_neighbours(cli_run) -> None:
    res = cli_run("--catalog", str(REPO_ROOT), "fits", "--model", "gemma-4-e2b", "--hardware", "h200", "--engine", "vllm-0.21.0")
    assert res.exit_code == 1 and "did you mean 'vllm-0.20.0' or 'vllm-0.22.0'?" in res.stderr


@pytest.mark.parametrize("short, full", [("bf16", "bfloat16"), ("BF16", "bfloat16"), ("fp8", "fp8")])
def test_kv_dtype_takes_the_short_names(short: str, full: str, cli_run) -> None:
    res = cli_run("--catalog", str(REPO_ROOT), "fits", "--model", "gemma-4-e2b", "--hardware", "h200",
                  "--engine", "vllm-0.33.0", "--kv-dtype", short, "--json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["deployment"]["kv_dtype"] == full


def test_catalog_is_taken_after_the_subcommand_too(tmp_path: Path, cli_run) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for argv in (["list", "--catalog", str(empty)], ["compose", "list", "--catalog", str(empty)]):
        res = cli_run(*argv)
        assert res.exit_code == 1 and f"catalog {empty}" in res.stderr, (argv, res.stderr)
    ok = cli_run("list", "--catalog", str(REPO_ROOT), "--json")
    assert ok.exit_code == 0 and json.loads(ok.stdout)["overlays"]


def test_every_fits_and_plan_option_has_help_text() -> None:
    from manager.cli.profiles import fits_cmd, plan_cmd

    for cmd in (fits_cmd, plan_cmd):
        bare = [p.name for p in cmd.params if isinstance(p, __import__("click").Option) and not p.help]
        assert not bare, (cmd.name, bare)


def test_cache_hits_are_one_line_per_run(capsys) -> None:
    from manager.cli.progress import DownloadProgress
    from manager.releases import Step

    rep = DownloadProgress(tty=False)
    for v in ("0.19.1", "0.20.0", "0.22.0") * 9:
        rep(Step("cached", f"vllm {v} sources", detail=f"/c/trees/{v}"))
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_demo_says_which_releases_it_fetches_and_removes_its_temp_tree(tmp_path: Path, monkeypatch, cli_run) -> None:
    import tempfile

    from manager import releases
    from manager.errors import ReleaseError

    made: list[Path] = []

    def fake_copy(version: str, root: Path) -> None:  # extracted, then the run fails: the tree's fate is the point
        (Path(root) / "vllm").mkdir(parents=True, exist_ok=True)
        made.append(Path(root))
        raise ReleaseError("stopped here by the test")

    monkeypatch.setattr(releases, "copy_release", fake_copy)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    res = cli_run("--catalog", str(REPO_ROOT), "demo")
    first = res.stderr.splitlines()[0]
    assert "vllm==0.20.0" in first and "copy files from vllm 0.24.0" in first, res.stderr
    assert res.exit_code == 1 and made and not made[0].exists() and "removed" in res.stderr
    kept = cli_run("--catalog", str(REPO_ROOT), "demo", "--keep")
    assert kept.exit_code == 1 and made[1].is_dir() and str(made[1]) in kept.stderr
