"""benchmarks/kernel_variants.py: -D flags plus the prefill launch overrides (threads=, shared=, rows=)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.helpers import BENCHMARKS


def _load():
    spec = importlib.util.spec_from_file_location("kernel_variants_under_test", BENCHMARKS / "kernel_variants.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_parse_splits_d_flags_from_launch_overrides():
    kv = _load()
    assert kv.parse("base=") == ("base", None, [], {})
    assert kv.parse("old@2fed222=-DX=1") == ("old", "2fed222", ["-DX=1"], {})
    label, ref, flags, launch = kv.parse("rq256=-DPREFILL_ALT,threads=256,shared=72960,rows=32")
    assert (label, ref, flags) == ("rq256", None, ["-DPREFILL_ALT"])
    assert launch == {"threads": 256, "shared": 72960, "rows": 32}


@pytest.mark.parametrize("spec", ["x=-O3", "x=threads=abc", "x=blocks=2", "bad label="])
def test_parse_rejects_anything_else(spec):
    with pytest.raises(SystemExit):
        _load().parse(spec)


@pytest.mark.network
def test_build_records_the_prefill_launch_in_the_index_and_launch_json(tmp_path):
    from tests.helpers.nvrtc12 import nvrtc12_lib

    kv = _load()
    cache = kv.build_variant("minb2", None, ["-DDECODE_MIN_BLOCKS=2"],
                             tmp_path, str(nvrtc12_lib()), {"threads": 256, "shared": 44416, "rows": 16})
    index = json.loads((cache / "index" / "sm70-d512-attention.json").read_text())
    entries = {e["name"]: e for s in index["spec"]["sources"] for e in s["entries"]}
    assert (entries["prefill_d512"]["threads"], entries["prefill_d512"]["shared_bytes"]) == (256, 44416)
    assert (entries["paged_decode_d512"]["threads"], entries["paged_decode_d512"]["shared_bytes"]) == (256, 93888)
    assert (entries["prefill_d256"]["threads"], entries["prefill_d256"]["shared_bytes"]) == (512, 94720)   # only D=512
    assert json.loads((cache / "launch.json").read_text()) == {"prefill_rows": 16}
