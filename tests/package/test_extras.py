"""Extras instead of hard dependencies (issue 12, point 2): the core imports none of them, each
command that needs one names it when it is missing, and the bundle carries only what the
container's apply/status/build import."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

import manager
from manager.compose import bundle
from manager.errors import BuildError, ComposeError, UpstreamError
from tests.helpers import REPO_ROOT

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())


def _name(req: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0].lower()


def test_extras_hold_what_only_some_commands_need() -> None:
    project = PYPROJECT["project"]
    core = {_name(r) for r in project["dependencies"]}
    extras = project["optional-dependencies"]
    assert set(extras) >= {"kernels", "verify", "upstream", "test"}
    assert {_name(r) for r in extras["kernels"]} == {"nvidia-cuda-nvrtc-cu12", "nvidia-cuda-runtime-cu12",
                                                     "nvidia-cuda-cccl-cu12"}
    assert {_name(r) for r in extras["verify"]} == {"docker"} and {_name(r) for r in extras["upstream"]} == {"httpx"}
    assert not core & {"docker", "httpx", "nvidia-cuda-nvrtc-cu12"}


def test_version_license_in_one_place() -> None:
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "manager.__version__"}
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert "Apache License" in (REPO_ROOT / "LICENSE").read_text()[:200]
    assert re.fullmatch(r"\d+\.\d+\.\d+", manager.__version__)


def test_the_cli_and_the_commands_without_extras_import_none_of_them(tmp_path: Path) -> None:
    code = ("import sys\n"
            "for m in ('httpx', 'docker'):\n"
            "    sys.modules[m] = None\n"  # importing them raises ImportError
            "from manager.cli import main\n"
            "main(['upstream', 'check', '--offline', '--no-probe', '--json', '--cache', sys.argv[1]])\n")
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path / "gh")],
                         capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin",
                                                                           "OVERLAY_CATALOG": str(REPO_ROOT)})
    assert res.returncode == 0, res.stderr
    assert '"results"' in res.stdout


def test_upstream_without_httpx_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from manager.upstream import github

    monkeypatch.setitem(sys.modules, "httpx", None)
    with pytest.raises(UpstreamError, match=r"--offline.*\[upstream\] extra: `pipx inject overlay-manager"):
        github._httpx()


def test_verify_without_the_docker_sdk_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from manager.compose import verify

    monkeypatch.setitem(sys.modules, "docker", None)
    with pytest.raises(ComposeError, match=r"\[verify\] extra: `pipx inject overlay-manager 'docker>=7'`"):
        verify._client()


def test_build_without_nvrtc_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from manager.kernels import nvrtc

    monkeypatch.setattr(nvrtc, "_candidates", lambda explicit: [])
    with pytest.raises(BuildError, match=r"\[kernels\] extra.*uv tool install --reinstall --with nvidia-cuda-nvrtc-cu12"):
        nvrtc.find_nvrtc()


def test_bundle_requirements_are_the_container_ones_and_cover_every_core_dependency() -> None:
    reqs = {_name(r) for r in bundle.runtime_requirements()}
    assert reqs == set(bundle.BUNDLE_DISTS)
    assert not reqs & {"jinja2", "httpx", "docker"}
    core = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    # a new core dependency must be decided on: in the bundle, or named as not needed there
    assert core == reqs | set(bundle.NOT_BUNDLED)


def test_bundle_module_no_longer_reads_pyproject() -> None:
    src = Path(bundle.__file__).read_text()
    assert "pyproject" not in src and "parents[2]" not in src


@pytest.mark.parametrize("argv", [["status", "--root", "{root}", "--json"], ["compose", "list", "--json"],
                                  ["build", "--help"], ["apply", "--root", "{root}", "--dry-run"]])
def test_container_commands_run_without_jinja2_or_the_extras(argv: list[str], tmp_path: Path) -> None:
    """What the bundle leaves out (jinja2 and the extras) is never imported by apply/status/build."""
    (tmp_path / "vllm").mkdir()
    argv = [a.replace("{root}", str(tmp_path)) for a in argv]
    code = ("import sys\n"
            "for m in ('jinja2', 'httpx', 'docker'):\n"
            "    sys.modules[m] = None\n"
            "from manager.cli import main\n"
            f"main({argv!r})\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin", "OVERLAY_CATALOG": str(REPO_ROOT)})
    assert res.returncode in (0, 1), res.stderr
    assert "ModuleNotFoundError" not in res.stderr and "internal error" not in res.stderr, res.stderr


def test_the_hint_lists_are_pyprojects_extras() -> None:
    from manager.extras import EXTRAS

    extras = PYPROJECT["project"]["optional-dependencies"]
    # test and lint are the developers' extras: no command of the tool needs them
    assert {k: tuple(v) for k, v in extras.items() if k not in ("test", "lint")} == EXTRAS


@pytest.mark.parametrize("argv", [["inspect", "google/gemma-4-E2B-it"], ["inspect", "https://example.org/model"],
                                  ["fits", "--checkpoint", "google/gemma-4-E2B-it", "--hardware", "rtx-3090"]])
def test_remote_inspect_without_httpx_is_one_line_naming_the_extra_for_pipx_and_uv(argv: list[str]) -> None:
    code = ("import sys\n"
            "sys.modules['httpx'] = None\n"
            "from manager.cli import main\n"
            f"main({argv!r})\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin", "OVERLAY_CATALOG": str(REPO_ROOT)})
    assert res.returncode == 1, res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert "[inspect] extra" in line and "pipx inject overlay-manager" in line and "uv tool install" in line, line
    assert "not on PyPI" in line and "internal error" not in line
