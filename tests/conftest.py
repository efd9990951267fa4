"""Shared fixtures: real vLLM release trees from PyPI (cached), Docker and GPU gates."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

import pytest

from manager import releases

# The releases the overlay tests cover (issue 2): every one is a real sdist from PyPI.
RELEASES = ["0.19.0", "0.20.0", "0.26.0", "0.30.0", "0.31.0", "0.33.0"]

REPO_ROOT = Path(__file__).resolve().parent.parent


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
