"""`overlay verify --image`: statuses and versions read from inside a real image (network off)."""

from __future__ import annotations

import json

import pytest

from manager.catalog import Catalog
from manager.compose.verify import platform_for_glibc, verify_image
from manager.errors import ComposeError
from tests.helpers import containers as dh

PR = "vllm-pr40886-gemma4-awq-moe-keys"


@pytest.mark.parametrize("glibc,plat", [("2.36", "manylinux_2_28_x86_64"), ("2.28", "manylinux_2_28_x86_64"),
                                        ("2.27", "manylinux_2_17_x86_64")])
def test_platform_follows_the_images_glibc(glibc: str, plat: str) -> None:
    assert platform_for_glibc(glibc) == plat


@pytest.mark.parametrize("glibc", ["2.12", None, "musl"])
def test_images_without_a_usable_glibc_are_refused(glibc) -> None:
    with pytest.raises(ComposeError):
        platform_for_glibc(glibc)


@pytest.fixture(scope="module")
def images():
    client = dh.docker_client()
    catalog = Catalog.locate()
    return {"pristine": dh.vllm_image(client), "drift": dh.drift_image(client), "bundle": dh.bundle_dir(catalog),
            "catalog": catalog, "client": client}


@pytest.mark.docker
def test_verify_reports_versions_and_pending_statuses_of_a_pristine_release(images) -> None:
    rep = verify_image(images["pristine"], images["catalog"], images["bundle"])
    assert rep.vllm == "0.20.0" and rep.transformers == dh.TRANSFORMERS_VERSION and rep.torch is None
    assert rep.python.startswith("3.11.") and rep.glibc == "2.36"
    assert rep.overlays[PR] == "pending"
    assert rep.overlays["dynamo-dict-caches"] == "pending"
    assert rep.failing == {} and rep.error == ""


@pytest.mark.docker
def test_verify_reports_drift_when_the_anchor_changed(images) -> None:
    rep = verify_image(images["drift"], images["catalog"], images["bundle"])
    assert rep.overlays[PR] == "drift"
    assert rep.failing == {PR: "drift"}
    assert rep.overlays["dynamo-dict-caches"] == "pending"


@pytest.mark.docker
def test_cli_verify_json_and_exit_code(images, cli_run) -> None:
    ok = cli_run("verify", "--image", images["pristine"], "--bundle", str(images["bundle"]), "--json")
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["overlays"][PR] == "pending"
    bad = cli_run("verify", "--image", images["drift"], "--bundle", str(images["bundle"]))
    assert bad.exit_code == 1
    error = bad.err_lines[-1]  # the one `error:` line: ComposeError("image ...: overlays that cannot apply as they are: ...")
    assert error.startswith("error: ") and PR in error and "drift" in error


@pytest.mark.docker
def test_verify_builds_a_bundle_for_the_images_python_when_none_is_given(images) -> None:
    rep = verify_image(images["pristine"], images["catalog"])
    assert rep.overlays[PR] == "pending" and rep.vllm == "0.20.0"


@pytest.mark.docker
def test_verify_of_a_missing_image_is_a_one_line_error(images) -> None:
    with pytest.raises(ComposeError, match="not present locally"):
        verify_image("overlay-manager-test/does-not-exist:0", images["catalog"], images["bundle"])
