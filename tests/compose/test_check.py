"""`compose check`: each invariant fails on a registry that breaks it; the shipped registry passes all."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from manager.catalog import Catalog
from manager.compose.check import check_registry, render_all, write_generated
from manager.compose.registry import parse_registry
from manager.compose.render import ServicePlan

ENGINES = {"e1": SimpleNamespace(image="vllm/vllm-openai:v0.20.0", unverified=[])}


def _entry(port: int, **over) -> dict:
    return {"model": "m", "engine": "e1", "hardware": "h", "gpus": 2, "tp": 2, "ctx": 4096, "port": port,
            "status": "production", **over}


def _plan(dep, **over) -> ServicePlan:
    return ServicePlan(slug=dep.slug, image=ENGINES[dep.engine].image, gpus=dep.gpus, tp=dep.tp, port=dep.port,
                       serve_args=("/models/m", "--tensor-parallel-size", str(dep.tp)), status=dep.status,
                       note=dep.note, **over)


def _setup(tmp_path: Path, entries: dict, write: bool = True):
    reg = parse_registry({"deployments": entries}, tmp_path / "compose" / "deployments.yaml")
    plans = {s: _plan(d) for s, d in reg.deployments.items()}
    if write:
        write_generated(reg, render_all(plans))
    return reg, plans


def _failed(report) -> set[tuple[str, str]]:
    return {(f.slug, f.check) for f in report.problems}


def test_a_consistent_registry_passes_every_check(tmp_path: Path) -> None:
    reg, plans = _setup(tmp_path, {"a": _entry(9001), "b": _entry(9002)})
    report = check_registry(reg, plans, ENGINES)
    assert report.ok, report.problems
    assert {f.check for f in report.findings} == {"unique-port", "tp-devices", "fits", "generated-current", "image-pin", "file-tp",
                                                  "unverified"}
    assert not report.warnings


def test_unverified_fields_and_a_placeholder_image_warn_never_pass(tmp_path: Path) -> None:
    """issue 11: a verdict resting on an unverified profile field, or an unverified image pin, is a warning."""
    from dataclasses import replace
    from types import SimpleNamespace

    reg, plans = _setup(tmp_path, {"a": _entry(9001)})
    plans = {"a": replace(plans["a"], warnings=("unverified: engines/e.image", "unverified: models/m.max_context"))}
    pin = ENGINES[reg.deployments["a"].engine].image
    engines = {reg.deployments["a"].engine: SimpleNamespace(image=pin, unverified=["image"])}
    report = check_registry(reg, plans, engines)
    warned = {(f.check, f.message.split(":")[0]) for f in report.warnings}
    assert ("unverified", "rests on 2 unverified field(s)") in warned
    assert any(f.check == "image-pin" and "unverified" in f.message for f in report.warnings)
    assert all(f.ok for f in report.warnings)  # warnings, not failures


def test_duplicate_ports_fail_for_both_deployments(tmp_path: Path) -> None:
    reg, plans = _setup(tmp_path, {"a": _entry(9001), "b": _entry(9001)})
    assert _failed(check_registry(reg, plans, ENGINES)) == {("a", "unique-port"), ("b", "unique-port")}


def test_stale_missing_and_stray_generated_files_fail(tmp_path: Path) -> None:
    reg, plans = _setup(tmp_path, {"a": _entry(9001), "b": _entry(9002)})
    reg.generated_path("a").write_text(reg.generated_path("a").read_text().replace("9001", "9009"))
    reg.generated_path("b").unlink()
    (reg.generated_dir / "old.yml").write_text("services: {}\n")
    failed = _failed(check_registry(reg, plans, ENGINES))
    assert {("a", "generated-current"), ("b", "generated-current"), ("old", "generated-current")} <= failed


def test_image_differing_from_the_engine_pin_fails(tmp_path: Path) -> None:
    reg, plans = _setup(tmp_path, {"a": _entry(9001)})
    engines = {"e1": SimpleNamespace(image="vllm/vllm-openai:v0.21.0", unverified=[])}
    report = check_registry(reg, plans, engines)
    assert ("a", "image-pin") in _failed(report)
    assert "v0.21.0" in next(f.message for f in report.problems if f.check == "image-pin")


def test_tp_differing_from_the_device_count_fails(tmp_path: Path) -> None:
    reg, plans = _setup(tmp_path, {"a": _entry(9001, gpus=2, tp=1)})
    assert ("a", "tp-devices") in _failed(check_registry(reg, plans, ENGINES))


def test_file_whose_tp_argument_disagrees_with_the_registry_fails(tmp_path: Path) -> None:
    reg, plans = _setup(tmp_path, {"a": _entry(9001)})
    path = reg.generated_path("a")
    path.write_text(path.read_text().replace('- "--tensor-parallel-size"\n      - "2"', '- "--tensor-parallel-size"\n      - "4"'))
    assert ("a", "file-tp") in _failed(check_registry(reg, plans, ENGINES))


@pytest.mark.parametrize(
    "status,note,ok",
    [
        ("production", "x", False),
        ("experimental", "does not say why", False),
        ("experimental", "blocked by marlin-group-divides", True),
    ],
)
def test_failing_fits_needs_experimental_status_naming_the_constraint(tmp_path: Path, status: str, note: str, ok: bool) -> None:
    reg, plans = _setup(tmp_path, {"a": _entry(9001, status=status, note=note)})
    plans = {"a": dataclasses.replace(plans["a"], failing=("marlin-group-divides",), verdict="fails")}
    write_generated(reg, render_all(plans))
    assert (("a", "fits") not in _failed(check_registry(reg, plans, ENGINES))) is ok


def test_shipped_registry_passes_compose_check_and_generated_files_are_current() -> None:
    from manager.compose.check import run_check

    report = run_check(Catalog.locate())
    assert report.ok, [f"{f.slug}: {f.check}: {f.message}" for f in report.problems]
    slugs = {f.slug for f in report.findings}
    assert len(slugs) >= 5


def test_cli_compose_check_exits_1_and_names_the_problem(tmp_path: Path, cli_run) -> None:
    cat = Catalog.locate()
    import shutil

    for part in ("profiles", "overlays", "compose"):
        shutil.copytree(cat.root / part, tmp_path / part)
    gen = next((tmp_path / "compose" / "generated").glob("*.yml"))
    gen.write_text(gen.read_text() + "# hand edit\n")
    res = cli_run("--catalog", str(tmp_path), "compose", "check", "--json")
    assert res.exit_code == 1
    assert res.err_lines == ["error: compose check: 1 problem(s)"]
    import json

    data = json.loads(res.stdout)
    assert [f["check"] for f in data["findings"] if not f["ok"]] == ["generated-current"]


def test_generated_header_names_failing_constraints_and_unverified_fields(tmp_path: Path) -> None:
    from dataclasses import replace

    from manager.compose.render import render_compose

    reg, plans = _setup(tmp_path, {"a": _entry(9001)}, write=False)
    text = render_compose(replace(plans["a"], warnings=("fits() fails weight-format: nvfp4\nnot loadable", "unverified: engines/e.image")))
    header = text.split("services:")[0]
    assert "# WARNING: fits() fails weight-format: nvfp4 not loadable\n" in header  # one comment line per warning
    assert "# WARNING: unverified: engines/e.image\n" in header
    import yaml

    assert yaml.safe_load(text)["services"]  # still valid YAML


def _recipe_engine(tmp_path: Path, tag: str | None):
    """An engine whose image is built locally from compose/images/r1 (recipe.yaml names `tag`; None: no recipe)."""
    if tag is not None:
        d = tmp_path / "compose" / "images" / "r1"
        d.mkdir(parents=True, exist_ok=True)
        (d / "recipe.yaml").write_text(f"tag: {tag}\n")
    return {"e1": SimpleNamespace(image=ENGINES["e1"].image, unverified=[], image_recipe="r1")}


def test_a_locally_built_image_passes_when_its_recipe_names_the_pin_without_any_registry(tmp_path: Path) -> None:
    reg, plans = _setup(tmp_path, {"a": _entry(9001)})
    report = check_registry(reg, plans, _recipe_engine(tmp_path, ENGINES["e1"].image))
    pin = next(f for f in report.findings if f.check == "image-pin")
    assert pin.ok and not pin.warn and "local build from compose/images/r1" in pin.message and "no registry" in pin.message


def test_a_locally_built_image_fails_when_its_recipe_builds_another_tag(tmp_path: Path) -> None:
    reg, plans = _setup(tmp_path, {"a": _entry(9001)})
    report = check_registry(reg, plans, _recipe_engine(tmp_path, "other/image:1"))
    assert ("a", "image-pin") in _failed(report)


def test_a_locally_built_image_without_its_recipe_warns(tmp_path: Path) -> None:
    reg, plans = _setup(tmp_path, {"a": _entry(9001)})
    report = check_registry(reg, plans, _recipe_engine(tmp_path, None))
    assert report.ok and any(f.check == "image-pin" and "recipe compose/images/r1/recipe.yaml is missing" in f.message
                             for f in report.warnings)
