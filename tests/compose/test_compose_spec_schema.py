"""Generated compose files against the official Compose Specification JSON schema (Compose v2),
in addition to docker-compose 1.29's own `config` (tests/compose/test_deployments_on_docker.py). Issue 12, point 8."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

from manager.catalog import Catalog
from manager.compose import spec
from manager.compose.plan import load_profiles, plan_deployment
from manager.compose.registry import load_registry
from manager.compose.render import RenderOptions, render_compose
from tests.helpers import REPO_ROOT

pytestmark = pytest.mark.network  # the schema comes from a pinned PyPI wheel once, then from the cache

GENERATED = sorted((REPO_ROOT / "compose" / "generated").glob("*.yml"))


@pytest.fixture(scope="module")
def schema() -> dict:
    return spec.load_schema()


def test_schema_is_the_pinned_compose_specification(schema: dict) -> None:
    path = spec.schema_path()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == spec.SCHEMA_SHA256
    assert schema["title"] == "Compose Specification"
    assert {"services", "name"} <= set(schema["properties"])  # the v2-era schema (top-level name)


@pytest.mark.parametrize("path", GENERATED, ids=[p.stem for p in GENERATED])
def test_committed_generated_file_is_valid_compose_spec(path: Path, schema: dict) -> None:
    assert spec.validate(yaml.safe_load(path.read_text()), schema) == []


@pytest.mark.parametrize("gpu", [True, False], ids=["gpu", "no-gpu"])
def test_every_rendered_deployment_is_valid_compose_spec(gpu: bool, schema: dict) -> None:
    catalog = Catalog.locate(REPO_ROOT)
    reg, profiles = load_registry(catalog), load_profiles(catalog)
    assert reg.deployments
    for slug, dep in sorted(reg.deployments.items()):
        doc = yaml.safe_load(render_compose(plan_deployment(dep, profiles, catalog), RenderOptions(gpu=gpu)))
        assert spec.validate(doc, schema) == [], slug


def test_the_validator_rejects_what_the_spec_does_not_allow(schema: dict) -> None:
    doc = yaml.safe_load(GENERATED[0].read_text())
    svc = next(iter(doc["services"].values()))
    svc["healthcheck"]["start_perod"] = "10s"  # a typo of start_period
    svc["init"] = "yes"
    errors = spec.validate(doc, schema)
    assert any("start_perod" in e for e in errors) and any(e.endswith("'yes' is not of type 'boolean'") for e in errors)


@pytest.mark.parametrize("path", GENERATED, ids=[p.stem for p in GENERATED])
def test_run_hint_names_compose_v2_and_v1(path: Path) -> None:
    head = path.read_text().split("services:", 1)[0]
    slug = path.stem
    assert f"docker compose -p {slug} -f {slug}.yml up -d" in head
    assert f"docker-compose -p {slug} -f {slug}.yml up -d" in head
