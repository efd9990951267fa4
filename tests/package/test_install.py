"""The wheel and the sdist, each installed (not editable) into a fresh venv outside the repository.

Proves the shipped catalog travels with the package (issue 12): every command below runs from a
directory that is not the checkout, with no PYTHONPATH and no OVERLAY_CATALOG. One venv per
artifact (module scope). Dependencies resolve through the machine's pip configuration
(its index / --find-links). Deselect with `-m "not install"`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT
from tests.helpers.catalogs import slim_root

pytestmark = [pytest.mark.install, pytest.mark.network]

VERSION = "0.20.0"


# Nothing of the checkout may leak in: without PYTHONPATH (a `python -m build` leaves an
# overlay_manager.egg-info in the repo root, which pip would take for an installed copy).
CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OVERLAY_CATALOG", "VIRTUAL_ENV")}


def _run(cmd: list[str], cwd: Path, timeout: int = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env or CLEAN_ENV)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`python -m build`: the sdist, then the wheel built from that sdist."""
    out = tmp_path_factory.mktemp("dist")
    res = _run([sys.executable, "-m", "build", "--outdir", str(out), str(REPO_ROOT)], cwd=out)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    log = res.stdout + res.stderr
    assert "SetuptoolsDeprecationWarning" not in log and "!!" not in log, "setuptools printed a deprecation banner"
    (wheel,) = out.glob("overlay_manager-*.whl")
    (sdist,) = out.glob("overlay_manager-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def test_wheel_carries_the_catalog_license_and_no_hard_extras(artifacts: dict[str, Path]) -> None:
    names = zipfile.ZipFile(artifacts["wheel"]).namelist()
    for part in ("overlays", "profiles", "compose"):
        assert any(n.startswith(f"manager/_catalog/{part}/") for n in names), part
    assert "manager/_catalog/compose/deployments.yaml" in names
    assert not any("__pycache__" in n for n in names)
    meta = zipfile.ZipFile(artifacts["wheel"]).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    import manager

    assert f"Version: {manager.__version__}\n" in meta  # the version lives in manager/__init__.py only
    assert "License-Expression: Apache-2.0" in meta and any(n.endswith("licenses/LICENSE") for n in names)
    core = [ln for ln in meta.splitlines() if ln.startswith("Requires-Dist:") and "extra ==" not in ln]
    assert not any(d in ln for ln in core for d in ("httpx", "docker", "nvidia")), core
    for extra in ("kernels", "verify", "upstream", "test"):
        assert f"Provides-Extra: {extra}" in meta


def test_wheel_carries_no_test_code(artifacts: dict[str, Path]) -> None:
    """Test support (testing/: the vLLM venv harness, the checkpoint factory, the write-delay seam) and tests/ stay in
    the repository: the wheel installed into every serving container holds the package and its catalog only."""
    names = zipfile.ZipFile(artifacts["wheel"]).namelist()
    modules = [n for n in names if n.endswith(".py")]
    assert "manager/fits/core.py" in modules  # the check below looks at real contents
    assert [n for n in modules if not n.startswith("manager/")] == []
    assert [n for n in modules if n.startswith(("manager/testing/", "manager/tests/"))] == []
    assert [n for n in names if n.split("/")[0] in {"testing", "tests", "benchmarks"}] == []
    top = {n.split("/")[0] for n in names}
    assert top == {"manager", next(t for t in top if t.endswith(".dist-info"))}, top


def test_sdist_carries_the_catalog_top_level(artifacts: dict[str, Path]) -> None:
    import tarfile

    names = tarfile.open(artifacts["sdist"]).getnames()
    top = names[0].split("/")[0]
    for rel in ("overlays", "profiles", "compose/deployments.yaml", "LICENSE", "setup.py", "MANIFEST.in"):
        assert f"{top}/{rel}" in names, rel


@pytest.fixture(scope="module", params=["wheel", "sdist"])
def installed(request: pytest.FixtureRequest, artifacts: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    """(overlay executable, a working directory outside the repo, env) for one artifact."""
    base = tmp_path_factory.mktemp(f"venv-{request.param}")
    venv = base / "venv"
    res = _run([sys.executable, "-m", "venv", str(venv)], cwd=base)
    assert res.returncode == 0, res.stderr
    t0 = time.perf_counter()
    res = _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(artifacts[request.param])], cwd=base)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "SetuptoolsDeprecationWarning" not in res.stderr
    print(f"pip install {artifacts[request.param].name}: {time.perf_counter() - t0:.1f} s")
    env = dict(CLEAN_ENV)
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    work = base / "work"
    work.mkdir()
    return venv / "bin" / "overlay", work, env


def _overlay(installed, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    exe, work, env = installed
    return _run([str(exe), *args], cwd=work, timeout=timeout, env=env)


def test_installed_copy_is_not_the_checkout(installed) -> None:
    exe, work, env = installed
    res = _run([str(exe.parent / "python"), "-c", "import manager; print(manager.__file__)"], cwd=work, env=env)
    assert res.returncode == 0 and "site-packages" in res.stdout and str(REPO_ROOT) not in res.stdout, res.stdout


def test_installed_list_reads_the_packaged_catalog(installed) -> None:
    res = _overlay(installed, "list", "--json")
    assert res.returncode == 0, res.stderr
    ids = {o["id"] for o in json.loads(res.stdout)["overlays"]}
    assert {p.name for p in (REPO_ROOT / "overlays").iterdir() if (p / "overlay.yaml").is_file()} == ids


def test_installed_status_and_apply_on_a_real_release(installed, tmp_path: Path) -> None:
    root = slim_root(VERSION, tmp_path / "site")
    res = _overlay(installed, "status", "--root", str(root), "--json")
    assert res.returncode in (0, 1), res.stderr
    before = json.loads(res.stdout)
    assert before["overlays"] and all(o["status"] != "applied" for o in before["overlays"]), before
    res = _overlay(installed, "apply", "--root", str(root))
    assert res.returncode == 0, res.stderr
    res = _overlay(installed, "status", "--root", str(root), "--json")
    assert res.returncode == 0, res.stderr
    assert any(o["status"] == "applied" for o in json.loads(res.stdout)["overlays"])


def test_installed_fits_and_plan(installed) -> None:
    res = _overlay(installed, "fits", "--model", "gemma-4-26b-a4b", "--weights", "awq", "--hardware", "rtx-3090",
                   "--gpus", "2", "--tp", "2", "--engine", "vllm-0.20.0", "--json")
    assert res.returncode in (0, 1) and json.loads(res.stdout), res.stderr
    res = _overlay(installed, "plan", "--model", "gemma-4-26b-a4b", "--hardware", "v100-sxm2-16gb", "--gpus", "2", "--json")
    assert res.returncode in (0, 1) and json.loads(res.stdout), res.stderr


def test_installed_compose_render(installed) -> None:
    res = _overlay(installed, "compose", "list", "--json")
    assert res.returncode == 0, res.stderr
    slug = json.loads(res.stdout)["deployments"][0]["slug"]
    res = _overlay(installed, "compose", "render", slug)
    assert res.returncode == 0, res.stderr
    assert "services:" in res.stdout and "vllm serve" in res.stdout


def test_installed_upstream_check_offline_says_unknown_without_evidence(installed, tmp_path: Path) -> None:
    res = _overlay(installed, "upstream", "check", "--offline", "--no-probe", "--cache", str(tmp_path / "gh"), "--json")
    assert res.returncode == 0, res.stderr
    results = json.loads(res.stdout)["results"]
    assert results and all(r["verdict"] == "unknown" for r in results), [r["verdict"] for r in results]


def test_installed_bundle_carries_only_container_dependencies(installed, tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    res = _overlay(installed, "bundle", "--python", "3.12", "--platform", "manylinux_2_28_x86_64", "-o", str(out))
    assert res.returncode == 0, res.stderr
    assert (out / "catalog" / "overlays").is_dir() and (out / "catalog" / "compose" / "deployments.yaml").is_file()
    assert not (out / "site" / "manager" / "_catalog").exists()
    packages = {n.lower() for n in json.loads((out / "BUNDLE.json").read_text())["packages"]}
    assert "libcst" in packages and not packages & {"httpx", "docker", "jinja2"}, packages


def test_installed_without_a_catalog_says_where_it_looked(installed, tmp_path: Path) -> None:
    exe, work, env = installed
    site = next((exe.parent.parent / "lib").glob("python3*/site-packages"))
    hidden = site / "manager" / "_catalog"
    moved = tmp_path / "_catalog"
    os.replace(hidden, moved)
    try:
        res = _overlay(installed, "list")
    finally:
        os.replace(moved, hidden)
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "no catalog found" in lines[0] and "--catalog" in lines[0], res.stderr
