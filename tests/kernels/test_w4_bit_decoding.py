"""The bit manipulations csrc/w4_gemm.cu (sm70-w4-gemm) decodes 4-bit weights and E4M3 scales with, replayed on the
CPU with numpy's float16 and compared with the formats' definitions (E2M1 table of vLLM 0.19.1
nvfp4_emulation_utils.kE2M1ToFloat, as testing.checkpoints.E2M1_VALUES; torch's float8_e4m3fn)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from testing.checkpoints import E2M1_VALUES
from tests.helpers import SHIPPED_OVERLAYS

SRC = (SHIPPED_OVERLAYS / "sm70-w4-gemm" / "csrc" / "w4_gemm.cu").read_text()


def _h(bits: int) -> float:
    return float(np.array([bits], dtype=np.uint16).view(np.float16)[0])


def test_the_kernel_source_uses_the_bit_patterns_replayed_here():
    assert "((t & 0x00070007u) << 9) | ((t & 0x00080008u) << 12)" in SRC
    assert "__float2half2_rn(16384.f)" in SRC
    assert "((b & 0x80u) << 8) | ((b & 0x7Fu) << 7)" in SRC and "* 256.f" in SRC
    assert re.search(r"0x000F000Fu\) \| 0x64006400u", SRC)


@pytest.mark.parametrize("code", range(16))
def test_e2m1_bits_shifted_into_fp16_times_2_pow_14_give_the_table_value(code):
    bits = ((code & 7) << 9) | ((code & 8) << 12)
    want = E2M1_VALUES[code & 7] * (-1.0 if code & 8 else 1.0)
    assert _h(bits) * 16384.0 == want or (want == 0.0 and _h(bits) == 0.0)


def test_e4m3_bits_shifted_into_fp16_times_256_give_torch_float8_for_every_finite_byte():
    torch = pytest.importorskip("torch")
    b = torch.arange(256, dtype=torch.int32)
    finite = (b & 0x7F) != 0x7F
    ref = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    got = torch.tensor([_h(((int(x) & 0x80) << 8) | ((int(x) & 0x7F) << 7)) * 256.0 for x in b])
    assert torch.equal(got[finite], ref[finite])


@pytest.mark.parametrize("nibble", range(16))
@pytest.mark.parametrize("zero", (0, 8, 15))
def test_int4_or_0x6400_minus_1024_plus_zero_is_exact(nibble, zero):
    assert _h(0x6400 | nibble) - _h(0x6400 | zero) == nibble - zero
    assert _h(0x6400 | nibble) == 1024 + nibble
