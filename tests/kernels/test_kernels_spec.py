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


def test_shipped_d512_overlay_declares_decode_reduce_and_prefill():
    spec = load_kernels_spec(SHIPPED_OVERLAYS / "sm70-d512-attention")
    names = {e.name for s in spec.sources for e in s.entries}
    assert names == {"paged_decode_d512", "paged_decode_d512_reduce", "prefill_d512"}
    _, dec = spec.entry("paged_decode_d512")
    assert dec.shared_bytes <= 96 * 1024  # Volta's opt-in shared memory per block
    _, pre = spec.entry("prefill_d512")
    assert pre.shared_bytes <= 96 * 1024


def test_engine_manifest_carries_the_kernels_section_as_kernelsspec():
    from manager.overlays.manifest import load_manifest

    m = load_manifest(SHIPPED_OVERLAYS / "sm70-d512-attention" / "overlay.yaml")
    assert isinstance(m.kernels, KernelsSpec)
