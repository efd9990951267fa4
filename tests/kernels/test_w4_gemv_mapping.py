"""CPU replay of the GEMV decode entries' index math (csrc/w4_gemm.cu, w4_gemv; sm70-w4-gemm): which lane reads which
16-byte weight vector, which warp reads which weight row, where the activations sit in shared memory, and the E2M1
bit map of its dequantizer, replayed in Python/numpy with the constants parsed from the source. There is no GPU here:
these prove that every weight is read exactly once and multiplied with the matching activation."""

from __future__ import annotations

import re

import numpy as np
import pytest

from testing.checkpoints import E2M1_VALUES
from tests.kernels.w4_launcher import W4_SOURCE, gemv_entries, w4_launcher

SRC = W4_SOURCE.read_text()
NW = int(re.search(r"w4_gemv<FMT, (\d+), CPW, KC, BMAX, FUSE, XR>", SRC).group(1))
ENTRIES = gemv_entries(SRC)   # entry -> its W4_GEMV_ENTRY fields
GEOMETRIES = sorted({(e["CPW"], e["KC"]) for e in ENTRIES.values()})


def _lane_segments(k: int, kc_width: int) -> dict[tuple[int, int], list[int]]:
    """(chunk start, lane) -> the k offsets of the 32 values each of its segments covers (the kernel's loop)."""
    got: dict[tuple[int, int], list[int]] = {}
    for kc in range(0, k, kc_width):
        nseg = min(kc_width, k - kc) >> 5
        for lane in range(32):
            for u in range(kc_width // 1024):
                seg = lane + 32 * u
                if seg < nseg:
                    k0 = kc + 32 * seg
                    got.setdefault((kc, lane), []).extend(range(k0, k0 + 32))
    return got


def test_source_constants_match_the_launchers_block_geometry_and_entry_names():
    mod = w4_launcher()
    assert re.search(r"__launch_bounds__\(256, MINB\) NAME", SRC) and NW * 32 == 256
    assert "__shared__ int s_rows[MAXBM]" in SRC and "constexpr int MAXBM = 64;" in SRC and mod.GEMV_MAX_BLOCK == 64
    fmts = {0: "int4", 1: "int4zp", 2: "fp4"}
    for name, e in ENTRIES.items():
        fmt, fuse, cpw, kc, bmax = e["FMT"], e["FUSE"], e["CPW"], e["KC"], e["BMAX"]
        variant = name.rsplit("_", 1)[1] if name.endswith(tuple(f"_{v}" for v in mod.GEMV_VARIANTS)) else None
        assert name == f"w4_gemv_{fmts[fmt]}" + ("_act" if fuse else "") + (f"_{variant}" if variant else "")
        assert NW * cpw == (mod.GEMV_VARIANTS[variant] if variant else mod.GEMV_ROWS_PER_BLOCK)
        assert kc % 1024 == 0 and bmax <= mod.GEMV_BLOCK_ROWS and 2 * bmax * kc <= 48 * 1024
        if variant is None:
            assert bmax == mod.GEMV_BLOCK_ROWS
    assert {n for n in ENTRIES if n.count("_") == 2 or n.endswith("_act")} == {
        f"w4_gemv_{f}{a}" for f in fmts.values() for a in ("", "_act")}


@pytest.mark.parametrize("cpw,kc", GEOMETRIES)
@pytest.mark.parametrize("k", [32, 704, 1024, 2048, 2816, 3840, 5120])
def test_lanes_cover_every_k_of_a_row_exactly_once_in_whole_16_byte_vectors(k, cpw, kc):
    segs = _lane_segments(k, kc)
    ks = sorted(v for vals in segs.values() for v in vals)
    assert ks == list(range(k))
    assert all(v % 32 == 0 for vals in segs.values() for v in vals[::32])   # vector byte offset k0/2: 16-B aligned


@pytest.mark.parametrize("cpw,kc", GEOMETRIES)
@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("n", [16, 100, 1408, 2816, 15360])
def test_warps_read_every_weight_row_once_and_fused_warps_pair_gate_row_n_with_up_row_n_plus_i(fuse, n, cpw, kc):
    outc = cpw // 2 if fuse else cpw
    n_out = n // 2 if fuse else n
    per_block = NW * outc
    seen: list[int] = []
    for by in range(-(-n_out // per_block)):
        for warp in range(NW):
            cols, oks = [], []
            for c in range(cpw):
                oc = (by * NW + warp) * outc + (c % outc if fuse else c)
                oks.append(oc < n_out)
                cols.append(oc + n_out if fuse and c >= outc else oc)
            seen += [col for col, ok in zip(cols, oks, strict=True) if ok]
            if fuse:
                for c in range(outc):
                    if oks[c]:
                        assert cols[c + outc] == cols[c] + n_out
    assert sorted(seen) == list(range(n))


def _phys(seg: int, q: int) -> int:
    return seg * 32 + 8 * (q ^ ((seg >> 1) & 3))


@pytest.mark.parametrize("cpw,kc", GEOMETRIES)
def test_activation_swizzle_is_one_to_one_and_the_lanes_16_byte_reads_hit_distinct_banks(cpw, kc):
    assert "seg * 32 + 8 * (q ^ ((seg >> 1) & 3))" in SRC and "xseg = sx + seg * 32" in SRC
    assert SRC.count("xseg + r * KC + 8 * (q ^ sw)") == 2
    slots = sorted(_phys(s, q) for s in range(kc // 32) for q in range(4))
    assert slots == list(range(0, kc, 8))
    for u in range(kc // 1024):
        for q in range(4):
            for phase in range(4):   # a warp's 128-bit shared loads run as 4 phases of 8 lanes
                lanes = range(8 * phase, 8 * phase + 8)
                banks = [(_phys(lane + 32 * u, q) * 2 // 16) % 8 for lane in lanes]   # 16-B bank quads of 128 B
                assert sorted(banks) == list(range(8))


def _half(bits: np.ndarray) -> np.ndarray:
    return bits.astype(np.uint16).view(np.float16).astype(np.float32)


def _fp4_pair_bits(w: int, j: int) -> int:
    mag = (w << (9 - 4 * j)) if j < 3 else (w >> 3)
    return ((mag & 0x0E000E00) | ((w << (12 - 4 * j)) & 0x80008000)) & 0xFFFFFFFF


def _stage_x8(x8: np.ndarray) -> np.ndarray:
    return x8[[0, 4, 1, 5, 2, 6, 3, 7]]


def test_fp4_pair_bits_give_nibbles_j_and_j_plus_4_as_e2m1_times_2_pow_minus_14():
    assert "if constexpr (J < 3) mag = w << (9 - 4 * J);" in SRC and "else mag = w >> 3;" in SRC
    assert "(mag & 0x0E000E00u) | (sgn & 0x80008000u)" in SRC and "w << (12 - 4 * J)" in SRC
    rng = np.random.default_rng(0)
    table = np.array([v for v in E2M1_VALUES] + [-v for v in E2M1_VALUES], dtype=np.float32)
    for w in [int(v) for v in rng.integers(0, 2**32, 300, dtype=np.uint64)] + [0xFFFFFFFF, 0x88888888, 0x76543210]:
        nib = [(w >> (4 * i)) & 0xF for i in range(8)]
        for j in range(4):
            b = _fp4_pair_bits(w, j)
            lo, hi = _half(np.array([b & 0xFFFF, b >> 16])) * 16384.0
            assert (lo, hi) == (table[nib[j]], table[nib[j + 4]])   # -0.0 == 0.0: the sign of zero is free


@pytest.mark.parametrize("fmt", ["int4", "fp4"])
def test_one_vector_dot_product_with_staged_activations_equals_the_plain_dot_product(fmt):
    """The kernel's arithmetic for one lane, one row, one 16-byte vector: dequantized pairs (j, j + 4) of each word
    times the activations in stage_x8 order, half2 products summed per word, scaled per 16-value half in fp32."""
    rng = np.random.default_rng(1)
    words = [int(v) for v in rng.integers(0, 2**32, 4, dtype=np.uint64)]
    x = rng.standard_normal(32).astype(np.float16)
    scale = [0.0123, 0.0456]
    vals = np.zeros(32, dtype=np.float32)
    table = np.array(list(E2M1_VALUES) + [-v for v in E2M1_VALUES], dtype=np.float32)
    acc = np.float32(0)
    for q, w in enumerate(words):
        nib = [(w >> (4 * i)) & 0xF for i in range(8)]
        vals[8 * q:8 * q + 8] = [(n - 8) if fmt == "int4" else table[n] for n in nib]
        xs = _stage_x8(x[8 * q:8 * q + 8])
        h = np.zeros(2, dtype=np.float16)
        for j in range(4):
            if fmt == "int4":
                b = ((w >> (4 * j)) & 0x000F000F) | 0x64006400
                d = (_half(np.array([b & 0xFFFF, b >> 16])) - 1032.0).astype(np.float16)
            else:
                b = _fp4_pair_bits(w, j)
                d = (_half(np.array([b & 0xFFFF, b >> 16])) * 16384.0).astype(np.float16)
            h = (xs[2 * j:2 * j + 2] * d + h).astype(np.float16)
        acc = np.float32(acc + np.float32(h.astype(np.float32).sum()) * np.float32(scale[q >> 1]))
    want = float((x.astype(np.float64) * vals * np.repeat(scale, 16)).sum())
    assert abs(float(acc) - want) <= 2e-3 * np.abs(x.astype(np.float64) * vals * np.repeat(scale, 16)).sum()


@pytest.mark.parametrize("group", [16, 32, 48, 128])
def test_group_index_by_shift_equals_division(group):
    gshift = (group & (group - 1)) == 0 and (group.bit_length() - 1)
    for k0 in range(0, 4096, 32):
        for k in (k0, k0 + 16):
            assert (k >> gshift if gshift is not False else k // group) == k // group


def test_entry_parser_names_fields_by_the_macro_and_refuses_a_line_of_another_arity():
    src = "#define W4_GEMV_ENTRY(NAME, FMT, FUSE, KC, MINB)  \\\nW4_GEMV_ENTRY(w4_gemv_a, 2, true, 1024, 4)\n"
    assert gemv_entries(src) == {"w4_gemv_a": {"FMT": 2, "FUSE": 1, "KC": 1024, "MINB": 4}}
    with pytest.raises(ValueError, match="w4_gemv_b, 2, 1024, 4.*3 values for 4 fields"):
        gemv_entries(src + "W4_GEMV_ENTRY(w4_gemv_b, 2, 1024, 4)\n")
