"""CPU tests of the sm70-w4-gemm launcher (files/sm70_w4_kernels.py): the moe_align_block_size layout it builds when
vLLM's op is not at hand, its shape/dtype refusals, and the decode path's split of K."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from manager.errors import BuildError
from tests.kernels.w4_launcher import w4_launcher


@pytest.mark.parametrize("tokens,top_k,experts,block", [(1, 8, 128, 16), (7, 2, 4, 16), (300, 8, 128, 64)])
def test_moe_align_groups_every_routed_row_once_in_blocks_of_one_expert(tokens, top_k, experts, block):
    mod = w4_launcher()
    ids = torch.stack([torch.randperm(experts, generator=torch.Generator().manual_seed(t))[:top_k]
                       for t in range(tokens)]).to(torch.int32)
    sorted_ids, expert_ids, num_post = mod.moe_align(ids, block, experts)
    total = int(num_post.item())
    assert total % block == 0 and expert_ids.numel() == total // block
    flat = ids.flatten()
    real = sorted_ids[:total]
    valid = real[real < flat.numel()]
    assert sorted(valid.tolist()) == list(range(flat.numel()))
    for b in range(total // block):
        rows = real[b * block:(b + 1) * block]
        rows = rows[rows < flat.numel()].long()
        assert rows.numel() > 0 and (flat[rows] == expert_ids[b]).all()
    assert set(expert_ids.tolist()) == set(flat.unique().tolist())   # no block for an empty expert


def test_gemm_refuses_k_not_a_multiple_of_32_and_wrong_scale_dtypes():
    mod = w4_launcher()
    k = mod.W4Kernels({}, num_sms=132)
    x = torch.zeros((1, 48), dtype=torch.float16)
    with pytest.raises(BuildError, match="multiple of 32"):
        k.gemm(x, torch.zeros((4, 6), dtype=torch.int32), torch.zeros((4, 2), dtype=torch.float16), "int4", k=48, group=32)
    x = torch.zeros((1, 64), dtype=torch.float16)
    with pytest.raises(BuildError, match="float8_e4m3fn"):
        k.gemm(x, torch.zeros((4, 32), dtype=torch.uint8), torch.zeros((4, 4), dtype=torch.float16), "fp4", k=64,
               group=16, gscale=torch.ones(1))
    with pytest.raises(BuildError, match="NVFP4 groups are 16"):
        k.gemm(x, torch.zeros((4, 32), dtype=torch.uint8), torch.zeros((4, 2)).to(torch.float8_e4m3fn), "fp4", k=64,
               group=32, gscale=torch.ones(1))
    with pytest.raises(BuildError, match="zero points"):
        k.gemm(x, torch.zeros((4, 8), dtype=torch.int32), torch.zeros((4, 2), dtype=torch.float16), "int4zp", k=64,
               group=32)


def test_decode_splits_k_in_whole_chunks_until_the_grid_fills_the_gpu_and_prefill_never_splits():
    mod = w4_launcher()
    k = mod.W4Kernels({}, num_sms=132)
    bk = mod.CHUNK_K["decode"]
    split = k.pick_split("decode", 2816, 8 * 22)      # one token: 8 experts x 22 column tiles of gate_up
    assert split % bk == 0 and 1 < -(-2816 // split) <= -(-2816 // bk)
    assert k.pick_split("decode", 2816, 10_000) >= 2816   # a full grid: no split
    assert k.pick_split("prefill", 704, 8) >= 704


def test_manifest_entries_are_exactly_the_sources_entry_points_with_one_parameter_list():
    import re

    from manager.kernels.spec import load_kernels_spec
    from tests.kernels.w4_launcher import W4_DIR

    spec = load_kernels_spec(W4_DIR)
    src = (W4_DIR / "csrc" / "w4_gemm.cu").read_text()
    in_source = re.findall(r"^W4(?:_GEMV|_DEQUANT|_MOE_DOWN|_MOE_DOWN_PIPE)?_ENTRY\((\w+),", src, flags=re.M)
    declared = [e.name for s in spec.sources for e in s.entries]
    assert sorted(in_source) == sorted(declared)
    params = {tuple((p.type, p.name) for p in e.params) for s in spec.sources for e in s.entries}
    wmma = {tuple((p.type, p.name) for p in e.params) for s in spec.sources for e in s.entries
            if e.name.startswith("w4_gemm_")}
    assert len(wmma) == 1 and len(next(iter(wmma))) == 19
    deq = {tuple((p.type, p.name) for p in e.params) for s in spec.sources for e in s.entries
           if e.name.startswith("w4_dequant_")}
    assert [n for _t, n in next(iter(deq))] == ["out", "w", "scales", "zeros", "gscale", "n", "k", "group"]
    assert sorted(e for e in declared if e.startswith("w4_dequant_")) == [f"w4_dequant_{f}" for f in
                                                                          ("fp4", "int4", "int4zp")]
    down = {tuple((p.type, p.name) for p in e.params) for s in spec.sources for e in s.entries
            if e.name.startswith("w4_moe_down_")}   # test_w4_moe_down.py checks its parameter names
    assert len(down) == 1
    gemv = params - wmma - deq - down   # the GEMV decode entries: k_split replaced by (act, bm)
    assert len(gemv) == 1 and next(iter(gemv))[:18] == next(iter(wmma))[:18]
    assert [n for _t, n in next(iter(gemv))[18:]] == ["act", "bm"]
    mod = w4_launcher()
    for variant, (path, _tile, _bk) in mod.VARIANTS.items():
        for fmt in ("int4", "fp4"):
            assert f"w4_gemm_{fmt}_{path}_{variant}" in declared


def test_sources_compile_to_compute_70_ptx_declaring_every_entry(tmp_path):
    from manager.kernels import builder
    from tests.helpers import SHIPPED_OVERLAYS
    from tests.helpers.nvrtc12 import nvrtc12_lib

    result = builder.build(SHIPPED_OVERLAYS, ["sm70-w4-gemm"], archs=["compute_70"], cache=tmp_path,
                           nvrtc_path=str(nvrtc12_lib()), progress=False)
    ptx = [i for i in result.items if i.kind == "ptx"]
    assert len(ptx) == 1 and ptx[0].arch == "compute_70"
    text = open(ptx[0].path).read()
    from manager.kernels.spec import load_kernels_spec
    from tests.kernels.w4_launcher import W4_DIR

    for s in load_kernels_spec(W4_DIR).sources:
        for e in s.entries:
            assert f".visible .entry {e.name}(" in text
    assert ".local" not in text   # no spilled arrays in the PTX (register-indexed fragments only)
