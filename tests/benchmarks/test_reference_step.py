"""benchmarks/reference_step.py: the pure parts (shapes of the TP=2 half, the V100 rule, the sums) on the CPU."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.helpers import REPO_ROOT

_spec = importlib.util.spec_from_file_location("reference_step", REPO_ROOT / "benchmarks" / "reference_step.py")
rs = importlib.util.module_from_spec(_spec)
sys.modules["reference_step"] = rs
_spec.loader.exec_module(rs)


def test_every_linear_of_the_tp2_half_has_a_k_the_w4_kernels_take():
    for lin in rs.linears():
        assert lin.k % 32 == 0, lin
        assert lin.n > 0 and lin.count in (rs.SLIDING["count"], rs.FULL["count"], rs.LAYERS)
    assert rs.EXPERT_INTER % 32 == 0 and rs.DENSE_INTER % 32 == 0


def test_shapes_follow_the_26b_a4b_profile_halved():
    import yaml

    prof = yaml.safe_load((REPO_ROOT / "profiles" / "models" / "gemma-4-26b-a4b.yaml").read_text())
    assert prof["hidden_size"] == rs.H and prof["num_layers"] == rs.LAYERS
    assert prof["num_attention_heads"] == 2 * rs.Q_HEADS
    assert prof["intermediate_size"] == 2 * rs.DENSE_INTER
    assert prof["moe"]["expert_intermediate_size"] == 2 * rs.EXPERT_INTER
    groups = {g["name"]: g for g in prof["layer_groups"]}
    assert groups["sliding"]["count"] == rs.SLIDING["count"] and groups["full"]["count"] == rs.FULL["count"]
    assert groups["sliding"]["head_dim"] == rs.SLIDING["head_dim"] and groups["full"]["head_dim"] == rs.FULL["head_dim"]
    assert groups["sliding"]["window"] == rs.SLIDING["window"]
    assert groups["sliding"]["kv_heads"] == 2 * rs.SLIDING["kv_heads"]


def test_v100_rule_takes_the_slower_of_cycles_and_bytes():
    # 10 us on 132 SMs at 1.98 GHz is 21.35 us of V100 cycles; 1 MB at 720 GB/s is 1.39 us
    us, rule = rs.v100_us(10.0, 1e6, 132, 1.98e9)
    assert rule == "cycles" and us == pytest.approx(10 * 132 * 1.98 / (80 * 1.53))
    us, rule = rs.v100_us(10.0, 100e6, 132, 1.98e9)
    assert rule == "bytes" and us == pytest.approx(100e6 / 720e9 * 1e6)


def test_totals_weigh_each_row_by_its_calls_per_step():
    rows = [rs.Row("decode", "a", 30, 10.0, 0, 0, 20.0, "cycles"), rs.Row("decode", "b", 1, 100.0, 0, 0, 300.0, "bytes"),
            rs.Row("prefill", "a", 5, 1000.0, 0, 0, 2000.0, "cycles")]
    t = rs.totals(rows)
    assert t["decode"]["measured_ms"] == pytest.approx(0.4) and t["decode"]["v100_ms"] == pytest.approx(0.9)
    assert t["prefill"]["v100_ms"] == pytest.approx(10.0)
    doc = {"device": "X", "sms": 132, "clock_ghz": 1.98, "versions": "v", "prompt": 4096, "ctx": 4096,
           "rows": [vars(r) for r in rows], "totals": t,
           "allreduce": {"decode": rs.allreduce_estimate(1), "prefill": rs.allreduce_estimate(4096)}}
    md = rs.markdown(doc)
    assert "V100 **estimated 0.90 ms**" in md and "fork 35 tok/s" in md


def test_allreduce_estimate_grows_with_the_tokens_and_is_cheaper_on_nvlink():
    one, many = rs.allreduce_estimate(1), rs.allreduce_estimate(4096)
    assert one["all_reduces"] == 60 and many["bytes_each"] == 4096 * 2816 * 2
    assert many["pcie3_ms"] > many["nvlink2_ms"] > one["nvlink2_ms"]


def test_v100_rule_for_a_cublas_gemm_takes_its_flops_at_the_assumed_tensor_fraction_not_the_cycles():
    # 2 TFLOP at 80 % of 125 TFLOPS is 20 ms, whatever the time measured here (wgmma is not Volta's instruction)
    us, rule = rs.v100_us(1.0, 1e6, 132, 1.98e9, flops=2e12)
    assert rule == "cuBLAS FLOPs (estimated)" and us == pytest.approx(2e12 / (0.8 * 125e12) * 1e6)
    us, rule = rs.v100_us(1.0, 100e6, 132, 1.98e9, flops=1e6)   # tiny GEMM: its bytes decide
    assert rule == "bytes" and us == pytest.approx(100e6 / 720e9 * 1e6)
