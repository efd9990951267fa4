"""The CUDA driver-API runtime and the d512 launcher, on a machine without a GPU."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import pytest

from manager.errors import BuildError
from manager.kernels import runtime
from manager.kernels.spec import EntryPoint
from tests.helpers import REPO_ROOT
from tests.kernels.launcher import d512_launcher


def test_runtime_and_the_d512_launcher_import_without_torch_or_a_gpu():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import manager.kernels.runtime, manager.kernels\n"
            "from tests.kernels.launcher import d512_launcher; d512_launcher()\n"
            "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_missing_driver_library_is_a_builderror():
    with pytest.raises(BuildError, match="cannot load the CUDA driver"):
        runtime.Driver("/nonexistent/libcuda.so.1")


OBJECTS = [
    {"source": "a.cu", "arch": "compute_70", "kind": "ptx", "path": "p70"},
    {"source": "a.cu", "arch": "sm_70", "kind": "cubin", "path": "c70"},
    {"source": "a.cu", "arch": "sm_86", "kind": "cubin", "path": "c86"},
]


@pytest.mark.parametrize("cc,prefer,path", [
    ((7, 0), "auto", "c70"),
    ((7, 0), "ptx", "p70"),
    ((8, 6), "auto", "c86"),
    ((9, 0), "auto", "p70"),   # no sm_90 cubin: the driver JIT-compiles the compute_70 PTX
    ((9, 0), "ptx", "p70"),
])
def test_select_prefers_exact_cubin_else_newest_compatible_ptx(cc, prefer, path):
    assert runtime._select(OBJECTS, cc, prefer)["a.cu"]["path"] == path


@pytest.mark.parametrize("cc,prefer", [((9, 0), "cubin"), ((6, 1), "auto")])
def test_select_refuses_images_that_cannot_run(cc, prefer):
    with pytest.raises(BuildError, match="overlay build --arch"):
        runtime._select(OBJECTS, cc, prefer)


def test_load_without_a_build_names_the_build_command(tmp_path):
    with pytest.raises(BuildError, match=r"run `overlay build sm70-d512-attention --cache"):
        runtime.load_overlay_kernels("sm70-d512-attention", cache=tmp_path)


class _FakeLib:
    def __init__(self):
        self.calls = []

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, smem, stream, argv, extra):
        raw = [ctypes.string_at(argv[i], 8) for i in range(len(argv))]  # copied while the holders live
        self.calls.append((fn, (gx, gy, gz), (bx, by, bz), smem, stream.value, raw))
        return 0


class _FakeDriver:
    def __init__(self):
        self.lib = _FakeLib()

    def check(self, rc, what, log=""):
        assert rc == 0


def test_launch_marshals_parameters_by_declared_type():
    entry = EntryPoint.model_validate({"name": "k", "threads": 128, "shared_bytes": 4096,
                                       "params": ["ptr out", "i32 n", "i64 stride", "f32 scale"]})
    drv = _FakeDriver()
    k = runtime.Kernel(entry, 1234, drv)

    class T:  # a tensor-like object
        def data_ptr(self):
            return 0xDEAD000

    k.launch((3, 2), [T(), -7, 1 << 40, 0.5], stream=99)
    fn, grid, block, smem, stream, argv = drv.lib.calls[0]
    assert (fn, grid, block, smem, stream) == (1234, (3, 2, 1), (128, 1, 1), 4096, 99)
    import struct

    assert struct.unpack("<Q", argv[0])[0] == 0xDEAD000
    assert struct.unpack("<i", argv[1][:4])[0] == -7
    assert struct.unpack("<q", argv[2])[0] == 1 << 40
    assert struct.unpack("<f", argv[3][:4])[0] == 0.5


def test_launch_with_wrong_argument_count_is_refused():
    entry = EntryPoint.model_validate({"name": "k", "params": ["ptr out", "i32 n"]})
    with pytest.raises(BuildError, match="1 arguments given, 2 declared"):
        runtime.Kernel(entry, 1, _FakeDriver()).launch((1,), [0], stream=0)


def _attn(slots_per_sm=1, sms=80):
    D512Attention = d512_launcher().D512Attention

    return D512Attention({}, sms, slots_per_sm)


@pytest.mark.parametrize("seqs,kvh,group,ctx", [(1, 2, 8, 32768), (8, 2, 8, 32768), (32, 2, 8, 4096),
                                                 (64, 8, 1, 512), (1, 1, 32, 100), (3, 16, 2, 70000),
                                                 (4, 2, 8, 4096), (1, 2, 8, 4096), (200, 2, 8, 8192)])
def test_split_choice_fills_one_wave_and_keeps_64_keys_per_split(seqs, kvh, group, ctx):
    import math

    a = _attn()
    s = a.pick_splits(seqs, kvh, group, ctx)
    base = seqs * kvh * math.ceil(group / 16)
    limit = min(256, math.ceil(ctx / 64))
    assert 1 <= s <= limit
    assert base * s <= max(a.slots, base)   # never more than one wave of blocks, unless unsplit
    if s < limit:   # one more split would spill into a second wave
        assert base * (s + 1) > a.slots


def test_split_choice_matches_the_h200_sweep():
    """The fastest split counts measured on the H200 (132 SMs, 1 decode block per SM; docs/kernels.md)."""
    a = _attn(sms=132)
    assert a.pick_splits(1, 2, 8, 4096) == 64
    assert a.pick_splits(4, 2, 8, 32768) == 16
    assert a.pick_splits(8, 2, 8, 32768) == 8
    assert a.pick_splits(32, 2, 8, 32768) == 2


class _GridRecorder:
    def __init__(self):
        self.grids = []

    def launch(self, grid, args):
        self.grids.append(tuple(grid))


@pytest.mark.parametrize("rows,tiles", [(None, 4), (16, 7)])
def test_prefill_grid_counts_query_tiles_of_prefill_rows(rows, tiles):
    """32 rows per block (the committed kernel); a -DPREFILL_BM=16 build sets prefill_rows (kernel_variants.py)."""
    torch = pytest.importorskip("torch")
    D512Attention = d512_launcher().D512Attention

    rec = _GridRecorder()
    a = D512Attention({"prefill_d512": rec}, 80)
    if rows:
        a.prefill_rows = rows
    cache = torch.zeros((4, 16, 2, 512), dtype=torch.float16)
    q = torch.zeros((100, 16, 512), dtype=torch.float16)
    a.prefill(q, cache, cache, torch.zeros((1, 4), dtype=torch.int32), torch.tensor([0, 100]), torch.tensor([100]),
              100, 0.05)
    assert rec.grids == [(tiles, 1, 16)]


def test_prefill_refuses_caches_whose_in_block_offsets_need_64_bits():
    """The prefill computes slot * stride_token + head * stride_head in 32 bits (PREFILL_OFF32)."""
    torch = pytest.importorskip("torch")
    D512Attention = d512_launcher().D512Attention

    rec = _GridRecorder()
    a = D512Attention({"prefill_d512": rec}, 80)
    big = torch.empty_strided((4, 16, 2, 512), (2**32, 2**27, 512, 1), dtype=torch.float16, device="meta")
    q = torch.zeros((100, 16, 512), dtype=torch.float16)
    with pytest.raises(BuildError, match="below 2"):
        a.prefill(q, big, big, torch.zeros((1, 4), dtype=torch.int32), torch.tensor([0, 100]), torch.tensor([100]),
                  100, 0.05)
    assert rec.grids == []


def test_index_spec_lets_the_runtime_work_without_a_catalog(tmp_path, monkeypatch):
    """load_overlay_kernels reads the entry points from the index (as in the serving container)."""
    spec = {"sources": [{"path": "a.cu", "entries": [{"name": "k", "params": ["ptr out"]}]}]}
    (tmp_path / "index").mkdir()
    (tmp_path / "index" / "x.json").write_text(json.dumps({"format": 1, "overlay": "x", "spec": spec, "objects": [
        {"source": "a.cu", "arch": "compute_70", "kind": "ptx", "key": "0", "path": "img", "entries": ["k"]}]}))
    (tmp_path / "img").write_bytes(b"// ptx")
    loaded = []

    class D(_FakeDriver):
        def ensure_context(self, device=None):
            return 0, 1

        def compute_capability(self, dev):
            return (9, 0)

        def load_module(self, image):
            loaded.append(image)
            return 5

    d = D()
    d.lib.cuModuleGetFunction = lambda ref, mod, name: 0
    monkeypatch.setattr(runtime, "driver", lambda: d)
    ks = runtime.load_overlay_kernels("x", cache=tmp_path)
    assert list(ks) == ["k"] and loaded == [b"// ptx"] and ks.objects[0].arch == "compute_70"
