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


# The measured-but-not-committed prefill designs of docs/kernels.md (issue 17 point 3): -DPREFILL_ALT
# builds of the same source, as benchmarks/kernel_variants.py makes them.
PREFILL_ALT_BUILDS = {
    "rq256": ["-DPREFILL_ALT"],
    "rq32x16": ["-DPREFILL_ALT", "-DPREFILL_CHUNK=16"],
    "b16x2": ["-DPREFILL_ALT", "-DPREFILL_BM=16", "-DPREFILL_CHUNK=16", "-DPREFILL_QREG=0", "-DPREFILL_STAGE1=0",
              "-DPREFILL_MINB=2"],
    "b16x2q": ["-DPREFILL_ALT", "-DPREFILL_BM=16", "-DPREFILL_CHUNK=16", "-DPREFILL_MINB=2"],
}


@pytest.mark.parametrize("label", sorted(PREFILL_ALT_BUILDS))
def test_prefill_alternative_designs_compile_with_their_block_size(nv, label):
    spec = load_kernels_spec(D512)
    headers = {h.split("/")[-1]: (D512 / h).read_text() for h in spec.headers}
    src = "csrc/prefill_d512.cu"
    ptx = nvrtc.compile_source(nv, (D512 / src).read_text(), src, "compute_70",
                               spec.options + PREFILL_ALT_BUILDS[label], headers).image.decode()
    assert re.search(r"\.entry prefill_d512\(", ptx)
    assert re.search(r"\.maxntid 256, 1, 1", ptx)
    assert "wmma.mma.sync.aligned" in ptx


def test_prefill_default_build_is_the_measured_512_thread_winner(compiled, nv):
    """512 threads; the rescale skip (one barrier with an OR reduction); and the same PTX as a build with
    the winning options spelled out (the one measured on the H200), not the one with them off."""
    spec, out = compiled
    ptx = out[("csrc/prefill_d512.cu", "compute_70")].image
    assert re.search(r"\.maxntid 512, 1, 1", ptx.decode())
    assert ptx.decode().count("bar.red.or.pred") == 1
    headers = {h.split("/")[-1]: (D512 / h).read_text() for h in spec.headers}
    src = "csrc/prefill_d512.cu"

    def build(flags):
        return nvrtc.compile_source(nv, (D512 / src).read_text(), src, "compute_70", spec.options + flags, headers).image

    assert build(["-DPREFILL_SADDR=1", "-DPREFILL_SKIP_RESCALE=1", "-DPREFILL_OFF32=1", "-DPREFILL_S2ACC=0"]) == ptx
    assert build(["-DPREFILL_SADDR=0", "-DPREFILL_SKIP_RESCALE=0", "-DPREFILL_OFF32=0"]) != ptx


def test_prefill_alternative_shape_that_does_not_fit_is_a_compile_error(nv):
    spec = load_kernels_spec(D512)
    headers = {h.split("/")[-1]: (D512 / h).read_text() for h in spec.headers}
    src = "csrc/prefill_d512.cu"
    with pytest.raises(BuildError, match="static assertion"):   # 1024 threads: 32 warps, k-steps 1, 1 column/thread
        nvrtc.compile_source(nv, (D512 / src).read_text(), src, "compute_70",
                             spec.options + ["-DPREFILL_ALT", "-DPREFILL_THREADS=1024", "-DPREFILL_BM=16",
                                             "-DPREFILL_CHUNK=16"], headers)
