"""manager.upstream.testfiles on the real sdists: the test tree, the static picking of test files by what they
import, and the example-model entry copied (hash-checked) from the later release that ships the architecture."""

from __future__ import annotations

import ast
import hashlib
import subprocess

import pytest

from manager.errors import UpstreamError
from manager.upstream import testfiles
from manager.upstream.testfiles import ExampleEntry, add_example_models, module_name, select_files, sdist_tests

pytestmark = pytest.mark.network  # PyPI, the first time only (sdists are cached)

REGISTRY_TESTS = "tests/models/test_registry.py"
UNIFIED = "Gemma4UnifiedForConditionalGeneration"
# tests/models/registry.py of the vLLM 0.24.0 sdist (the first release registering the architecture; 0.21.0 and
# 0.22.0 have no entry for it): the pin overlays/gemma4-unified-port/overlay.yaml carries
SHA_0_24_0 = "6312c51fc85c6dc91638ce1c25bd72f68db7a60206cc148dfbeb7dfcfdb3fd93"


def test_module_name_of_a_target_and_of_a_package_init():
    assert module_name("vllm/model_executor/models/registry.py") == "vllm.model_executor.models.registry"
    assert module_name("vllm/platforms/__init__.py") == "vllm.platforms"


def test_the_sdist_test_tree_holds_tests_and_pyproject_and_is_cached():
    root = sdist_tests("0.20.0")
    assert (root / "tests" / "conftest.py").is_file() and (root / "pyproject.toml").is_file()
    assert (root / REGISTRY_TESTS).is_file()
    assert not (root / "vllm").exists()  # the engine's package comes from the engine, not from the sdist
    assert sdist_tests("0.20.0") == root


@pytest.mark.parametrize("version", ["0.19.1", "0.20.0"])
def test_files_are_picked_by_their_imports_direct_and_through_a_package_init(version, pristine_release):
    tree, engine = sdist_tests(version), pristine_release(version)
    picked = {p.path: p for p in select_files(tree, {
        "reg": ["vllm/model_executor/models/registry.py"],
        "conv": ["vllm/transformers_utils/model_arch_config_convertor.py"],
        "none": ["vllm/model_executor/models/gemma4_unified.py"],  # a ported file: no release test imports it
    }, engine)}
    assert "tests/models/test_registry.py" in picked and "reg" in picked[REGISTRY_TESTS].overlays
    assert all("none" not in p.overlays for p in picked.values())
    # each picked file really imports the module, or a vllm package whose __init__ imports it at module level
    for p in picked.values():
        text = (tree / p.path).read_text()
        assert hashlib.sha256(text.encode()).hexdigest() == p.sha256
        if "conv" in p.overlays:
            assert "model_arch_config_convertor" in text or "transformers_utils" in text, p.path
    # a file that imports neither is not picked: the registry's test module imports nothing of the convertor
    assert "conv" not in picked[REGISTRY_TESTS].overlays


def test_a_package_init_that_imports_the_target_counts(tmp_path):
    engine = tmp_path / "engine"
    (engine / "vllm" / "pkg").mkdir(parents=True)
    (engine / "vllm" / "__init__.py").write_text("")
    (engine / "vllm" / "pkg" / "__init__.py").write_text("from .target import X\n")
    (engine / "vllm" / "pkg" / "lazy.py").write_text("")
    tree = tmp_path / "tree"
    (tree / "tests").mkdir(parents=True)
    (tree / "tests" / "test_via_pkg.py").write_text("from vllm.pkg import X\n")
    (tree / "tests" / "test_direct.py").write_text("def test():\n    import vllm.pkg.target\n")
    (tree / "tests" / "test_other.py").write_text("from vllm.pkg.lazy import Y\nfrom ..utils import target\n")
    (tree / "tests" / "helper.py").write_text("import vllm.pkg.target\n")  # not a test file
    picked = select_files(tree, {"o": ["vllm/pkg/target.py"]}, engine)
    assert [p.path for p in picked] == ["tests/test_direct.py", "tests/test_via_pkg.py"]


def _linked_tree(tmp_path, version):
    dest = tmp_path / f"tests-{version}"
    subprocess.run(["cp", "-al", str(sdist_tests(version)), str(dest)], check=True)
    return dest


def test_the_example_model_entry_comes_from_0_24_0_into_the_same_dict_of_0_20_0(tmp_path):
    tree = _linked_tree(tmp_path, "0.20.0")
    reg = tree / "tests/models/registry.py"
    cached = sdist_tests("0.20.0") / "tests/models/registry.py"
    before = cached.read_bytes()
    assert UNIFIED not in reg.read_text()
    entry = ExampleEntry(UNIFIED, "0.24.0", "tests/models/registry.py", SHA_0_24_0, "gemma4-unified-port")
    assert add_example_models(tree, [entry]) == [UNIFIED]
    text = reg.read_text()
    found = testfiles._dict_entries(ast.parse(text))
    assert found[UNIFIED][0] == "_MULTIMODAL_EXAMPLE_MODELS"
    assert '"google/gemma-4-12B-it"' in text and "is_available_online=False" in text
    assert cached.read_bytes() == before and reg.stat().st_ino != cached.stat().st_ino  # the cache is untouched
    assert add_example_models(tree, [entry]) == []  # already there: left alone


def test_an_example_model_file_with_another_hash_is_refused_before_anything_changes(tmp_path):
    tree = _linked_tree(tmp_path, "0.20.0")
    reg = tree / "tests/models/registry.py"
    before = reg.read_bytes()
    entry = ExampleEntry(UNIFIED, "0.24.0", "tests/models/registry.py", "0" * 64, "gemma4-unified-port")
    with pytest.raises(UpstreamError, match=r"gemma4-unified-port: upstream_tests.example_models: vLLM 0.24.0 "
                                            r"tests/models/registry.py: sha256 6312c51fc85c6dc9\.\.\. does not match"):
        add_example_models(tree, [entry])
    assert reg.read_bytes() == before


@pytest.mark.parametrize("release", ["0.21.0", "0.22.0"])
def test_releases_before_0_24_0_have_no_example_entry_for_the_unified_architecture(release):
    text = (sdist_tests(release) / "tests/models/registry.py").read_text()
    assert UNIFIED not in testfiles._dict_entries(ast.parse(text))
