"""benchmarks/triton_anchor.py: vLLM 0.20.0's unified_attention staged alone (two sdist files + stubs)."""

from __future__ import annotations

import ast
import hashlib
import importlib.util

import pytest

from tests.helpers import BENCHMARKS


def _load():
    spec = importlib.util.spec_from_file_location("triton_anchor_under_test", BENCHMARKS / "triton_anchor.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.network
def test_stage_copies_the_pinned_files_and_stubs_every_vllm_name_they_import(tmp_path):
    ta = _load()
    root = ta.stage(tmp_path / "anchor")
    for rel, sha in ta.FILES.items():
        assert hashlib.sha256((root / rel).read_bytes()).hexdigest() == sha
    staged = {rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".") for rel in [*ta.FILES, *ta.STUBS]}
    for rel in ta.FILES:
        tree = ast.parse((root / rel).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vllm"):
                assert node.module in staged, (rel, node.module)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("vllm"):
                        assert alias.name in staged, (rel, alias.name)
    for rel in ta.STUBS:
        compile((root / rel).read_text(), rel, "exec")
