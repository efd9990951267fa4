"""Where the shipped catalog is found (issue 12, point 1), without building a wheel: the package
resource first, then a checkout's root; one line when there is none."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from manager import catalog as catmod
from manager.errors import CatalogError
from tests.helpers import REPO_ROOT


def _fake_package(tmp_path: Path, with_resource: bool, with_checkout: bool) -> Path:
    pkg = tmp_path / "site" / "manager"
    pkg.mkdir(parents=True)
    if with_resource:
        shutil.copytree(REPO_ROOT / "profiles", pkg / "_catalog" / "profiles")
        (pkg / "_catalog" / "overlays").mkdir()
    if with_checkout:
        (pkg.parent / "overlays").mkdir()
    return pkg


@pytest.mark.parametrize("with_checkout", [True, False])
def test_the_package_resource_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_checkout: bool) -> None:
    pkg = _fake_package(tmp_path, True, with_checkout)
    monkeypatch.setattr(catmod, "__file__", str(pkg / "catalog.py"))
    monkeypatch.delenv(catmod.ENV_VAR, raising=False)
    assert catmod.default_catalog_dir() == pkg / "_catalog"
    assert catmod.Catalog.locate().root == pkg / "_catalog"


def test_a_checkout_root_is_used_without_a_resource(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = _fake_package(tmp_path, False, True)
    monkeypatch.setattr(catmod, "__file__", str(pkg / "catalog.py"))
    assert catmod.default_catalog_dir() == pkg.parent


def test_no_catalog_is_one_line_naming_where_it_looked_and_how_to_point_at_one(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = _fake_package(tmp_path, False, False)
    monkeypatch.setattr(catmod, "__file__", str(pkg / "catalog.py"))
    monkeypatch.delenv(catmod.ENV_VAR, raising=False)
    with pytest.raises(CatalogError) as exc:
        catmod.Catalog.locate()
    msg = str(exc.value)
    assert "\n" not in msg and str(pkg / "_catalog") in msg and "--catalog" in msg and catmod.ENV_VAR in msg


def test_the_override_still_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = _fake_package(tmp_path, True, False)
    monkeypatch.setattr(catmod, "__file__", str(pkg / "catalog.py"))
    monkeypatch.setenv(catmod.ENV_VAR, str(REPO_ROOT))
    assert catmod.Catalog.locate().root == REPO_ROOT
    assert catmod.Catalog.locate(str(pkg / "_catalog")).root == pkg / "_catalog"
