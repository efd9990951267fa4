"""`overlay engine audit` on synthetic wheels and directories: verdicts, roles, exit codes, bad input."""

from __future__ import annotations

import json
import zipfile

import pytest

from manager.engines import needs
from manager.engines.audit import audit_dir, audit_path
from tests.helpers.fatbins import engine_so, fatbin_elf, sass, wheel


def test_a_wheel_whose_needed_kernels_have_sm70_runs_and_marlin_is_a_limit(tmp_path):
    w = wheel(tmp_path / "e.whl", {"vllm/_C.abi3.so": engine_so((70, 80))})
    r = audit_path(w, 70)
    by = {c.name: c for c in r.components}
    assert r.verdict == "runs" and r.ok
    assert by["vllm _C: cache, rms_norm, activation, rotary, sampler, topk"].verdict == "runs"
    assert by["vllm _C: Marlin (GPTQ/AWQ-Marlin, FP8-Marlin, NVFP4-Marlin)"].verdict == "limit"
    b = r.binaries[0]
    assert (b.path, b.tu_count, b.tus_with_sass, b.tus_running) == ("vllm/_C.abi3.so", 4, 2, 2)


def test_a_wheel_without_sm70_in_needed_kernels_does_not_run(tmp_path):
    w = wheel(tmp_path / "e.whl", {"vllm/_C.abi3.so": engine_so((75, 80))})
    r = audit_path(w, 70)
    assert r.verdict == "does not run"
    assert [c.name for c in r.failing] == ["vllm _C: cache, rms_norm, activation, rotary, sampler, topk"]
    assert audit_path(w, 75).ok  # the same wheel on sm_75


def test_flash_attention_without_sm70_is_harmless_below_sm80_and_a_limit_above(tmp_path):
    site = tmp_path / "site"
    (site / "vllm" / "vllm_flash_attn").mkdir(parents=True)
    (site / "vllm" / "vllm_flash_attn" / "_vllm_fa2_C.abi3.so").write_bytes(fatbin_elf([("flash_fwd_cu", sass(80))]))
    (site / "vllm" / "_C.abi3.so").write_bytes(engine_so((70, 80)))
    fa = {c.binary: c for c in audit_dir(site, 70).components}["vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"]
    assert (fa.verdict, fa.role) == ("harmless", needs.BACKEND)
    assert audit_dir(site, 70).ok
    assert {c.binary: c for c in audit_dir(site, 90).components}["vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"].verdict == "limit"


def test_vendor_libraries_run_when_any_tu_has_code_for_the_sm(tmp_path):
    site = tmp_path / "site"
    (site / "nvidia" / "cublas" / "lib").mkdir(parents=True)
    (site / "nvidia" / "cublas" / "lib" / "libcublasLt.so.12").write_bytes(
        fatbin_elf([("gemm_sm70_cu", sass(70)), ("gemm_sm90_cu", sass(90))]))
    comp = audit_dir(site, 70).components[0]
    assert (comp.name, comp.verdict, comp.tus_running, len(comp.tus)) == ("NVIDIA CUDA libraries", "runs", 1, 2)


def test_rules_map_binaries_and_tus_to_roles():
    assert needs.rule_for("vllm/_C.abi3.so", "layernorm_kernels_cu").role == needs.NEEDED
    assert needs.rule_for("vllm/_C.abi3.so", "sm80_kernel_float16_u4b8_float16_cu").role == needs.FORMAT
    assert needs.rule_for("vllm/_C.abi3.so", None).role == needs.OTHER
    assert needs.rule_for("vllm/_moe_C.abi3.so", "moe_wna16_cu").min_sm == 70
    assert needs.rule_for("torch/lib/libtorch_cuda.so", None).whole_library
    assert needs.rule_for("nvidia/cusparselt/lib/libcusparseLt.so.0", None).role == needs.BACKEND


def test_cli_json_is_one_object_with_components_and_exit_1_on_a_failing_verdict(tmp_path, cli_run):
    w = wheel(tmp_path / "e.whl", {"vllm/_C.abi3.so": engine_so((75,))})
    res = cli_run("engine", "audit", str(w), "--sm", "70", "--json")
    assert res.exit_code == 1
    data = json.loads(res.stdout)
    assert data["verdict"] == "does not run" and data["sm"] == 70
    assert {c["name"] for c in data["components"]} >= {"vllm _C: cache, rms_norm, activation, rotary, sampler, topk"}
    ok = cli_run("engine", "audit", str(w), "--sm", "75")
    assert ok.exit_code == 0 and "on sm_75: runs" in ok.stdout


@pytest.mark.parametrize("make, message", [
    (lambda p: p / "missing.whl", "no such file or directory"),
    (lambda p: _zip(p / "x.whl"), "not a wheel (no *.dist-info/WHEEL"),
    (lambda p: _write(p / "bad.whl", b"not a zip"), "not a wheel (zip)"),
    (lambda p: wheel(p / "h.whl", {"vllm/_C.abi3.so": b"\x7fELF\x02\x01\x01" + b"\0" * 30}),
     "unreadable: vllm/_C.abi3.so: not an ELF file"),
])
def test_cli_bad_input_is_one_line_and_exit_1(tmp_path, cli_run, make, message):
    res = cli_run("engine", "audit", str(make(tmp_path)))
    assert res.exit_code == 1
    assert message in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_cli_hostile_fatbin_is_a_failing_verdict_naming_the_file(tmp_path, cli_run):
    import struct

    from tests.helpers.fatbins import elf
    w = wheel(tmp_path / "h.whl", {"vllm/_C.abi3.so": elf(struct.pack("<IHHQ", 0xBA55ED50, 1, 16, 1 << 40))})
    res = cli_run("engine", "audit", str(w), "--json")
    assert res.exit_code == 1
    data = json.loads(res.stdout)
    assert data["verdict"] == "unreadable"
    assert data["errors"] == ["vllm/_C.abi3.so: fatbin container at offset 0x40 runs past its section"]


def test_cli_needs_a_target_or_an_image(cli_run):
    res = cli_run("engine", "audit")
    assert res.exit_code == 1 and "give either a WHEEL" in res.stderr


def _zip(path):
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("a.txt", "x")
    return path


def _write(path, data):
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("release, verdict", [("12.8", "runs"), ("13.0", "does not run")])
def test_tritons_ptxas_of_cuda13_cannot_target_sm70(tmp_path, release, verdict):
    site = tmp_path / "site"
    tool = site / "triton" / "backends" / "nvidia" / "bin" / "ptxas"
    tool.parent.mkdir(parents=True)
    tool.write_bytes(b"\x7fELF" + b"\0" * 5000 + f"Cuda compilation tools, release {release}, V{release}.1".encode())
    (comp,) = audit_dir(site, 70).components
    assert (comp.name, comp.verdict, comp.tool_release) == ("triton ptxas", verdict, release)
    assert audit_dir(site, 75).components[0].verdict == "runs"


def test_cufftw_is_not_on_the_torch_path(tmp_path):
    assert needs.rule_for("nvidia/cufft/lib/libcufftw.so.11", None).role == needs.OTHER
    assert needs.rule_for("nvidia/cufft/lib/libcufft.so.11", None).role == needs.NEEDED


def test_a_wheel_member_declaring_an_absurd_size_is_refused_before_extraction(tmp_path, cli_run, monkeypatch):
    from manager.engines import audit

    w = wheel(tmp_path / "e.whl", {"vllm/_C.abi3.so": engine_so((70,))})
    monkeypatch.setattr(audit, "MAX_MEMBER", 100)
    res = cli_run("engine", "audit", str(w))
    assert res.exit_code == 1 and "member vllm/_C.abi3.so declares" in res.stderr
    assert list(tmp_path.iterdir()) == [w]


def test_cli_tus_lists_each_translation_unit_with_its_code(tmp_path, cli_run):
    w = wheel(tmp_path / "e.whl", {"vllm/_C.abi3.so": engine_so((70, 80))})
    text = cli_run("engine", "audit", str(w), "--tus").stdout
    assert "TU 2 marlin_cu: SASS sm_75,sm_80; PTX -; on sm_70: no code" in text
    assert "TU 0 cache_kernels_cu: SASS sm_70,sm_80; PTX -; on sm_70: sass" in text
    data = json.loads(cli_run("engine", "audit", str(w), "--json", "--tus").stdout)
    tus = [t for c in data["components"] for t in c["tus"]]
    assert sorted(t["name"] for t in tus) == ["cache_kernels_cu", "layernorm_kernels_cu", "marlin_cu",
                                              "selective_scan_fwd_cu"]
