"""`overlay build`'s library: content-addressed cache behaviour (cold, warm, corrupt, concurrent)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from manager.errors import BuildError
from manager.kernels import builder
from manager.kernels.spec import KernelsSpec
from tests.helpers import SHIPPED_OVERLAYS
from tests.helpers.nvrtc12 import nvrtc12_lib

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def lib() -> str:
    return str(nvrtc12_lib())


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    """A private copy of the d512 overlay (tests may edit its sources)."""
    dest = tmp_path / "overlays" / "sm70-d512-attention"
    shutil.copytree(SHIPPED_OVERLAYS / "sm70-d512-attention", dest)
    return tmp_path / "overlays"


def _build(catalog: Path, cache: Path, lib: str, **kw):
    return builder.build(catalog, ["sm70-d512-attention"], cache=cache, nvrtc_path=lib, progress=False, **kw)


@pytest.fixture(scope="module")
def cold(tmp_path_factory, lib):
    """One cold build of the shipped overlay (the family's 28 entry points take ~20 s to compile),
    shared by the tests: each starts from a copy of its cache (`warm_copy`)."""
    cat = tmp_path_factory.mktemp("cat") / "overlays"
    shutil.copytree(SHIPPED_OVERLAYS / "sm70-d512-attention", cat / "sm70-d512-attention")
    cache = tmp_path_factory.mktemp("cold") / "c"
    return _build(cat, cache, lib), cache


def _warm_copy(cold, tmp_path: Path) -> Path:
    _, cache = cold
    shutil.copytree(cache, tmp_path / "c")
    return tmp_path / "c"


def test_cold_build_compiles_ptx_and_cubin_per_source_and_writes_the_index(cold):
    r, cache = cold
    assert r.compiled == 4
    assert sorted((i.arch, i.kind) for i in r.items) == [("compute_70", "ptx")] * 2 + [("sm_70", "cubin")] * 2
    index = json.loads((cache / "index" / "sm70-d512-attention.json").read_text())
    assert {o["key"] for o in index["objects"]} == {i.key for i in r.items}
    assert KernelsSpec.model_validate(index["spec"]).sources[0].path == "csrc/paged_decode.cu"
    for i in r.items:
        assert Path(i.path).is_file() and i.key in i.path


def test_warm_build_compiles_nothing(catalog, tmp_path, lib, capsys, cold):
    from manager.cli.build import ConsoleProgress

    _warm_copy(cold, tmp_path)
    r = builder.build(catalog, ["sm70-d512-attention"], cache=tmp_path / "c", nvrtc_path=lib, progress=ConsoleProgress())
    assert r.compiled == 0 and all(i.action == "cached" for i in r.items)
    assert "0 compilations" in builder.summary(r)  # the line `overlay build` prints (tests/cli/test_build.py)
    assert "cached" in capsys.readouterr().err  # the CLI's progress lines; the builder itself prints nothing


def test_corrupted_object_is_detected_and_rebuilt(catalog, tmp_path, lib, cold):
    first = _build(catalog, _warm_copy(cold, tmp_path), lib)
    victim = next(i for i in first.items if i.kind == "cubin")
    data = bytearray(Path(victim.path).read_bytes())
    data[100] ^= 0xFF
    Path(victim.path).write_bytes(bytes(data))
    r = _build(catalog, tmp_path / "c", lib)
    actions = {i.key: i.action for i in r.items}
    assert actions[victim.key] == "rebuilt"
    assert sum(a == "cached" for a in actions.values()) == 3
    assert Path(victim.path).read_bytes() != bytes(data)


def test_truncated_meta_counts_as_corrupt(catalog, tmp_path, lib, cold):
    first = _build(catalog, _warm_copy(cold, tmp_path), lib)
    (Path(first.items[0].path).parent / "meta.json").write_text("{")
    r = _build(catalog, tmp_path / "c", lib)
    assert r.compiled == 1


def test_source_edit_changes_only_that_sources_keys(catalog, tmp_path, lib, cold):
    first = _build(catalog, _warm_copy(cold, tmp_path), lib)
    src = catalog / "sm70-d512-attention" / "csrc" / "prefill.cu"
    src.write_text(src.read_text() + "\n// touched\n")
    r = _build(catalog, tmp_path / "c", lib)
    changed = {(i.source, i.action) for i in r.items}
    assert changed == {("csrc/prefill.cu", "compiled"), ("csrc/paged_decode.cu", "cached")}
    assert {i.key for i in r.items} != {i.key for i in first.items}


def test_header_edit_changes_every_key(catalog, tmp_path, lib, cold):
    _warm_copy(cold, tmp_path)
    hdr = catalog / "sm70-d512-attention" / "csrc" / "attn_common.cuh"
    hdr.write_text(hdr.read_text() + "\n// touched\n")
    assert _build(catalog, tmp_path / "c", lib).compiled == 4


def test_arch_option_gives_lowest_virtual_ptx_plus_a_cubin_per_real_arch(catalog, tmp_path, lib, cold):
    r = _build(catalog, _warm_copy(cold, tmp_path), lib, archs=["sm_75", "sm_70"])
    assert sorted({i.arch for i in r.items}) == ["compute_70", "sm_70", "sm_75"]


def test_resolve_archs_rejects_garbage():
    spec = KernelsSpec.model_validate({"sources": [{"path": "a.cu", "entries": [{"name": "k", "params": []}]}]})
    with pytest.raises(BuildError, match="--arch 'volta'"):
        builder.resolve_archs(spec, ["volta"])
    assert builder.resolve_archs(spec, ["compute_80"]) == ["compute_80"]


def test_cache_key_depends_on_every_input():
    base = dict(source_text="s", headers={"h": "x"}, options=["-a"], compiler="nvrtc 12.9", arch="sm_70")
    k0 = builder.cache_key(**base)
    for field, value in [("source_text", "t"), ("headers", {"h": "y"}), ("options", ["-b"]),
                         ("compiler", "nvrtc 12.8"), ("arch", "compute_70")]:
        assert builder.cache_key(**{**base, field: value}) != k0, field
    assert builder.cache_key(**base) == k0


def test_unknown_or_kernel_less_overlay_is_a_builderror(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "overlay.yaml").write_text("id: plain\n")
    with pytest.raises(BuildError, match="no kernels: section"):
        builder.build(tmp_path, ["plain"], cache=tmp_path / "c", progress=False)
    with pytest.raises(BuildError, match="overlay 'nope'"):
        builder.build(tmp_path, ["nope"], cache=tmp_path / "c", progress=False)


def test_no_ids_builds_every_kernel_overlay_only(catalog, tmp_path, lib, cold):
    (catalog / "plain").mkdir()
    (catalog / "plain" / "overlay.yaml").write_text("id: plain\n")
    r = builder.build(catalog, None, cache=_warm_copy(cold, tmp_path), nvrtc_path=lib, progress=False)
    assert {i.overlay for i in r.items} == {"sm70-d512-attention"}
