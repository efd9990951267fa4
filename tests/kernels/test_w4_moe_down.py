"""CPU tests of the router-direct MoE decode of sm70-w4-gemm (csrc/w4_gemm.cu w4_moe_down, the launcher's moe_down /
moe_direct / DIRECT_VARIANTS): the entries against the manifest and the launcher's tiles, their sm_70 build (registers
and local frames read from the cubin), a numpy replay of the warp transpose-reduce, the coverage of columns, rows and
K, and the launches the launcher makes (no GPU; the GPU tests are in test_w4_gemm_on_gpu.py)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from manager.errors import BuildError
from tests.helpers import SHIPPED_OVERLAYS
from tests.kernels.test_w4_gemv_build import _Recorder, cubin_resources
from tests.kernels.w4_launcher import W4_DIR, W4_SOURCE, w4_launcher

SRC = W4_SOURCE.read_text()
FIELDS = re.search(r"^#define W4_MOE_DOWN_ENTRY\(NAME, ([^)]*)\)", SRC, flags=re.M).group(1).split(", ")
ENTRIES = {line.split(", ")[0]: dict(zip(FIELDS, map(int, line.split(", ")[1:]), strict=True))
           for line in re.findall(r"^W4_MOE_DOWN_ENTRY\((.*)\)$", SRC, flags=re.M)}
# Local frames measured and kept (bytes; docs/kernels.md "Fifteenth lease" and "Sixteenth lease"): the entries with
# four columns in flight at 80 registers (three blocks per SM) hold 24-40 bytes (int4 d8 / d16 48 until both down
# kernels loaded and multiplied through DownGroup); fp4 d8 (eight columns at 128 registers) 8; the n16 entries (two
# columns at four blocks per SM) none.
FRAME_ALLOWED = {"w4_moe_down_fp4_d8": 8, "w4_moe_down_fp4_d16": 40,
                 "w4_moe_down_int4_d8": 24, "w4_moe_down_int4_d16": 24,
                 "w4_moe_down_int4_p8": 24, "w4_moe_down_int4_q16": 24, "w4_moe_down_int4_p16": 32}


def test_entries_are_the_launchers_tiles_for_int4_and_fp4_and_the_manifest_declares_them():
    mod = w4_launcher()
    want = {f"w4_moe_down_{f}_{t}" for f in ("int4", "fp4") for t in mod.MOE_DOWN_TILES}
    assert set(ENTRIES) == want
    fmts = {0: "int4", 2: "fp4"}
    for name, e in ENTRIES.items():
        fmt, tile = name.split("_")[3], name.split("_")[4]
        assert fmts[e["FMT"]] == fmt and e["DT"] == mod.MOE_DOWN_TILES[tile] and e["DT"] % e["CG"] == 0
        assert bool(e["PIPE"]) == (tile in mod.MOE_DOWN_PIPE)
        assert (e["PIPE"] == 2) == tile.startswith("f") and (e["PIPE"] != 2 or e["CG"] == 1)
    manifest = yaml.safe_load((W4_DIR / "overlay.yaml").read_text())
    declared = {en["name"]: en for src in manifest["kernels"]["sources"] for en in src["entries"]}
    for name in want:
        assert declared[name]["threads"] == 256
        assert [p.split()[1] for p in declared[name]["params"]] == [
            "out", "a", "w", "scales", "zeros", "gscale", "topk_ids", "topk_w", "topk", "n", "k", "group", "ld_a"]
    assert set(mod.DIRECT_VARIANTS) == {f"{v}+{t}" for v in mod.GEMV_VARIANTS for t in mod.MOE_DOWN_TILES}


@pytest.fixture(scope="module")
def sm70_cubin(tmp_path_factory) -> bytes:
    from manager.kernels import builder
    from tests.helpers.nvrtc12 import nvrtc12_lib

    result = builder.build(SHIPPED_OVERLAYS, ["sm70-w4-gemm"], archs=["sm_70"], cache=tmp_path_factory.mktemp("kc"),
                           nvrtc_path=str(nvrtc12_lib()), progress=False)
    return Path(next(i.path for i in result.items if i.kind == "cubin" and i.arch == "sm_70")).read_bytes()


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_entry_compiles_for_sm_70_within_its_blocks_per_sm_bound_and_measured_frame(sm70_cubin, entry):
    res = cubin_resources(sm70_cubin)[entry]
    assert 0 < res["regs"] <= 65536 // (256 * ENTRIES[entry]["MINB"])
    assert res.get("frame", 0) == FRAME_ALLOWED.get(entry, 0)


def _transpose_reduce(p: np.ndarray) -> np.ndarray:
    """The kernel's warp_transpose_reduce<CG / 2> and its xor tail, replayed on p [32 lanes, CG] (float64)."""
    p = p.copy()
    cg = p.shape[1]
    lanes = np.arange(32)
    o = cg // 2
    while o >= 1:
        hi = (lanes & o) != 0
        new = p.copy()
        for i in range(o):
            send = np.where(hi, p[:, i], p[:, i + o])
            keep = np.where(hi, p[:, i + o], p[:, i])
            new[:, i] = keep + send[lanes ^ o]
        p = new
        o //= 2
    v = p[:, 0].copy()
    o = cg
    while o < 32:
        v = v + v[lanes ^ o]
        o *= 2
    return v


@pytest.mark.parametrize("cg", sorted({e["CG"] for e in ENTRIES.values()} | {4, 8, 16, 32}))
def test_transpose_reduce_leaves_lane_l_with_the_warp_sum_of_column_l_mod_cg(cg):
    p = np.random.default_rng(cg).standard_normal((32, cg))
    got = _transpose_reduce(p)
    want = p.sum(axis=0)
    assert np.allclose(got, want[np.arange(32) % cg])


@pytest.mark.parametrize("k", [32, 704, 1024, 1056, 2080, 2816])
@pytest.mark.parametrize("top_k", [1, 2, 8, 10])
def test_lanes_and_warps_cover_every_k_of_every_routed_row_exactly_once(k, top_k):
    """Warp w takes rows w, w + 8, ... < top_k; lane l the segments k0 = 32 l, 32 l + 1024, ... < K (the kernel's
    loops), each 32 values of one 16-byte vector."""
    seen = []
    for warp in range(8):
        for kk in range(warp, top_k, 8):
            for lane in range(32):
                for k0 in range(32 * lane, k, 1024):
                    seen.extend((kk, k0 + i) for i in range(32))
    assert sorted(seen) == [(kk, i) for kk in range(top_k) for i in range(k)]


@pytest.mark.parametrize("n", [8, 200, 704, 2816])
@pytest.mark.parametrize("tile", ["d8", "d16", "n16", "p8", "p16", "q16", "f8", "f16"])
def test_column_tiles_and_column_groups_cover_every_output_column_once(n, tile):
    mod = w4_launcher()
    e = ENTRIES[f"w4_moe_down_int4_{tile}"]
    dt, cg = e["DT"], e["CG"]
    cols = [n0 + c0 + lane for n0 in range(0, -(-n // dt) * dt, dt) for c0 in range(0, dt, cg) for lane in range(cg)
            if n0 + c0 + lane < n]
    assert sorted(cols) == list(range(n)) and dt == mod.MOE_DOWN_TILES[tile]


def _moe_tensors(tokens, top_k, fmt="int4"):
    torch = pytest.importorskip("torch")
    x = torch.zeros((tokens, 64), dtype=torch.float16)
    if fmt == "int4":
        w13, s13 = torch.zeros((4, 64, 8), dtype=torch.int32), torch.zeros((4, 64, 2), dtype=torch.float16)
        w2, s2 = torch.zeros((4, 40, 4), dtype=torch.int32), torch.zeros((4, 40, 1), dtype=torch.float16)
        g = {}
    else:
        w13, s13 = torch.zeros((4, 64, 32), dtype=torch.uint8), torch.zeros((4, 64, 4), dtype=torch.float8_e4m3fn)
        w2, s2 = torch.zeros((4, 40, 16), dtype=torch.uint8), torch.zeros((4, 40, 2), dtype=torch.float8_e4m3fn)
        g = {"gscale13": torch.ones(4), "gscale2": torch.ones(4)}
    ids = (torch.arange(tokens * top_k) % 4).reshape(tokens, top_k).to(torch.int64)
    return x, w13, s13, w2, s2, torch.ones((tokens, top_k)), ids, g


@pytest.mark.parametrize("fmt", ["int4", "fp4"])
@pytest.mark.parametrize("variant", ["q4+d16", "r1+d8", "c4+n16"])
def test_fused_moe_with_a_router_direct_variant_launches_gate_up_per_routed_row_then_one_down(fmt, variant):
    torch = pytest.importorskip("torch")
    mod = w4_launcher()
    ks = _Recorder()
    k = mod.W4Kernels(ks, num_sms=132)
    x, w13, s13, w2, s2, tw, ids, g = _moe_tensors(3, 2, fmt)
    out = k.fused_moe(x, w13, s13, w2, s2, tw, ids, fmt, group=16 if fmt == "fp4" else 32, path="decode",
                      decode="gemv", variant=variant, activation="silu", **g)
    up_variant, tile = variant.split("+")
    assert ks.launched == [f"w4_gemv_{fmt}_act_{up_variant}", f"w4_moe_down_{fmt}_{tile}"]
    (_n1, grid1, args1), (_n2, grid2, args2) = ks.calls
    per_block = mod.GEMV_VARIANTS[up_variant] // 2
    assert grid1 == (6, -(-32 // per_block), 1)                      # one block per routed row (3 tokens x top-2)
    assert args1[6] is None and args1[7].dtype == torch.int32        # no sorted_ids; expert_ids = topk_ids
    assert args1[7].tolist() == ids.flatten().tolist() and args1[-1] == 1 and args1[11] == 2   # bm 1, a_div top_k
    dt = mod.MOE_DOWN_TILES[tile]
    assert grid2 == (3, -(-40 // dt), 1)                              # (tokens, column tiles of the hidden size)
    assert args2[1] is args1[0] and args2[6].dtype == torch.int32 and args2[6].shape == (3, 2)
    assert args2[8:13] == [2, 40, 32, 16 if fmt == "fp4" else 32, 32]   # top_k, N, K, group, ld_a
    assert out.shape == (3, 40) and out.dtype == torch.float16


def test_moe_down_refuses_an_unknown_tile_zero_points_and_rows_that_are_not_tokens_times_top_k():
    torch = pytest.importorskip("torch")
    mod = w4_launcher()
    k = mod.W4Kernels(_Recorder(), num_sms=132)
    _x, _w13, _s13, w2, s2, tw, ids, _g = _moe_tensors(3, 2)
    a = torch.zeros((6, 32), dtype=torch.float16)
    with pytest.raises(BuildError, match="down tile 'd64'"):
        k.moe_down(a, w2, s2, "int4", k=32, group=32, topk_ids=ids, topk_w=tw, tile="d64")
    with pytest.raises(BuildError, match="for int4zp"):
        k.moe_down(a, w2, s2, "int4zp", k=32, group=32, topk_ids=ids, topk_w=tw)
    with pytest.raises(BuildError, match="tokens x top_k rows"):
        k.moe_down(a[:5], w2, s2, "int4", k=32, group=32, topk_ids=ids, topk_w=tw)
    with pytest.raises(BuildError, match="router-direct variant 'q4\\+d7'"):
        k.moe_direct(_x, _w13, _s13, w2, s2, tw, ids, "int4", group=32, variant="q4+d7")


def test_needs_align_is_false_only_for_a_router_direct_decode(monkeypatch):
    mod = w4_launcher()
    monkeypatch.delenv(mod.DECODE_ENV, raising=False)
    assert mod.needs_align("decode", "fp4", 8) is False           # auto, one token of top-8: r1+p8
    assert mod.needs_align("decode", "int4", 64) is False         # auto up to AUTO_FEW_ROWS: q4+p16
    assert mod.needs_align("decode", "int4", mod.AUTO_FEW_ROWS + 1) is True   # above it: an aligned GEMV (c4)
    assert mod.needs_align("decode", "int4zp", 8) is True         # WMMA
    assert mod.needs_align("prefill", "fp4", 8) is True
    assert mod.needs_align("decode", "fp4", 8, decode="wmma") is True
    assert mod.needs_align("decode", "fp4", 8, decode="gemv") is True   # a named kernel runs its aligned default
    monkeypatch.setitem(mod.AUTO_DECODE_ONE, "fp4", ("gemv", "r1"))
    assert mod.needs_align("decode", "fp4", 8) is True


@pytest.mark.parametrize("asked", ["p16", "f16", "f8"])
@pytest.mark.parametrize("top_k, k_down, fits", [(8, 32, True), (10, 32, False), (8, 1056, False), (2, 1024, True)])
def test_router_direct_runs_the_unpipelined_tile_where_the_pipelined_one_cannot_take_the_shape(top_k, k_down, fits,
                                                                                             asked):
    """The pipelined and flat tiles hold one routed row per warp and a row's K in 32 segments (top_k <= 8,
    K <= 1024): moe_direct (what auto runs) takes the unpipelined tile of the same width for other shapes; moe_down
    named directly refuses."""
    torch = pytest.importorskip("torch")
    mod = w4_launcher()
    ks = _Recorder()
    k = mod.W4Kernels(ks, num_sms=132)
    x = torch.zeros((2, 64), dtype=torch.float16)
    w13, s13 = torch.zeros((4, 2 * k_down, 8), dtype=torch.int32), torch.zeros((4, 2 * k_down, 2), dtype=torch.float16)
    w2, s2 = torch.zeros((4, 40, k_down // 8), dtype=torch.int32), torch.zeros((4, 40, k_down // 32), dtype=torch.float16)
    ids = (torch.arange(2 * top_k) % 4).reshape(2, top_k)
    k.fused_moe(x, w13, s13, w2, s2, torch.ones((2, top_k)), ids, "int4", group=32, path="decode", decode="gemv",
                variant=f"q4+{asked}", activation="silu")
    tile = asked if fits else mod.MOE_DOWN_PIPE[asked]
    assert tile == asked or tile == {"p16": "n16", "f16": "n16", "f8": "d8"}[asked]
    assert ks.launched == ["w4_gemv_int4_act_q4", f"w4_moe_down_int4_{tile}"]
    if not fits:
        with pytest.raises(BuildError, match="pipelined and flat tiles take top_k <= 8 and K <= 1024"):
            k.moe_down(torch.zeros((2 * top_k, k_down), dtype=torch.float16), w2, s2, "int4", k=k_down, group=32,
                       topk_ids=ids, topk_w=torch.ones((2, top_k)), tile=asked)


@pytest.mark.parametrize("k", [32, 64, 704, 992, 1024])
@pytest.mark.parametrize("dt", [8, 16])
def test_flat_units_cover_every_column_and_segment_of_the_tile_once(dt, k):
    """w4_moe_down_flat's indexing replayed: lane l of pass p takes unit 32 p + l as (column, segment), stepped by
    (32 / S, 32 % S) per pass with one carry instead of a division; the final sum's 32 / DT lanes per column take the
    segments sub, sub + 32 / DT, ...: both cover the tile's DT x S (column, segment) pairs exactly once."""
    segs, units = k // 32, dt * (k // 32)
    cstep, sstep = 32 // segs, 32 - (32 // segs) * segs
    seen = []
    for lane in range(32):
        c, s = lane // segs, lane % segs
        for p in range(dt):
            if 32 * p >= units:
                break
            if 32 * p + lane < units:
                assert (c, s) == divmod(32 * p + lane, segs)
                seen.append((c, s))
            c, s = c + cstep, s + sstep
            if s >= segs:
                c, s = c + 1, s - segs
    tile = [(c, s) for c in range(dt) for s in range(segs)]
    assert sorted(seen) == tile
    lpc = 32 // dt
    assert sorted((lane // lpc, s) for lane in range(32) for s in range(lane % lpc, segs, lpc)) == tile


@pytest.mark.parametrize("k", [704, 992, 1024])
def test_flat_activation_reads_of_a_quarter_warp_meet_at_most_two_segments_per_bank_group(k):
    """The staged row's 8-value groups are swizzled (group q of segment s at s * 32 + 8 (q ^ (s / 2 mod 4)) halves):
    the 8 lanes of a quarter-warp read 16 bytes each of up to 8 consecutive segments; without the swizzle even and odd
    segments would fall on two bank groups (4-way conflicts), with it at most 2 segments share one (at a row's wrap)."""
    segs = k // 32
    assert "return s * 32 + 8 * (q ^ ((s >> 1) & 3));" in SRC
    worst = 0
    for dt in (8, 16):
        for p in range(dt):
            for quarter in range(4):
                for q in range(4):
                    by_group: dict[int, set[int]] = {}
                    for lane in range(8 * quarter, 8 * quarter + 8):
                        if 32 * p + lane < dt * segs:
                            s = (32 * p + lane) % segs
                            by_group.setdefault(((s * 32 + 8 * (q ^ ((s >> 1) & 3))) * 2 // 16) % 8, set()).add(s)
                    worst = max([worst, *map(len, by_group.values())])
    assert worst <= 2
