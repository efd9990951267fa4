"""gemma4-unified-port (issue 11, point 2): Gemma4UnifiedForConditionalGeneration on vLLM < 0.24.0.

On the real release sdists: status per release (pending where the release lacks the model, `upstream`
from 0.24.0); applied on 0.19.1, 0.20.0 and 0.22.0 the copied module is byte-for-byte vLLM 0.24.0's file (sha256
pinned in the manifest, read through manager/releases.py), every `from vllm...` import it makes resolves
to a definition in that older release, the registrations land once, revert restores every byte; a
wrong pin refuses to apply and writes nothing. fits() passes engine-family through the port.
"""

from __future__ import annotations

import ast
import hashlib
import shutil
from pathlib import Path

import pytest
import yaml

from manager.catalog import Catalog
from manager.errors import OverlayError, ReleaseError
from manager.fits import build_index, fits
from manager.overlays import apply, load_overlays, revert, status, status_on_release
from manager.profiles import load_profiles
from manager.releases import release_file
from tests.helpers import REPO_ROOT
from tests.helpers.catalogs import set_edit_field, shipped_catalog

PORT = "gemma4-unified-port"
MODEL_PY = "vllm/model_executor/models/gemma4_unified.py"
TARGETS = (MODEL_PY, "vllm/model_executor/models/gemma4_mm.py", "vllm/model_executor/models/registry.py",
           "vllm/transformers_utils/model_arch_config_convertor.py", "vllm/model_executor/models/config.py")
STATUS = {"0.19.1": "pending", "0.20.0": "pending", "0.22.0": "pending", "0.24.0": "upstream", "0.27.1": "upstream", "0.28.0": "upstream"}
PIN = yaml.safe_load((REPO_ROOT / "overlays" / PORT / "overlay.yaml").read_text())["edits"][0]


def _root(pristine_release, version: str, dest: Path) -> Path:
    src = pristine_release(version)
    for info in src.glob("vllm-*.dist-info"):
        shutil.copytree(info, dest / info.name)
    for rel in TARGETS[1:]:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, dest / rel)
        (dest / rel).chmod(0o644)
    return dest


@pytest.mark.parametrize("version", sorted(STATUS))
def test_status_on_real_releases(version, pristine_release):
    tree = pristine_release(version)
    native = (tree / MODEL_PY).is_file() and '"Gemma4UnifiedForConditionalGeneration"' in (
        tree / "vllm/model_executor/models/registry.py").read_text()
    assert native == (STATUS[version] == "upstream"), "the matrix must follow the release's own sources"
    rep = status_on_release(version, Catalog(REPO_ROOT), ids=[PORT])
    assert rep.by_id(PORT).status == STATUS[version]


def test_pinned_file_is_vllm_0_24_0s_module(pristine_release):
    data = release_file(PIN["release"], PIN["path"], PIN["sha256"])
    assert data == (pristine_release("0.24.0") / MODEL_PY).read_bytes()
    assert hashlib.sha256(data).hexdigest() == PIN["sha256"]
    assert not (REPO_ROOT / "overlays" / PORT / "files").exists(), "upstream code is never vendored"


def test_release_file_refuses_a_wrong_sha256():
    with pytest.raises(ReleaseError, match="does not match the pinned"):
        release_file("0.24.0", MODEL_PY, "0" * 64)


def _module_level(tree: ast.Module):
    """Statements that run at import time at module level (through if/try blocks, not into defs)."""
    todo = list(tree.body)
    while todo:
        n = todo.pop(0)
        yield n
        if isinstance(n, (ast.If, ast.Try)):
            todo += n.body + n.orelse + getattr(n, "finalbody", []) + [s for h in getattr(n, "handlers", []) for s in h.body]


def _defines(tree: ast.Module, name: str) -> bool:
    for n in _module_level(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name:
            return True
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets):
            return True
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == name:
            return True
        if isinstance(n, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name.split(".")[0]) == name for a in n.names):
            return True
    return False


def unresolved_vllm_imports(root: Path, module_rel: str, fallback: Path | None = None) -> list[str]:
    """`from vllm.x import y` / `from .x import y` of a module whose y is not defined in the sources
    (root's files first, then the pristine release's `fallback` tree for the files root lacks)."""
    out = []
    for n in ast.parse((root / module_rel).read_text()).body:
        if not isinstance(n, ast.ImportFrom):
            continue
        mod = n.module or ""
        if n.level:
            mod = "vllm.model_executor.models" + (f".{mod}" if mod else "")
        if not mod.startswith("vllm"):
            continue
        path = None
        for tree_root in [root] + ([fallback] if fallback else []):
            base = tree_root / mod.replace(".", "/")
            for cand in (base.with_suffix(".py"), base / "__init__.py"):
                if path is None and cand.is_file():
                    path = cand
        if path is None:
            out.append(mod)
            continue
        tree = ast.parse(path.read_text())
        out += [f"{mod}.{a.name}" for a in n.names if not _defines(tree, a.name)]
    return out


@pytest.mark.parametrize("version", ["0.19.1", "0.20.0", "0.22.0"])
def test_apply_on_an_older_release_ports_the_module_and_its_registrations(version, pristine_release, tmp_path):
    root = _root(pristine_release, version, tmp_path / "site")
    before = {rel: (root / rel).read_bytes() for rel in TARGETS[1:]}
    if version in ("0.19.1", "0.20.0"):  # the helper the module imports is what the port adds to gemma4_mm there
        assert unresolved_vllm_imports(pristine_release(version), "vllm/model_executor/models/gemma4_mm.py") == []
    fallback = pristine_release(version)
    overlays = load_overlays(shipped_catalog(tmp_path / "cat", ids=[PORT]))
    result = apply(overlays, root)
    assert result.statuses.by_id(PORT).status == "applied"
    text = (root / MODEL_PY).read_text()
    first, _, body = text.partition("\n")
    assert first.startswith(f"# overlay:{PORT} v1 unified-model ") and "release=0.24.0" in first
    assert hashlib.sha256(body.encode()).hexdigest() == PIN["sha256"]
    assert unresolved_vllm_imports(root, MODEL_PY, fallback) == []
    for rel in TARGETS:
        compile((root / rel).read_text(), rel, "exec")
    reg = (root / "vllm/model_executor/models/registry.py").read_text()
    assert reg.count('_MULTIMODAL_MODELS["Gemma4UnifiedForConditionalGeneration"] = ("gemma4_unified", '
                     '"Gemma4UnifiedForConditionalGeneration")') == 1
    conv = (root / "vllm/transformers_utils/model_arch_config_convertor.py").read_text()
    assert 'MODEL_ARCH_CONFIG_CONVERTORS["gemma4_unified"] = Gemma4ModelArchConfigConvertor' in conv
    assert 'MODEL_ARCH_CONFIG_CONVERTORS["gemma4_unified_text"] = Gemma4ModelArchConfigConvertor' in conv
    cfg = (root / "vllm/model_executor/models/config.py").read_text()
    assert 'MODELS_CONFIG_MAP["Gemma4UnifiedForConditionalGeneration"] = Gemma4Config' in cfg
    # applying again changes nothing; revert restores every byte and removes the copied module
    assert apply(overlays, root).changes == () or not apply(overlays, root).changes
    revert(overlays, overlays, root)
    assert not (root / MODEL_PY).exists()
    assert {rel: (root / rel).read_bytes() for rel in TARGETS[1:]} == before


def test_unresolved_import_check_sees_what_0_20_0_lacks(pristine_release, tmp_path):
    """The static check is not vacuous: on stock 0.20.0 (no helper) the 0.24.0 module has one import gap."""
    root = _root(pristine_release, "0.20.0", tmp_path / "site")
    (root / MODEL_PY).write_bytes(release_file(PIN["release"], PIN["path"], PIN["sha256"]))
    # _SUPPORTED_SOFT_TOKENS is only a function local there: a real import fails on it (seen 2026-11-30)
    assert unresolved_vllm_imports(root, MODEL_PY, pristine_release("0.20.0")) == [
        "vllm.model_executor.models.gemma4_mm._SUPPORTED_SOFT_TOKENS",
        "vllm.model_executor.models.gemma4_mm._get_max_soft_tokens"]


def test_a_wrong_pin_refuses_to_apply_and_writes_nothing(pristine_release, tmp_path):
    root = _root(pristine_release, "0.20.0", tmp_path / "site")
    before = {rel: (root / rel).read_bytes() for rel in TARGETS[1:]}
    cat = shipped_catalog(tmp_path / "cat", ids=[PORT], variants={PORT: set_edit_field("unified-model", "sha256", "f" * 64)})
    with pytest.raises(OverlayError, match="does not match the pinned"):
        apply(load_overlays(cat), root)
    assert not (root / MODEL_PY).exists()
    assert {rel: (root / rel).read_bytes() for rel in TARGETS[1:]} == before


def test_a_hand_edited_ported_module_is_modified(pristine_release, tmp_path):
    root = _root(pristine_release, "0.22.0", tmp_path / "site")
    overlays = load_overlays(shipped_catalog(tmp_path / "cat", ids=[PORT]))
    apply(overlays, root)
    p = root / MODEL_PY
    p.write_text(p.read_text().replace("import math", "import math  # edited", 1))
    assert status(overlays, root).by_id(PORT).status == "modified"


@pytest.fixture(scope="module")
def P():
    return load_profiles(Catalog(REPO_ROOT))


def test_fits_12b_engine_family_passes_through_the_port_only_where_it_is_pending(P):
    idx = build_index(Catalog(REPO_ROOT))
    # an image of vLLM 0.22.0 with a transformers that has gemma4_unified (the stock profile's 5.8.1 has not)
    e = P.engines["vllm-0.22.0"].model_copy(update={"id": "vllm-0.22.0-tf5.24", "transformers_version": "5.24.0"})
    P.engines[e.id] = e
    try:
        r = fits(P, model="gemma-4-12b", hardware="rtx-3090", engine=e.id, overlay_index=idx)
    finally:
        del P.engines[e.id]
    c = r.constraint("engine-family")
    assert c.result == "pass" and PORT in c.message and PORT in r.overlays
    assert "gemma4-convertor-per-layer" in r.overlays  # transformers >= 5.15 on 0.22.0
    c = fits(P, model="gemma-4-12b", hardware="rtx-3090", engine="vllm-0.22.0", overlay_index=idx).constraint("engine-family")
    assert c.result == "fail" and ">= 5.10.0" in c.message
    r = fits(P, model="gemma-4-12b", hardware="rtx-3090", engine="vllm-0.28.0", overlay_index=idx)
    assert r.constraint("engine-family").result == "pass" and PORT not in r.overlays
    # vllm-0.20.0 ships transformers 5.6.2 (unverified): no gemma4_unified configs before 5.10.0
    c = fits(P, model="gemma-4-12b", hardware="rtx-3090", engine="vllm-0.20.0", overlay_index=idx).constraint("engine-family")
    assert c.result == "fail" and ">= 5.10.0" in c.message
    # the V100 deployment: the family is ported; the NVFP4 weights load there only through the shipped kernel overlay
    # sm70-w4-gemm (its refusal without the overlay: tests/fits/test_fits.py, NO_W4)
    r = fits(P, model="gemma-4-12b", weights="nvfp4", hardware="v100-sxm2-16gb", gpus=2, engine="vllm-0.19.1-sm70",
             kv_dtype="float16", overlay_index=idx)
    # the V100 engine ships transformers 5.24.0, which has gemma4_unified (>= 5.10.0): never the transformers limit
    assert ">= 5.10.0" not in r.constraint("engine-family").message
    wf = r.constraint("weight-format")
    assert wf.result == "pass" and "through the kernel overlay sm70-w4-gemm" in wf.message
    assert "sm70-w4-gemm" in r.overlays and PORT in r.overlays and r.verdict != "fails"


def test_bundle_carries_the_release_files_and_the_image_needs_no_network(tmp_path, monkeypatch):
    from manager.compose.bundle import WRAPPER, _copy_release_files

    got = _copy_release_files(Catalog(REPO_ROOT), tmp_path / "release-files")
    assert got == [PIN["sha256"]]
    data = (tmp_path / "release-files" / PIN["sha256"]).read_bytes()
    assert hashlib.sha256(data).hexdigest() == PIN["sha256"]
    assert 'OVERLAY_RELEASE_FILES="${OVERLAY_RELEASE_FILES:-$here/release-files}"' in WRAPPER
    # inside an image: an empty cache and no sdist; the carried copy is used, nothing is downloaded
    monkeypatch.setenv("OVERLAY_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("OVERLAY_RELEASE_FILES", str(tmp_path / "release-files"))
    assert release_file(PIN["release"], PIN["path"], PIN["sha256"]) == data
    assert not (tmp_path / "empty-cache" / "sdists").exists()


# vLLM 0.20.0's import-time dependencies that the test venv lacks (found by importing the ported module
# until it imported, 2026-11-30), installed --no-deps into a cached --target directory, not into the venv.
IMPORT_DEPS = ["aiohappyeyeballs==2.7.1", "aiohttp==3.14.5", "aiosignal==1.4.0", "cachetools==8.0.2", "cbor2==6.3.0", "einops==0.8.2", "frozenlist==1.8.0", "gguf==0.19.0", "multidict==7.2.1", "openai==3.57.0", "openai_harmony==0.0.8", "pillow==13.0.0", "propcache==0.5.4", "psutil==7.2.2", "pybase64==1.5.1", "pyzmq==27.3.0", "sniffio==1.3.1", "yarl==1.25.1"]
IMPORT_PORTED = ("import vllm.model_executor.models.gemma4_unified as m; "
                 "print('IMPORTED', m.Gemma4UnifiedForConditionalGeneration.__mro__[1].__module__)")


def _import_deps() -> Path:
    import subprocess
    import sys

    from filelock import FileLock

    from manager.releases import cache_dir

    dest = cache_dir() / "import-deps-0.20.0"
    with FileLock(str(dest) + ".lock"):
        if not (dest / ".ready").exists():
            shutil.rmtree(dest, ignore_errors=True)
            proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(dest),
                                   *IMPORT_DEPS], capture_output=True, text=True)
            if proc.returncode:
                pytest.skip(f"cannot install vLLM 0.20.0's import dependencies: {proc.stderr.strip()[-200:]}")
            (dest / ".ready").write_text("ok\n")
    return dest


@pytest.mark.network
@pytest.mark.parametrize("version", ["0.19.1", "0.20.0"])  # 0.19.1: the V100 engine (issue 24); the same deps suffice
def test_ported_module_really_imports_on_an_older_release(version, pristine_release, tmp_path):
    """A real `import` of the ported module on the full 0.19.1 / 0.20.0 package (CPU torch, the venv's
    transformers): stock release plus the copied file alone fails on the names it lacks; with the overlay it imports."""
    import os
    import subprocess
    import sys

    pytest.importorskip("torch")
    from manager.releases import copy_release

    deps = _import_deps()
    root = copy_release(version, tmp_path / "site")
    env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{deps}", VLLM_TARGET_DEVICE="cpu")

    def run():
        return subprocess.run([sys.executable, "-c", IMPORT_PORTED], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=600)

    (root / MODEL_PY).write_bytes(release_file(PIN["release"], PIN["path"], PIN["sha256"]))
    bare = run()
    assert bare.returncode != 0 and "cannot import name '_SUPPORTED_SOFT_TOKENS'" in bare.stderr
    (root / MODEL_PY).unlink()
    apply(load_overlays(shipped_catalog(tmp_path / "cat", ids=[PORT])), root)
    ported = run()
    assert ported.returncode == 0, ported.stderr[-2000:]
    assert "IMPORTED vllm.model_executor.models.gemma4_mm" in ported.stdout
