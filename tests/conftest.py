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
