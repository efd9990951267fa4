"""The GEMV decode entries of sm70-w4-gemm built with the project's NVRTC 12 (manager.kernels.builder, as
`overlay build sm70-w4-gemm` does) for sm_70: register counts and stack frames read from the cubin's ELF
(.nv.info records EIATTR_REGCOUNT / EIATTR_FRAME_SIZE, what cuobjdump --dump-resource-usage prints), and the
launcher's CPU-side choices (decode kernel, alignment block)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from manager.errors import BuildError
from tests.helpers import SHIPPED_OVERLAYS
from tests.kernels.w4_launcher import gemv_entries, w4_launcher

GEMV = [f"w4_gemv_{f}{a}" for a in ("", "_act") for f in ("int4", "int4zp", "fp4")] + [
    f"w4_gemv_{f}{a}_{v}" for v in w4_launcher().GEMV_VARIANTS for a in ("", "_act") for f in ("int4", "fp4")]
# __launch_bounds__(256, MINB), MINB the last field of each W4_GEMV_ENTRY line: MINB 8-warp blocks per SM on Volta's
# 64K registers (128 for 2, 80 for 3, 64 for 4)
MINB = {name: e["MINB"] for name, e in gemv_entries().items()}
# Frames measured and kept: fp4 r1 (the fp4 MoE down projection under auto) holds 8 bytes in local memory at 64
# registers (docs/kernels.md, "Eleventh lease"); q4 (auto's int4 MoE GEMV for few rows) 16-40 bytes at 80
# ("Thirteenth lease"). Each was timed with its frame.
FRAME_ALLOWED = {"w4_gemv_fp4_r1": 8, "w4_gemv_int4_q4": 32, "w4_gemv_int4_act_q4": 16, "w4_gemv_fp4_q4": 40,
                 "w4_gemv_fp4_act_q4": 16}
_ATTRS = {0x2F: "regs", 0x11: "frame"}


def cubin_resources(image: bytes) -> dict[str, dict[str, int]]:
    """Per kernel symbol: {"regs": n, "frame": bytes} from the global .nv.info section of a 64-bit cubin."""
    assert image[:4] == b"\x7fELF" and image[4] == 2
    (shoff,) = struct.unpack_from("<Q", image, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", image, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", image, shoff + i * shentsize) for i in range(shnum)]

    def cstr(off: int) -> str:
        return image[off:image.index(b"\0", off)].decode()

    names = [cstr(secs[shstrndx][4] + s[0]) for s in secs]
    symtab = next(s for s in secs if s[1] == 2)   # SHT_SYMTAB
    strs = secs[symtab[6]][4]
    syms = [cstr(strs + struct.unpack_from("<I", image, symtab[4] + 24 * i)[0]) for i in range(symtab[5] // 24)]
    out: dict[str, dict[str, int]] = {}
    for sec, name in zip(secs, names, strict=True):
        if name != ".nv.info":
            continue
        o, end = sec[4], sec[4] + sec[5]
        while o < end:
            fmt, attr = image[o], image[o + 1]
            if fmt == 4:   # EIFMT_SVAL: u16 size, then (u32 symbol, u32 value) for the per-function attributes
                (size,) = struct.unpack_from("<H", image, o + 2)
                if attr in _ATTRS:
                    sym, val = struct.unpack_from("<II", image, o + 4)
                    out.setdefault(syms[sym], {})[_ATTRS[attr]] = val
                o += 4 + size
            else:
                o += {3: 4, 2: 3}.get(fmt, 2)
    return out


@pytest.fixture(scope="module")
def sm70_cubin(tmp_path_factory) -> bytes:
    from manager.kernels import builder
    from tests.helpers.nvrtc12 import nvrtc12_lib

    result = builder.build(SHIPPED_OVERLAYS, ["sm70-w4-gemm"], archs=["sm_70"], cache=tmp_path_factory.mktemp("kc"),
                           nvrtc_path=str(nvrtc12_lib()), progress=False)
    cubins = [i for i in result.items if i.kind == "cubin" and i.arch == "sm_70"]
    assert len(cubins) == 1
    return Path(cubins[0].path).read_bytes()


@pytest.mark.parametrize("entry", GEMV)
def test_gemv_entry_compiles_for_sm_70_within_the_register_bound_without_spills(sm70_cubin, entry):
    res = cubin_resources(sm70_cubin)[entry]
    assert 0 < res["regs"] <= 65536 // (256 * MINB[entry])
    # no local-memory frame (no spills, no register arrays indexed at run time) beyond the one measured allowance
    assert res.get("frame", 0) == FRAME_ALLOWED.get(entry, 0)


def test_every_gemv_entry_has_a_blocks_per_sm_bound_and_the_one_row_entries_take_three_or_four():
    assert set(MINB) == set(GEMV)
    assert {n for n, b in MINB.items() if b == 4} == {n for n in GEMV if n.endswith(("_q1", "_r1"))}
    assert {n for n, b in MINB.items() if b == 3} == {n for n in GEMV if n.endswith("_q4")}
    assert set(MINB.values()) == {2, 3, 4}


def test_decode_kernel_comes_from_the_argument_then_the_environment_then_auto(monkeypatch):
    mod = w4_launcher()
    monkeypatch.delenv(mod.DECODE_ENV, raising=False)
    assert mod.decode_kernel() == "auto" and mod.align_block("decode") == mod.TILES["decode"][0]   # no format
    assert mod.align_block("decode", fmt="int4") == mod.GEMV_BLOCK_ROWS   # auto's int4 MoE kernel: a GEMV
    monkeypatch.setenv(mod.DECODE_ENV, "gemv")
    assert mod.decode_kernel() == "gemv" and mod.align_block("decode") == mod.GEMV_BLOCK_ROWS
    assert mod.align_block("prefill") == mod.TILES["prefill"][0]   # prefill keeps its 64-row tile
    assert mod.decode_kernel("wmma") == "wmma" and mod.align_block("decode", "wmma") == mod.TILES["decode"][0]
    assert mod.decode_block_rows() == mod.GEMV_BLOCK_ROWS and mod.decode_block_rows(decode="wmma") == 16
    monkeypatch.setenv(mod.DECODE_ENV, "tiles")
    with pytest.raises(BuildError, match="OVERLAY_W4_DECODE"):
        mod.decode_kernel()


def test_gemv_refuses_blocks_beyond_its_row_table_and_activations_on_an_odd_row_count():
    torch = pytest.importorskip("torch")
    mod = w4_launcher()
    k = mod.W4Kernels({}, num_sms=132)
    x = torch.zeros((1, 64), dtype=torch.float16)
    w, s = torch.zeros((5, 8), dtype=torch.int32), torch.zeros((5, 2), dtype=torch.float16)
    with pytest.raises(BuildError, match="rows per block"):
        k.gemv(x, w, s, "int4", k=64, group=32, block=mod.GEMV_MAX_BLOCK + 1)
    with pytest.raises(BuildError, match="even row count"):
        k.gemv(x, w, s, "int4", k=64, group=32, activation="silu")
    with pytest.raises(BuildError, match="GEMV variant 'c4' for int4zp"):
        k.gemv(x, w, s, "int4zp", k=64, group=32, zeros=torch.zeros((1, 2), dtype=torch.int32), variant="c4")


def test_fused_moe_refuses_an_alignment_block_the_wmma_tile_cannot_take():
    torch = pytest.importorskip("torch")
    mod = w4_launcher()
    k = mod.W4Kernels({}, num_sms=132)
    x = torch.zeros((1, 64), dtype=torch.float16)
    w13, s13 = torch.zeros((2, 64, 8), dtype=torch.int32), torch.zeros((2, 64, 2), dtype=torch.float16)
    w2, s2 = torch.zeros((2, 64, 4), dtype=torch.int32), torch.zeros((2, 64, 1), dtype=torch.float16)
    ids, wts = torch.zeros((1, 1), dtype=torch.int32), torch.ones((1, 1))
    with pytest.raises(BuildError, match="16 rows per expert block"):
        k.fused_moe(x, w13, s13, w2, s2, wts, ids, "int4", group=32, path="decode", decode="wmma", block=8)


class _Recorder(dict):
    """A KernelSet stand-in: every entry launches into a list of names and one of (name, grid, args) (no GPU; outputs
    stay unwritten)."""

    def __init__(self):
        super().__init__()
        self.launched: list[str] = []
        self.calls: list[tuple] = []

    def __missing__(self, name):
        rec = self

        class _Entry:
            def launch(self, grid, args):
                rec.launched.append(name)
                rec.calls.append((name, grid, args))
        return _Entry()


@pytest.mark.parametrize("decode, fmt, rows, moe, want", [
    ("auto", "int4", 1, True, ("gemv", "q4+p8")), ("auto", "int4", 8, True, ("gemv", "q4+p8")),
    ("auto", "int4", 9, True, ("gemv", "q4+p16")), ("auto", "int4", 64, True, ("gemv", "q4+p16")),
    ("auto", "int4", 65, True, ("gemv", "c4")), ("auto", "int4", None, True, ("gemv", "c4")),
    ("auto", "fp4", 8, True, ("gemv", "r1+p8")), ("auto", "fp4", 32, True, ("gemv", "r1+p16")),
    ("auto", "fp4", 65, True, ("gemv", None)),
    ("auto", "int4zp", 1, True, ("wmma", None)),
    ("auto", "int4", 4, False, ("gemv", "c4")), ("auto", "int4", 5, False, ("wmma", None)),
    ("auto", "fp4", 1, False, ("wmma", None)), ("auto", "fp4", 8, False, ("wmma", None)),
    ("auto", "int4zp", 1, False, ("wmma", None)), (None, "int4", 1, True, ("gemv", "q4+p8")),
    ("gemv", "int4", 8, False, ("gemv", None)), ("wmma", "fp4", 1, True, ("wmma", None)),
])
def test_decode_choice_resolves_auto_per_format_and_row_count_and_leaves_named_kernels_alone(monkeypatch, decode, fmt,
                                                                                             rows, moe, want):
    mod = w4_launcher()
    monkeypatch.delenv(mod.DECODE_ENV, raising=False)
    assert mod.decode_choice(decode, fmt, rows, moe) == want


def test_align_block_for_auto_follows_the_formats_kernel_and_without_a_format_takes_the_wmma_tile(monkeypatch):
    mod = w4_launcher()
    monkeypatch.setenv(mod.DECODE_ENV, "auto")
    assert mod.align_block("decode", fmt="int4") == mod.align_block("decode", fmt="fp4") == mod.GEMV_BLOCK_ROWS
    assert mod.align_block("decode", fmt="int4zp") == mod.align_block("decode") == mod.TILES["decode"][0]
    assert mod.align_block("prefill", fmt="int4") == mod.TILES["prefill"][0]
    with pytest.raises(BuildError, match="wmma, gemv, auto"):
        mod.decode_kernel("fastest")


@pytest.mark.parametrize("fmt, rows, entry", [("int4", 1, "w4_gemv_int4_c4"), ("int4", 4, "w4_gemv_int4_c4"),
                                              ("int4", 8, "w4_gemm_int4_decode"), ("fp4", 2, "w4_gemm_fp4_decode"),
                                              ("fp4", 16, "w4_gemm_fp4_decode")])
def test_linear_under_auto_launches_the_measured_fastest_entry_for_its_rows(monkeypatch, fmt, rows, entry):
    torch = pytest.importorskip("torch")
    mod = w4_launcher()
    monkeypatch.setenv(mod.DECODE_ENV, "auto")
    ks = _Recorder()
    k = mod.W4Kernels(ks, num_sms=132)
    x = torch.zeros((rows, 64), dtype=torch.float16)
    if fmt == "int4":
        w, s, g = torch.zeros((64, 8), dtype=torch.int32), torch.zeros((64, 2), dtype=torch.float16), None
    else:
        w, s = torch.zeros((64, 32), dtype=torch.uint8), torch.zeros((64, 4), dtype=torch.float8_e4m3fn)
        g = torch.ones((1,), dtype=torch.float32)
    k.linear(x, w, s, fmt, group=32 if fmt == "int4" else 16, gscale=g)
    assert ks.launched == [entry]


@pytest.mark.parametrize("env, tokens, entries", [
    ("auto", 1, ["w4_gemv_int4_act_q4", "w4_moe_down_int4_p8"]),    # router-direct: no alignment, no atomics
    ("auto", 12, ["w4_gemv_int4_act_q4", "w4_moe_down_int4_p16"]),
    ("auto", 65, ["w4_gemv_int4_act_c4", "w4_gemv_int4_c4"]),   # 65 routed rows (top-1): above AUTO_FEW_ROWS
    ("wmma", 1, ["w4_gemm_int4_decode", "w4_gemm_int4_decode"]),
])
def test_fused_moe_decode_under_the_env_launches_one_kernel_family_for_both_projections(monkeypatch, env, tokens,
                                                                                        entries):
    torch = pytest.importorskip("torch")
    mod = w4_launcher()
    monkeypatch.setenv(mod.DECODE_ENV, env)
    ks = _Recorder()
    k = mod.W4Kernels(ks, num_sms=132)
    x = torch.zeros((tokens, 64), dtype=torch.float16)
    w13, s13 = torch.zeros((2, 64, 8), dtype=torch.int32), torch.zeros((2, 64, 2), dtype=torch.float16)
    w2, s2 = torch.zeros((2, 64, 4), dtype=torch.int32), torch.zeros((2, 64, 1), dtype=torch.float16)
    ids, wts = torch.zeros((tokens, 1), dtype=torch.int32), torch.ones((tokens, 1))
    k.fused_moe(x, w13, s13, w2, s2, wts, ids, "int4", group=32, path="decode", activation="silu")
    assert ks.launched == entries


@pytest.mark.parametrize("entry", [f"w4_dequant_{f}" for f in ("int4", "int4zp", "fp4")])
def test_dequant_entry_compiles_for_sm_70_without_a_local_memory_frame(sm70_cubin, entry):
    res = cubin_resources(sm70_cubin)[entry]
    assert 0 < res["regs"] <= 255 and res.get("frame", 0) == 0


def test_prefill_kernel_comes_from_the_argument_then_the_environment_then_dequant(monkeypatch):
    mod = w4_launcher()
    monkeypatch.delenv(mod.PREFILL_ENV, raising=False)
    assert mod.prefill_kernel() == "dequant"
    assert mod.prefill_choice(mod.DEQUANT_MIN_ROWS) == "dequant"
    assert mod.prefill_choice(mod.DEQUANT_MIN_ROWS - 1) == "wmma"   # below the threshold: the WMMA tile
    monkeypatch.setenv(mod.PREFILL_ENV, "wmma")
    assert mod.prefill_kernel() == "wmma" and mod.prefill_choice(8192) == "wmma"
    assert mod.prefill_choice(8192, "dequant") == "dequant"
    monkeypatch.setenv(mod.PREFILL_ENV, "cublas")
    with pytest.raises(BuildError, match="OVERLAY_W4_PREFILL"):
        mod.prefill_kernel()


@pytest.mark.parametrize("fmt, rows, prefill, entry", [
    ("int4", 256, None, "w4_dequant_int4"), ("fp4", 300, None, "w4_dequant_fp4"),
    ("int4", 255, None, "w4_gemm_int4_prefill"), ("int4", 4096, "wmma", "w4_gemm_int4_prefill"),
    ("int4zp", 512, None, "w4_dequant_int4zp")])
def test_linear_prefill_dequantizes_from_the_threshold_and_launches_one_thread_per_32_values(
        monkeypatch, fmt, rows, prefill, entry):
    torch = pytest.importorskip("torch")
    mod = w4_launcher()
    monkeypatch.delenv(mod.PREFILL_ENV, raising=False)
    ks = _Recorder()
    k = mod.W4Kernels(ks, num_sms=132)
    n, kk = 96, 1056
    x = torch.zeros((rows, kk), dtype=torch.float16)
    zeros = g = None
    if fmt == "fp4":
        w, s = torch.zeros((n, kk // 2), dtype=torch.uint8), torch.zeros((n, kk // 16), dtype=torch.float8_e4m3fn)
        g, group = torch.ones((1,), dtype=torch.float32), 16
    else:
        w, s, group = torch.zeros((n, kk // 8), dtype=torch.int32), torch.zeros((n, kk // 32), dtype=torch.float16), 32
        zeros = torch.zeros((n // 8, kk // 32), dtype=torch.int32) if fmt == "int4zp" else None
    y = k.linear(x, w, s, fmt, group=group, zeros=zeros, gscale=g, path="prefill", prefill=prefill)
    assert tuple(y.shape) == (rows, n)
    assert ks.launched == [entry]
    if entry.startswith("w4_dequant"):
        (_, grid, args), = ks.calls
        assert grid == (-(-n * kk // 32 // mod.DEQUANT_THREADS), 1, 1) and args[-3:] == [n, kk, group]
        assert tuple(args[0].shape) == (n, kk) and args[0].dtype == torch.float16


def test_dequantize_takes_experts_on_the_grids_second_axis_and_refuses_a_k_off_the_packing():
    torch = pytest.importorskip("torch")
    mod = w4_launcher()
    ks = _Recorder()
    k = mod.W4Kernels(ks, num_sms=132)
    w, s = torch.zeros((3, 40, 88), dtype=torch.int32), torch.zeros((3, 40, 22), dtype=torch.float16)
    out = k.dequantize(w, s, "int4", k=704, group=32)
    assert tuple(out.shape) == (3, 40, 704) and ks.calls[0][1] == (-(-40 * 22 // 256), 3, 1)
    with pytest.raises(BuildError, match="K/2 = 512 bytes"):
        k.dequantize(w, s, "int4", k=1024, group=32)
