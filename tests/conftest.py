"""Shared fixtures: real vLLM release trees from PyPI (cached), the repository root, the in-process CLI."""

from __future__ import annotations

import shutil
from pathlib import Path
from collections.abc import Callable

import pytest

from manager import releases

from .helpers import REPO_ROOT
from .helpers.cli import CliResult, run_cli


@pytest.fixture(scope="session")
def pristine_release() -> Callable[[str], Path]:
    """version -> read-only extracted root (holding vllm/ and a dist-info). Do not modify."""

    def get(version: str) -> Path:
        return releases.pristine_tree(version)

    return get


@pytest.fixture
def vllm_root(tmp_path: Path) -> Callable[[str], Path]:
    """version -> a fresh, writable copy of the release's package root under tmp_path."""

    def make(version: str) -> Path:
        dest = tmp_path / f"site-{version}"
        if dest.exists():
            shutil.rmtree(dest)
        return releases.copy_release(version, dest)

    return make


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def cli_run() -> Callable[..., CliResult]:
    """`cli_run(*args, env=None)`: `overlay ARGS` in this process through manager.cli.main and its error
    handler -> CliResult(exit_code, stdout, stderr) (tests/helpers/cli.py, `run_cli`)."""
    return run_cli


@pytest.fixture(scope="session")
def cpu_engine_stack(tmp_path_factory):
    """The real-engine compose set-up (engine venv, runtime image, tiny checkpoints and references, catalog,
    renderings, bundle), built once per session and shared by tests/compose/test_cpu_deployment_real_engine.py,
    test_memory_deployment_real_engine.py and tests/k8s/test_pod_semantics_real_engine.py. It lives here, not in
    tests/compose/conftest.py, so that one definition serves every package (a fixture imported into another
    module is a second definition, and its session value is built a second time)."""
    from tests.compose.test_cpu_deployment_real_engine import build_stack

    return build_stack(tmp_path_factory)
