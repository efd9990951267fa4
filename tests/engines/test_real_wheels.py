"""The audit on real PyPI wheels (downloaded once, only the JSON report cached; see conftest.py),
and the parser cross-checked against NVIDIA's cuobjdump (PyPI wheel nvidia-cuda-cuobjdump)."""

from __future__ import annotations

import collections
import os
import re
import stat
import subprocess
import zipfile
from pathlib import Path

import pytest

from manager.engines import fatbin

from .conftest import audited, wheel_file

pytestmark = pytest.mark.network

VLLM_0191 = "vllm-0.19.1-cp38-abi3-manylinux_2_31_x86_64.whl"
VLLM_0200 = "vllm-0.20.0-cp38-abi3-manylinux_2_35_x86_64.whl"
TORCH_2100 = "torch-2.10.0-3-cp311-cp311-manylinux_2_28_x86_64.whl"  # the build pip picks for torch==2.10.0
TORCH_2110 = "torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl"
TORCHAUDIO = "torchaudio-2.10.0-cp311-cp311-manylinux_2_28_x86_64.whl"  # 1.9 MB, real sm_70..sm_120 cubins
CUOBJDUMP = "nvidia_cuda_cuobjdump-13.4.92-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"


def _binaries(report: dict) -> dict[str, tuple[int, int, int]]:
    return {b["path"]: (b["tus_with_sass"], b["tus_running"], b["tu_count"]) for b in report["binaries"]}


def _verdicts(report: dict) -> dict[str, str]:
    return {c["name"] + " @ " + c["binary"]: c["verdict"] for c in report["components"]}


def test_vllm_0_19_1_runs_on_sm70_with_flash_attention_harmless_and_marlin_a_limit():
    r = audited("vllm", VLLM_0191)
    assert r["verdict"] == "runs" and r["failing"] == []
    b = _binaries(r)
    assert b["vllm/_C.abi3.so"] == (28, 29, 106)  # +1: machete_pytorch_cu runs from sm_52 PTX
    assert b["vllm/_moe_C.abi3.so"] == (8, 8, 38)
    assert b["vllm/_C_stable_libtorch.abi3.so"] == (3, 3, 3)
    v = _verdicts(r)
    assert v["vllm flash-attn 2 (_vllm_fa2_C) @ vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"] == "harmless"
    assert v["vllm flash-attn 3 (_vllm_fa3_C) @ vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"] == "harmless"
    assert v["vllm FlashMLA @ vllm/_flashmla_C.abi3.so"] == "harmless"
    assert v["vllm _C: Marlin (GPTQ/AWQ-Marlin, FP8-Marlin, NVFP4-Marlin) @ vllm/_C.abi3.so"] == "limit"
    assert v["vllm _C: NVFP4 / MXFP4 / MXFP8 kernels @ vllm/_C.abi3.so"] == "limit"
    assert v["vllm _moe_C: moe_wna16 (W4A16 MoE, CUDA cores) @ vllm/_moe_C.abi3.so"] == "runs"
    core = next(c for c in r["components"] if c["name"].startswith("vllm _C: cache"))
    assert {t["name"] for t in core["tus"]} >= {"cache_kernels_cu", "layernorm_kernels_cu", "activation_kernels_cu",
                                               "pos_encoding_kernels_cu"}


def test_vllm_0_20_0_cuda13_does_not_run_on_sm70():
    r = audited("vllm", VLLM_0200)
    assert r["verdict"] == "does not run"
    assert "vllm _C: cache, rms_norm, activation, rotary, sampler, topk" in r["failing"]
    assert "vllm _moe_C: moe_align, topk_softmax" in r["failing"]
    b = _binaries(r)
    assert b["vllm/_C.abi3.so"][:2] == (0, 0) and b["vllm/_moe_C.abi3.so"][:2] == (0, 0)
    assert all("sm_70" not in x["sass"] for x in r["binaries"])


def test_torch_2_10_0_cu128_runs_on_sm70_in_every_libtorch_cuda_tu():
    r = audited("torch", TORCH_2100)
    assert r["verdict"] == "runs"
    sass, running, total = _binaries(r)["torch/lib/libtorch_cuda.so"]
    assert total > 100 and sass == running == total


def test_torch_2_11_0_cu130_does_not_run_on_sm70():
    r = audited("torch", TORCH_2110)
    assert r["verdict"] == "does not run"
    assert "torch libtorch_cuda" in r["failing"]
    assert _binaries(r)["torch/lib/libtorch_cuda.so"][:2] == (0, 0)


def _cuobjdump(tmp_path: Path) -> Path:
    with zipfile.ZipFile(wheel_file("nvidia-cuda-cuobjdump", CUOBJDUMP)) as zf:
        member = next(n for n in zf.namelist() if n.endswith("/bin/cuobjdump"))
        path = Path(zf.extract(member, tmp_path))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _so_files(tmp_path: Path) -> list[Path]:
    with zipfile.ZipFile(wheel_file("torchaudio", TORCHAUDIO)) as zf:
        names = [n for n in zf.namelist() if n.endswith(".so")]
        return [Path(zf.extract(n, tmp_path / "w")) for n in names]


def test_parser_counts_and_tu_names_match_cuobjdump_on_a_real_wheel(tmp_path):
    tool = _cuobjdump(tmp_path)
    checked = 0
    for so in _so_files(tmp_path):
        fb = fatbin.read_path(str(so))
        listed = subprocess.run([str(tool), "--list-elf", "--list-ptx", str(so)], capture_output=True, text=True,
                                env={**os.environ, "LC_ALL": "C"})
        theirs = collections.Counter(m.groups() for m in re.finditer(r"\.(sm_\w+?)\.(cubin|ptx)\s*$", listed.stdout, re.M))
        ours = collections.Counter((e.arch, "cubin" if e.kind == "sass" else "ptx") for e in fb.entries)
        assert ours == theirs, so.name
        if not fb.containers:
            continue
        symbols = subprocess.run([str(tool), "--dump-elf-symbols", str(so)], capture_output=True, text=True).stdout
        blocks = symbols.split("Fatbin elf code")[1:]
        their_tus = [fatbin._find_tu(b.encode()) for b in blocks]
        our_tus = [c.tu for c in fb.containers for e in c.entries if e.kind == "sass"]
        assert our_tus == their_tus and None not in our_tus, so.name
        checked += len(fb.entries)
    assert checked >= 20  # libtorchaudio.so: 3 TUs x 7 SMs; libctc_prefix_decoder.so: 1 x 7
