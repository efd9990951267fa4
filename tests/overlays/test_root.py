"""Root discovery (`--root` or where `import vllm` would look, without importing) and the package version."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from manager.errors import OverlayError
from manager.overlays import find_root, package_version
from tests.helpers.catalogs import shipped_catalog_dir
from tests.helpers.cli import overlay_process


def _fake_site(base: Path, marker: Path) -> Path:
    """A site-packages-like dir whose vllm/__init__.py leaves a marker file when imported."""
    site = base / "site-packages"
    pkg = site / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\nraise RuntimeError('imported')\n")
    return site


def test_find_root_uses_sys_path_without_importing(tmp_path, monkeypatch):
    marker = tmp_path / "imported.txt"
    site = _fake_site(tmp_path, marker)
    monkeypatch.setattr(sys, "path", [str(tmp_path / "nothing-here"), str(site), *sys.path])
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    assert find_root(None) == site.resolve()
    assert not marker.exists()
    assert "vllm" not in sys.modules


def test_find_root_takes_the_first_sys_path_entry_like_import(tmp_path, monkeypatch):
    first = _fake_site(tmp_path / "a", tmp_path / "m1")
    second = _fake_site(tmp_path / "b", tmp_path / "m2")
    monkeypatch.setattr(sys, "path", [str(first), str(second)])
    assert find_root(None) == first.resolve()


def test_find_root_namespace_package(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)  # no __init__.py
    monkeypatch.setattr(sys, "path", [str(site)])
    assert find_root(None) == site.resolve()


def test_find_root_not_installed_says_to_pass_root(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    with pytest.raises(OverlayError, match=r"package 'vllm' not found on sys.path .*--root"):
        find_root(None)


def test_root_arg_wins_over_sys_path(tmp_path, monkeypatch):
    site = _fake_site(tmp_path / "s", tmp_path / "m")
    other = tmp_path / "other"
    (other / "vllm").mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [str(site)])
    assert find_root(str(other)) == other.resolve()


def test_root_arg_not_a_directory(tmp_path):
    with pytest.raises(OverlayError, match=r"--root .*missing: not a directory"):
        find_root(str(tmp_path / "missing"))
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(OverlayError, match="not a directory"):
        find_root(str(f))


def test_root_arg_without_package_inside(tmp_path):
    with pytest.raises(OverlayError, match=r"--root .*: no vllm/ package inside"):
        find_root(str(tmp_path))


@pytest.mark.parametrize(
    "root_arg, reason",
    [("missing", "not a directory"), (".", "no vllm/ package inside")],
)
def test_cli_root_errors_exit_1_in_one_line(tmp_path, root_arg, reason):
    cat = shipped_catalog_dir(tmp_path / "cat")
    empty = tmp_path / "empty"
    empty.mkdir()
    target = str(tmp_path / root_arg) if root_arg != "." else str(empty)
    proc = overlay_process("--catalog", str(cat), "status", "--root", target)
    assert proc.returncode == 1
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and reason in lines[0]
    assert list(empty.iterdir()) == []


def test_cli_without_root_finds_package_via_pythonpath_without_importing(tmp_path):
    marker = tmp_path / "imported.txt"
    site = _fake_site(tmp_path, marker)
    (site / "vllm" / "_version.py").write_text("__version__ = version = '0.20.0'\n")
    cat = shipped_catalog_dir(tmp_path / "cat")
    proc = overlay_process("--catalog", str(cat), "status", "--json", env={"PYTHONPATH": str(site)})
    report = json.loads(proc.stdout)
    assert report["root"] == str(site.resolve())
    assert report["package_version"] == "0.20.0"
    assert {t["status"] for o in report["overlays"] for t in o["targets"]} == {"missing-target"}
    assert not marker.exists()


# --- package_version -------------------------------------------------------------------------


def test_package_version_from_dist_info(tmp_path):
    (tmp_path / "vllm").mkdir()
    info = tmp_path / "vllm-0.26.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.26.0\n\nVersion: 9.9\n")
    (tmp_path / "vllm" / "_version.py").write_text("__version__ = '0.1.0'\n")
    assert package_version(tmp_path) == "0.26.0"  # dist-info first


@pytest.mark.parametrize(
    "text, expected",
    [
        ("__version__ = version = '0.19.0'\n__version_tuple__ = (0, 19, 0)\n", "0.19.0"),
        ('# generated\n__version__ = "0.31.0rc1"\n', "0.31.0rc1"),
        ("__version__ = version = '0.20.1.dev3+g1234abc'\n", "0.20.1.dev3+g1234abc"),
        ("VERSION = '1'\n", None),
    ],
)
def test_package_version_from_version_py(tmp_path, text, expected):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "_version.py").write_text(text)
    assert package_version(tmp_path) == expected


def test_package_version_unknown(tmp_path):
    (tmp_path / "vllm").mkdir()
    assert package_version(tmp_path) is None


def test_package_version_of_a_real_release(vllm_root):
    root = vllm_root("0.20.0")
    assert package_version(root) == "0.20.0"
    for info in root.glob("vllm-*.dist-info"):
        for f in info.iterdir():
            f.unlink()
        info.rmdir()
    # without the dist-info the sdist's vllm/_version.py (if shipped) still answers, or nothing does
    v = package_version(root)
    assert v in ("0.20.0", None)
    if (root / "vllm" / "_version.py").exists():
        assert v == "0.20.0"
