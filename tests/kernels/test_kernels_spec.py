"""The `kernels:` manifest section schema (manager.kernels.spec)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from manager.errors import BuildError
from manager.kernels.spec import KernelsSpec, load_kernels_spec
from tests.helpers import SHIPPED_OVERLAYS


def _spec(**over):
    base = {
        "sources": [{"path": "csrc/a.cu", "entries": [{"name": "k", "params": ["ptr out", "i32 n", "f32 s"]}]}],
    }
    base.update(over)
    return base


def test_params_parse_from_type_name_strings():
    spec = KernelsSpec.model_validate(_spec())
    params = spec.sources[0].entries[0].params
    assert [(p.type, p.name) for p in params] == [("ptr", "out"), ("i32", "n"), ("f32", "s")]


def test_defaults_target_compute_70_and_sm_70():
    assert KernelsSpec.model_validate(_spec()).archs == ["compute_70", "sm_70"]


@pytest.mark.parametrize("bad", [
    {"archs": ["volta"]},
    {"archs": ["sm70"]},
    {"options": ["--gpu-architecture=sm_80"]},
    {"options": ["-I/usr/include"]},
    {"headers": ["../outside.cuh"]},
    {"sources": [{"path": "/abs/a.cu", "entries": [{"name": "k", "params": []}]}]},
    {"sources": [{"path": "csrc/a.cpp", "entries": [{"name": "k", "params": []}]}]},
    {"sources": [{"path": "csrc/a.cu", "entries": [{"name": "k", "params": ["pointer out"]}]}]},
    {"sources": [{"path": "csrc/a.cu", "entries": [{"name": "k", "params": ["ptr"]}]}]},
    {"sources": [{"path": "csrc/a.cu", "entries": [{"name": "not-c", "params": []}]}]},
    {"sources": [{"path": "csrc/a.cu", "entries": [{"name": "k", "params": []}]},
                 {"path": "csrc/b.cu", "entries": [{"name": "k", "params": []}]}]},
    {"unknown_key": 1},
])
def test_invalid_kernels_sections_are_rejected(bad):
    with pytest.raises(Exception):
        KernelsSpec.model_validate(_spec(**bad))


def test_load_kernels_spec_names_file_and_key_on_error(tmp_path: Path):
    (tmp_path / "overlay.yaml").write_text(yaml.safe_dump({"id": "x", "kernels": _spec(archs=["volta"])}))
    with pytest.raises(BuildError, match=r"overlay.yaml: kernels.archs"):
        load_kernels_spec(tmp_path)


def test_load_kernels_spec_requires_listed_files_to_exist(tmp_path: Path):
    (tmp_path / "overlay.yaml").write_text(yaml.safe_dump({"id": "x", "kernels": _spec()}))
    with pytest.raises(BuildError, match="csrc/a.cu does not exist"):
        load_kernels_spec(tmp_path)


def test_overlay_without_kernels_section_yields_none(tmp_path: Path):
    (tmp_path / "overlay.yaml").write_text("id: x\n")
    assert load_kernels_spec(tmp_path) is None


def _decode_smem(hd: int) -> int:   # DecodeCfg<HD>::SMEM in csrc/paged_decode.cu
    chunk = 32 if hd >= 512 else 64 if hd == 256 else 128
    lds, kq = hd + 8, 8 // (chunk // 16)
    return 2 * chunk * lds * 2 + 16 * lds * 2 + kq * 16 * (chunk + 4) * 4 + 16 * (chunk + 8) * 2 + 3 * 16 * 4


def _prefill_smem(hd: int) -> int:   # PrefillCfg<HD>::SMEM in csrc/prefill.cu
    bm = ch = 32 if hd >= 512 else 64
    lds, kq = hd + 8, 16 // ((bm // 16) * (ch // 16))
    return bm * lds * 2 + ch * lds * 2 + kq * bm * (ch + 4) * 4 + bm * (ch + 8) * 2 + 2 * bm * 4


def test_shipped_overlay_declares_the_family_per_head_dim_and_kv_format():
    spec = load_kernels_spec(SHIPPED_OVERLAYS / "sm70-d512-attention")
    names = {e.name for s in spec.sources for e in s.entries}
    fmts = ("", "_e4m3", "_e5m2")
    want = {f"{k}_d{hd}{f}" for hd in (64, 128, 256, 512) for k in ("paged_decode", "prefill") for f in fmts}
    want |= {f"paged_decode_d{hd}_reduce" for hd in (64, 128, 256, 512)}
    assert names == want
    for hd in (64, 128, 256, 512):
        for f in fmts:
            _, dec = spec.entry(f"paged_decode_d{hd}{f}")
            _, pre = spec.entry(f"prefill_d{hd}{f}")
            # the launch's dynamic shared memory is the sources' layout, within Volta's opt-in 96 KB
            assert (dec.threads, dec.shared_bytes) == (256, _decode_smem(hd)) and dec.shared_bytes <= 96 * 1024
            assert (pre.threads, pre.shared_bytes) == (512, _prefill_smem(hd)) and pre.shared_bytes <= 96 * 1024
            assert [p.name for p in dec.params][-2:] == [p.name for p in pre.params][-2:] == ["k_scale", "v_scale"]
        _, red = spec.entry(f"paged_decode_d{hd}_reduce")
        assert red.threads == min(128, hd)
    # the D=512 members keep the sizes measured in docs/kernels.md
    assert (spec.entry("paged_decode_d512")[1].shared_bytes, spec.entry("prefill_d512")[1].shared_bytes) == (93888, 87808)


def test_engine_manifest_carries_the_kernels_section_as_kernelsspec():
    from manager.overlays.manifest import load_manifest

    m = load_manifest(SHIPPED_OVERLAYS / "sm70-d512-attention" / "overlay.yaml")
    assert isinstance(m.kernels, KernelsSpec)
