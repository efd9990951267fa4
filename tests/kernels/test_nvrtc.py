"""NVRTC 12 (PyPI wheels, cached) compiles every kernel of the d512 overlay for compute_70 and sm_70."""

from __future__ import annotations

import re

import pytest

from manager.errors import BuildError
from manager.kernels import nvrtc
from manager.kernels.spec import load_kernels_spec
from tests.helpers import SHIPPED_OVERLAYS
from tests.helpers.nvrtc12 import nvrtc12_lib

pytestmark = pytest.mark.network

D512 = SHIPPED_OVERLAYS / "sm70-d512-attention"


@pytest.fixture(scope="module")
def nv():
    return nvrtc.find_nvrtc(str(nvrtc12_lib()), arch="compute_70")


@pytest.fixture(scope="module")
def compiled(nv):
    spec = load_kernels_spec(D512)
    headers = {}
    for h in spec.headers:
        headers[h.split("/")[-1]] = (D512 / h).read_text()
    out = {}
    for src in spec.sources:
        for arch in ("compute_70", "sm_70"):
            out[(src.path, arch)] = nvrtc.compile_source(nv, (D512 / src.path).read_text(), src.path, arch,
                                                         spec.options, headers)
    return spec, out


def test_wheel_nvrtc_is_version_12_with_wheel_headers(nv):
    assert nv.version[0] == 12
    assert any(d.endswith("cuda_runtime/include") for d in nv.include_dirs)


def test_ptx_targets_sm_70_and_uses_wmma_mma(compiled):
    spec, out = compiled
    for src in spec.sources:
        ptx = out[(src.path, "compute_70")].image.decode()
        assert re.search(r"^\.target sm_70\b", ptx, re.M)
        assert "wmma.mma.sync.aligned" in ptx and "m16n16k16" in ptx
        for e in src.entries:
            assert re.search(rf"\.entry {e.name}\(", ptx), e.name


def test_cubin_is_an_elf_for_every_source(compiled):
    spec, out = compiled
    for src in spec.sources:
        img = out[(src.path, "sm_70")]
        assert img.kind == "cubin" and img.image[:4] == b"\x7fELF"
        for e in src.entries:
            assert e.name.encode() in img.image


def test_entry_parameter_counts_match_the_manifest(compiled):
    spec, out = compiled
    for src in spec.sources:
        ptx = out[(src.path, "compute_70")].image.decode()
        for e in src.entries:
            body = re.search(rf"\.entry {e.name}\((.*?)\)", ptx, re.S).group(1)
            assert body.count(".param") == len(e.params), e.name


def test_compile_error_is_a_one_line_builderror(nv):
    with pytest.raises(BuildError, match=r"could not compile bad.cu for compute_70: .*error"):
        nvrtc.compile_source(nv, "extern \"C\" __global__ void k() { undefined_thing(); }\n", "bad.cu", "compute_70")


def test_nvrtc_13_is_refused_for_compute_70(monkeypatch):
    fake = nvrtc.Nvrtc(path="/x/libnvrtc.so.13", version=(13, 0), include_dirs=())
    assert not fake.supports("compute_70") and not fake.supports("sm_70") and fake.supports("sm_90")
    monkeypatch.setattr(nvrtc, "_candidates", lambda explicit: ["/x/libnvrtc.so.13"])
    monkeypatch.setattr(nvrtc, "load", lambda path: fake)
    with pytest.raises(BuildError, match="NVRTC 13.0, which cannot target compute_70"):
        nvrtc.find_nvrtc(arch="compute_70")


def test_missing_explicit_library_is_reported(tmp_path):
    with pytest.raises(BuildError, match="does not exist"):
        nvrtc.find_nvrtc(str(tmp_path / "nope.so"))


def test_directory_holding_the_library_is_accepted():
    nv = nvrtc.find_nvrtc(str(nvrtc12_lib().parent.parent.parent))
    assert nv.version[0] == 12


def test_sources_need_only_the_cuda_runtime_headers(nv):
    """vLLM images have nvidia-cuda-runtime-cu12 (a torch dependency) but not necessarily cccl."""
    import dataclasses

    only_runtime = dataclasses.replace(nv, include_dirs=tuple(d for d in nv.include_dirs if "cuda_runtime" in d))
    assert only_runtime.include_dirs
    spec = load_kernels_spec(D512)
    headers = {h.split("/")[-1]: (D512 / h).read_text() for h in spec.headers}
    for src in spec.sources:
        out = nvrtc.compile_source(only_runtime, (D512 / src.path).read_text(), src.path, "compute_70",
                                   spec.options, headers)
        assert out.kind == "ptx"


def test_every_entry_of_the_family_has_its_block_size(compiled):
    """The PTX of each source holds one entry per (head dim, KV format) with the manifest's block size."""
    spec, out = compiled
    for src in spec.sources:
        ptx = out[(src.path, "compute_70")].image.decode()
        for e in src.entries:
            m = re.search(r"\.entry " + e.name + r"\((.*?)\)\s*\.maxntid (\d+), 1, 1", ptx, re.S)
            assert m, e.name
            assert int(m.group(2)) == e.threads, e.name
            assert m.group(1).count(".param") == len(e.params), e.name
    assert "wmma.mma.sync.aligned" in out[("csrc/prefill.cu", "compute_70")].image.decode()


def test_prefill_default_build_skips_the_rescale_with_one_or_barrier_per_entry(compiled):
    """The measured rescale skip (one barrier with an OR reduction per key chunk) in every prefill entry."""
    spec, out = compiled
    ptx = out[("csrc/prefill.cu", "compute_70")].image.decode()
    entries = [e.name for s in spec.sources if s.path == "csrc/prefill.cu" for e in s.entries]
    assert ptx.count("bar.red.or.pred") == len(entries) == 12
    assert re.search(r"\.maxntid 512, 1, 1", ptx)


def test_a_head_dim_that_does_not_fit_voltas_shared_memory_is_a_compile_error(nv):
    spec = load_kernels_spec(D512)
    headers = {h.split("/")[-1]: (D512 / h).read_text() for h in spec.headers}
    src = "csrc/paged_decode.cu"
    text = (D512 / src).read_text() + "\nstatic_assert(DecodeCfg<1024>::SMEM > 0, \"instantiate\");\n"
    with pytest.raises(BuildError, match="static assertion"):   # 32 keys x 1032 halves x K and V alone: 132 KB
        nvrtc.compile_source(nv, text, src, "compute_70", spec.options, headers)
