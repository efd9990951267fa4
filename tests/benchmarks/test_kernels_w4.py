"""benchmarks/kernels_w4.py: how its decode arms split into launches, on the CPU (the timings need a GPU)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.helpers import REPO_ROOT
from tests.kernels.w4_launcher import w4_launcher

pytest.importorskip("torch")
_spec = importlib.util.spec_from_file_location("kernels_w4", REPO_ROOT / "benchmarks" / "kernels_w4.py")
kw = importlib.util.module_from_spec(_spec)
sys.modules["kernels_w4"] = kw
_spec.loader.exec_module(kw)


def test_every_gemv_arm_is_either_aligned_or_a_router_direct_pair_the_launcher_has():
    """The per-projection timings split each GEMV arm with _direct_parts: the default GEMV (variant None) and the
    aligned variants are not router-direct (None once crashed the split on the H100, 2026-12-07), and every
    "gate_up+tile" arm names a GEMV variant and a down tile of the launcher."""
    mod = w4_launcher()
    gemv_arms = [var for dec, var in kw.DECODE_ARMS if dec == "gemv"]
    assert None in gemv_arms
    for var in gemv_arms:
        parts = kw._direct_parts(var)
        if var is None or var in mod.GEMV_VARIANTS:
            assert parts is None, var
        else:
            assert var in mod.DIRECT_VARIANTS, var
            up_var, tile = parts
            assert up_var in mod.GEMV_VARIANTS and tile in mod.MOE_DOWN_TILES, var
    # auto's router-direct choices are among the arms, so every run times them beside the rest
    assert set(mod.AUTO_DECODE_ONE.values()) | set(mod.AUTO_DECODE_FEW.values()) <= set(kw.DECODE_ARMS)


def test_arm_labels_name_the_variant_or_the_kernel_alone():
    assert kw._arm_label("gemv", None) == "gemv"
    assert kw._arm_label("gemv", "q4+p16") == "gemv_q4+p16"
