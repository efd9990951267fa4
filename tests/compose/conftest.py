"""The real-engine compose set-up, built once per session and shared by the file-mode and memory-mode modules
(tests/compose/test_cpu_deployment_real_engine.py, tests/compose/test_memory_deployment_real_engine.py): the engine
venv, the runtime image, the tiny checkpoints and their references, the catalog, the renderings and the bundle."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def cpu_engine_stack(tmp_path_factory):
    from tests.compose.test_cpu_deployment_real_engine import build_stack

    return build_stack(tmp_path_factory)
