"""The built wheel installed the two ways the README names for a tool, `pipx install` and `uv tool
install` (issue 26 point 1), each into a temp dir, run from a directory outside the checkout, with the
[verify] extra as the README's install lines give it, and walked plan → compose add → check → bundle →
verify (the bundle just built, mounted in the verify tests' cached stand-in image).

Neither venv has pip (uv's never does; pipx makes its venvs without one), so `overlay bundle` must
build its site/ without the tool's own pip: the pipx run finds only a pip on PATH (another
interpreter's), the uv run only `uv`. pipx and uv come from PyPI once into
<cache>/ci-tools/ (reused: CI pays ~6 s the first time); uv's cache lives there too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

from manager.releases import cache_dir
from tests.helpers import REPO_ROOT
from tests.helpers import containers as dh

pytestmark = [pytest.mark.install, pytest.mark.network]

CLEAN = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OVERLAY_CATALOG", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV")}
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def tools() -> Path:
    """A venv holding pipx and uv from PyPI, made once per cache."""
    d = cache_dir() / "ci-tools"
    with FileLock(str(d) + ".lock"):
        if not (d / ".complete").exists():
            res = _run([sys.executable, "-m", "venv", "--clear", d], cwd=cache_dir(), env=CLEAN)
            assert res.returncode == 0, res.stderr
            res = _run([d / "bin" / "python", "-m", "pip", "install", "-q", "pipx", "uv"], cwd=d, env=CLEAN)
            assert res.returncode == 0, res.stderr[-2000:]
            (d / ".complete").write_text("pipx uv\n")
    return d


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    res = _run([sys.executable, "-m", "build", "--wheel", "--outdir", out, REPO_ROOT], cwd=out, env=CLEAN)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    (whl,) = out.glob("overlay_manager-*.whl")
    return whl


def _only(tmp: Path, **names: Path) -> str:
    """A PATH directory holding only the given executables (no pip, no python of the host)."""
    d = tmp / "path-only"
    d.mkdir(exist_ok=True)
    for name, target in names.items():
        (d / name).symlink_to(target)
    return str(d)


def _cache_view(tmp: Path) -> Path:
    """A cache sharing the machine's sdists and trees (no re-download of vLLM) but no bundle wheels:
    the bundle has to fetch them with what this install has."""
    view = tmp / "cache"
    view.mkdir()
    real = cache_dir()
    for part in ("sdists", "trees", "release-files", "fits"):
        (real / part).mkdir(exist_ok=True)
        (view / part).symlink_to(real / part)
    return view


@pytest.fixture(scope="module", params=["pipx", "uv"])
def installed(request: pytest.FixtureRequest, tools: Path, wheel: Path, tmp_path_factory: pytest.TempPathFactory):
    """(overlay executable, work dir outside the repo, env whose PATH has no pip of the tool's venv)."""
    base = tmp_path_factory.mktemp(request.param)
    env = dict(CLEAN, PATH=f"{base / 'bin'}:/usr/bin:/bin")
    if request.param == "pipx":
        env.update(PIPX_HOME=str(base / "pipx"), PIPX_BIN_DIR=str(base / "bin"),
                   PIPX_SHARED_LIBS=str(cache_dir() / "ci-tools-pipx-shared"))
        res = _run([tools / "bin" / "pipx", "install", "--python", sys.executable, f"{wheel}[verify]"], cwd=base, env=env)
        venv_python = base / "pipx" / "venvs" / "overlay-manager" / "bin" / "python"
        path = _only(base, pip=tools / "bin" / "pip")  # another interpreter's pip, as a user's PATH has
    else:
        env.update(UV_TOOL_DIR=str(base / "uv-tools"), UV_TOOL_BIN_DIR=str(base / "bin"),
                   UV_CACHE_DIR=str(cache_dir() / "ci-tools-uv-cache"), UV_PYTHON_DOWNLOADS="never")
        res = _run([tools / "bin" / "uv", "tool", "install", "--python", sys.executable, f"{wheel}[verify]"], cwd=base, env=env)
        venv_python = base / "uv-tools" / "overlay-manager" / "bin" / "python"
        path = _only(base, uv=tools / "bin" / "uv")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    nopip = _run([venv_python, "-m", "pip", "--version"], cwd=base, env=env)
    assert nopip.returncode != 0, f"the {request.param} venv has a pip: this test would prove nothing"
    docker_sdk = _run([venv_python, "-c", "import docker"], cwd=base, env=env)
    assert docker_sdk.returncode == 0, f"the [verify] extra did not install: {docker_sdk.stderr[-500:]}"
    env["PATH"] = f"{base / 'bin'}:{path}"
    work = base / "work"
    work.mkdir()
    return base / "bin" / "overlay", work, env, request.param


@pytest.fixture(scope="module")
def walked(installed):
    """catalog init → plan → compose add --from-plan 1 → compose check → bundle, each step asserted;
    (exe, work dir, env, how, bundle dir)."""
    exe, work, env, how = installed
    plan = ["--model", "gemma-4-e2b", "--hardware", "rtx-3090", "--gpus", "1"]
    res = _run([exe, "catalog", "init", work / "mine"], cwd=work, env=env)
    assert res.returncode == 0, res.stderr
    res = _run([exe, "--catalog", work / "mine", "plan", *plan], cwd=work, env=env)
    assert res.returncode == 0 and "compose add --from-plan N" in res.stderr, res.stderr
    res = _run([exe, "--catalog", work / "mine", "compose", "add", "--from-plan", "1", *plan, "--json"], cwd=work, env=env)
    assert res.returncode == 0, res.stderr
    assert "services:" in Path(json.loads(res.stdout)["generated"]).read_text()
    res = _run([exe, "--catalog", work / "mine", "compose", "check"], cwd=work, env=env)
    assert res.returncode == 0 and "1 deployments" in res.stderr, res.stdout + res.stderr
    benv = dict(env, OVERLAY_CACHE=str(_cache_view(work)))
    out = work / "bundle"
    res = _run([exe, "--catalog", work / "mine", "bundle", "--python", PY, "-o", out, "--no-plans", "--json"], cwd=work, env=benv)
    assert res.returncode == 0, f"{how}: {res.stderr}"
    return exe, work, benv, how, out


def test_installed_tool_walks_plan_compose_add_check_bundle(walked) -> None:
    exe, work, benv, how, out = walked
    assert (out / "catalog" / "overlays").is_dir() and (out / "catalog" / "compose" / "generated").is_dir()
    packages = {n.lower() for n in json.loads((out / "BUNDLE.json").read_text())["packages"]}
    assert {"libcst", "pydantic", "click"} <= packages, packages
    res = _run([out / "bin" / "overlay", "list", "--json"], cwd=work, env=dict(CLEAN, OVERLAY_PYTHON=sys.executable))
    assert res.returncode == 0 and json.loads(res.stdout)["overlays"], res.stderr
    if how == "pipx":  # the wheels are cached now: a second bundle needs no pip at all
        benv = dict(benv, PATH=str(exe.parent))
        res = _run([exe, "bundle", "--python", PY, "-o", work / "bundle2", "--no-plans"], cwd=work, env=benv)
        assert res.returncode == 0, res.stderr


@pytest.fixture(scope="module")
def stand_in_image() -> str:
    """The verify tests' cached image, asked for before the walk so that a missing engine skips (or
    fails) at once."""
    return dh.vllm_image(dh.docker_client())


@pytest.mark.docker
def test_installed_tool_verifies_its_bundle_inside_an_image(stand_in_image: str, walked) -> None:
    """`overlay verify --image --bundle` of the installed tool: the bundle it just built, mounted in
    the stand-in image of tests/compose/test_verify.py (vLLM 0.20.0 sources, Python 3.11; cached,
    built with debootstrap, no registry). Skips only without Docker, and fails then under
    OVERLAY_REQUIRE_DOCKER=1 as in CI."""
    exe, work, benv, how, out = walked
    image = stand_in_image
    if PY != dh.IMAGE_PYTHON:  # the walk's bundle is for this python; the image runs its own
        out = work / "bundle-image"
        res = _run([exe, "--catalog", work / "mine", "bundle", "--python", dh.IMAGE_PYTHON, "--platform",
                    dh.IMAGE_PLATFORM, "-o", out, "--no-plans"], cwd=work, env=benv)
        assert res.returncode == 0, f"{how}: {res.stderr}"
    res = _run([exe, "--catalog", work / "mine", "verify", "--image", image, "--bundle", out, "--json"], cwd=work, env=benv)
    assert res.returncode == 0, f"{how}: {res.stdout[-1000:]}{res.stderr[-2000:]}"
    rep = json.loads(res.stdout)
    assert rep["vllm"] == "0.20.0" and rep["python"].startswith(dh.IMAGE_PYTHON + "."), rep
    assert rep["overlays"]["vllm-pr40886-gemma4-awq-moe-keys"] == "pending", rep["overlays"]
    assert rep["failing"] == {} and rep["error"] == "", rep
