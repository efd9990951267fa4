"""Helpers the test modules import (fixtures live in the conftest.py files).

- `catalogs`: catalogs of shipped overlays, their mutators, slim release roots, byte-level checks.
- `cli`: the `overlay` CLI in this process (`run_cli`, the `cli_run` fixture) or as a process.
- `containers`: Docker images, bundles and docker-compose runs for the compose tests.
- `engine_gate`: skip (or fail in CI) when the real engine cannot be set up.
- `fake_github`: a local GitHub REST server over a real git history.
- `nvrtc12`: NVRTC 12 from the PyPI wheels, installed once into the cache.
- `scripts`: benchmarks/ scripts loaded by path for their tests.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SHIPPED_OVERLAYS = REPO_ROOT / "overlays"
TEST_FIXTURES = REPO_ROOT / "tests" / "fixtures"
BENCHMARKS = REPO_ROOT / "benchmarks"
