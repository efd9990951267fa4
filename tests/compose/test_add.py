"""plan -> compose in one path (issue 26 point 3): `overlay catalog init DIR` makes a user catalog
layered over the shipped one (compose/ alone), `compose add --from-plan N` turns plan option N into
a rendered, checked deployment there, and `plan` prints that command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from manager.catalog import Catalog, default_catalog_dir
from manager.compose.registry import load_registry

PLAN = ["--model", "gemma-4-e2b", "--hardware", "rtx-3090", "--gpus", "1"]


@pytest.fixture()
def user_catalog(tmp_path: Path, cli_run) -> Path:
    d = tmp_path / "mine"
    res = cli_run("catalog", "init", str(d))
    assert res.exit_code == 0, res.stderr
    return d


def test_catalog_init_makes_a_compose_only_catalog_layered_over_the_shipped_one(user_catalog: Path) -> None:
    assert sorted(p.name for p in user_catalog.iterdir()) == ["compose"]
    cat = Catalog.locate(user_catalog)
    shipped = Path(default_catalog_dir())
    assert cat.root == user_catalog.resolve() and cat.compose_dir == user_catalog.resolve() / "compose"
    assert cat.overlays_dir == shipped / "overlays" and cat.profiles_dir == shipped / "profiles"
    assert load_registry(cat).deployments == {}


def test_catalog_init_refuses_a_directory_that_is_not_empty(tmp_path: Path, cli_run) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep").write_text("mine\n")
    res = cli_run("catalog", "init", str(tmp_path / "x"))
    assert res.exit_code == 1 and "not an empty directory" in res.stderr
    assert sorted(p.name for p in (tmp_path / "x").iterdir()) == ["keep"]


def test_compose_add_from_plan_writes_a_rendered_checked_deployment(user_catalog: Path, cli_run) -> None:
    plan = json.loads(cli_run("plan", *PLAN, "--json").stdout)
    want = plan["options"][1]
    res = cli_run("--catalog", str(user_catalog), "compose", "add", "--from-plan", "2", *PLAN, "--json")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    dep = load_registry(Catalog.locate(user_catalog)).get(out["slug"])
    assert (dep.engine, dep.weights, dep.tp, dep.gpus) == (want["engine"], want["weights"], want["tp"], want["tp"])
    assert dep.status == "experimental" and dep.port >= 8100
    assert Path(out["generated"]).read_text().count("services:") == 1
    check = cli_run("--catalog", str(user_catalog), "compose", "check")
    assert check.exit_code == 0, check.stdout + check.stderr
    assert "1 deployments" in check.stderr


def test_compose_add_twice_is_refused_and_changes_nothing(user_catalog: Path, cli_run) -> None:
    assert cli_run("--catalog", str(user_catalog), "compose", "add", "--from-plan", "1", *PLAN).exit_code == 0
    reg = user_catalog / "compose" / "deployments.yaml"
    before = reg.read_text()
    res = cli_run("--catalog", str(user_catalog), "compose", "add", "--from-plan", "1", *PLAN)
    assert res.exit_code == 1 and "exists; pass --slug" in res.stderr
    res = cli_run("--catalog", str(user_catalog), "compose", "add", "--from-plan", "999", *PLAN)
    assert res.exit_code == 1 and "--from-plan 999: the plan has options 1.." in res.stderr
    assert reg.read_text() == before


def test_compose_add_never_writes_the_shipped_catalog(cli_run) -> None:
    reg = Path(default_catalog_dir()) / "compose" / "deployments.yaml"
    before = reg.read_text()
    res = cli_run("compose", "add", "--from-plan", "1", *PLAN)
    assert res.exit_code == 1 and "overlay catalog init DIR" in res.stderr
    assert reg.read_text() == before


def test_plan_prints_the_add_command_and_it_runs(user_catalog: Path, cli_run) -> None:
    res = cli_run("--catalog", str(user_catalog), "plan", *PLAN)
    assert res.exit_code == 0
    (line,) = [ln for ln in res.stderr.splitlines() if "compose add --from-plan N" in ln]
    cmd = line.split("deploy option N: ", 1)[1].replace("--from-plan N", "--from-plan 1").split()
    assert cmd[:3] == ["overlay", "--catalog", str(user_catalog.resolve())]
    assert cli_run(*cmd[1:]).exit_code == 0


def test_plan_says_plainly_when_no_published_image_runs_on_the_hardware(cli_run) -> None:
    res = cli_run("plan", "--model", "gemma-4-e2b", "--hardware", "v100-sxm2-16gb", "--gpus", "1", "--json")
    note = json.loads(res.stdout)["engine_note"]
    assert "no published vLLM image runs on v100-sxm2-16gb (sm 7.0)" in note and "overlay image build vllm-v100" in note
    res = cli_run("plan", *PLAN, "--json")
    assert json.loads(res.stdout)["engine_note"] is None
