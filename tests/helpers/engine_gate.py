"""The real-engine tests' set-up gate (tests/testing/test_real_engine_ab.py,
tests/compose/test_cpu_deployment_real_engine.py).

`require(what, build)` runs `build()` (an engine venv, a transformers layer, ...) and returns its result. When it
raises EngineError the test skips, except in CI (CI=true, as .ci/run sets it), where it is a failure: CI must not
pass by skipping the engine.
"""

from __future__ import annotations

import os
from typing import TypeVar
from collections.abc import Callable

import pytest

from manager.errors import EngineError

T = TypeVar("T")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(what: str, build: Callable[[], T]) -> T:
    try:
        return build()
    except EngineError as exc:
        if in_ci():
            pytest.fail(f"CI: {what} could not be set up: {exc}")
        pytest.skip(f"{what} not available here: {exc}")
