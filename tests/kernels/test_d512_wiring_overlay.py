"""The sm70-d512-attention wiring overlay on real vLLM releases, and its runtime module's routing."""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import types

import pytest

from manager.catalog import Catalog
from manager.overlays import apply, load_overlays, revert, status, status_on_release
from tests.helpers import SHIPPED_OVERLAYS

OID = "sm70-d512-attention"
LAUNCHER = "vllm.v1.attention.backends.sm70_d512_kernels"
RELEASES = ["0.19.0", "0.20.0", "0.22.0", "0.26.0", "0.30.0", "0.33.0"]
TRITON = "vllm/v1/attention/backends/triton_attn.py"
MODULE = "vllm/v1/attention/backends/sm70_d512_attn.py"
LAUNCHER_FILE = "vllm/v1/attention/backends/sm70_d512_kernels.py"


def _overlay():
    return [o for o in load_overlays(Catalog.locate(SHIPPED_OVERLAYS.parent)) if o.manifest.id == OID]


@pytest.mark.network
@pytest.mark.parametrize("version", RELEASES)
def test_pristine_release_reports_pending_with_the_anchor_found_once(version):
    rep = status_on_release(version, Catalog.locate(SHIPPED_OVERLAYS.parent), [OID])
    (ov,) = rep.overlays
    assert ov.status == "pending", [(t.path, t.status, t.detail) for t in ov.targets]
    triton = next(t for t in ov.targets if t.path == TRITON)
    assert "anchor found once" in triton.detail


@pytest.mark.network
@pytest.mark.parametrize("version", ["0.20.0", "0.33.0"])
def test_apply_routes_triton_forward_and_revert_restores(version, vllm_root):
    root = vllm_root(version)
    before = (root / TRITON).read_bytes()
    ovs = _overlay()
    apply(ovs, root)
    assert status(ovs, root).overlays[0].status == "applied"
    text = (root / TRITON).read_text()
    compile(text, TRITON, "exec")
    route = text.index("sm70_d512_forward(self, query, key_cache, value_cache, output, attn_metadata)")
    assert f"# overlay:{OID} v1 route-d512" in text
    # the route sits after the KV cache views exist and before Triton's own call
    assert text.rindex("key_cache", 0, route) < route < text.index("unified_attention(\n", route)
    mod = (root / MODULE).read_text()
    assert mod.splitlines()[0].startswith(f"# overlay:{OID} v1 d512-module")
    compile(mod, MODULE, "exec")
    assert "from vllm.v1.attention.backends import sm70_d512_kernels" in mod
    launcher = (root / LAUNCHER_FILE).read_text()
    assert launcher.splitlines()[0].startswith(f"# overlay:{OID} v1 d512-launcher")
    assert "class D512Attention" in launcher
    compile(launcher, LAUNCHER_FILE, "exec")
    apply(ovs, root)  # idempotent
    assert (root / TRITON).read_text() == text
    revert(ovs, ovs, root)
    assert (root / TRITON).read_bytes() == before and not (root / MODULE).exists() and not (root / LAUNCHER_FILE).exists()


# --- the runtime module inserted into vLLM, exercised with a stub vllm.logger ---------------------


@pytest.fixture
def route(monkeypatch):
    """The routed module as vLLM imports it: its `vllm.v1.attention.backends.sm70_d512_kernels`
    sibling is the overlay's real launcher (loaded from files/), vllm.logger a stub."""
    torch = pytest.importorskip("torch")
    from tests.kernels.launcher import d512_launcher

    vlog = types.ModuleType("vllm.logger")
    vlog.init_logger = lambda name: logging.getLogger(name)
    for name in ("vllm", "vllm.v1", "vllm.v1.attention", "vllm.v1.attention.backends"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.logger", vlog)
    launcher = d512_launcher()
    monkeypatch.setitem(sys.modules, LAUNCHER, launcher)
    monkeypatch.setattr(sys.modules["vllm.v1.attention.backends"], "sm70_d512_kernels", launcher, raising=False)
    spec = importlib.util.spec_from_file_location("sm70_d512_attn_under_test", SHIPPED_OVERLAYS / OID / "files" / "sm70_d512_attn.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, torch


class _Impl:
    num_heads, head_size, scale = 4, 512, 0.05
    alibi_slopes = None
    logits_soft_cap = 0
    sinks = None
    sliding_window = (-1, -1)


class _Meta:
    def __init__(self, torch, max_query_len):
        self.max_query_len = max_query_len
        self.num_actual_tokens = 3
        self.seq_lens = torch.tensor([5, 9, 2], dtype=torch.int32)
        self.query_start_loc = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
        self.block_table = torch.zeros((3, 1), dtype=torch.int32)
        self.max_seq_len = 9
        self.mm_prefix_range_tensor = None
        self.use_cascade = False


class _Recorder:
    def __init__(self):
        self.calls = []

    def decode(self, q, k, v, bt, sl, max_seq_len, scale, window=0, out=None):
        self.calls.append(("decode", tuple(q.shape), max_seq_len, scale, window, tuple(out.shape)))

    def prefill(self, q, k, v, bt, cu, sl, max_q, scale, causal=True, window=0, out=None):
        self.calls.append(("prefill", tuple(q.shape), max_q, scale, window, causal))


def _tensors(torch, dtype):
    q = torch.zeros((3, 4, 512), dtype=dtype)
    kc = torch.zeros((2, 16, 1, 512), dtype=dtype)
    out = torch.zeros((3, 4 * 512), dtype=dtype)
    return q, kc, out


def test_decode_batch_goes_to_the_decode_kernel_with_the_window(route):
    mod, torch = route
    rec = _Recorder()
    mod._state["attn"] = rec
    impl = _Impl()
    impl.sliding_window = (1023, 0)
    q, kc, out = _tensors(torch, torch.float16)
    assert mod.sm70_d512_forward(impl, q, kc, kc, out, _Meta(torch, 1)) is True
    assert rec.calls == [("decode", (3, 4, 512), 9, 0.05, 1024, (3, 4, 512))]


def test_mixed_batch_goes_to_the_causal_prefill_kernel(route):
    mod, torch = route
    rec = _Recorder()
    mod._state["attn"] = rec
    q, kc, out = _tensors(torch, torch.float16)
    assert mod.sm70_d512_forward(_Impl(), q, kc, kc, out, _Meta(torch, 7)) is True
    assert rec.calls == [("prefill", (3, 4, 512), 7, 0.05, 0, True)]


@pytest.mark.parametrize("change", ["fp32", "softcap", "alibi", "sinks", "right-window"])
def test_unsupported_layers_stay_on_triton(route, change):
    mod, torch = route
    rec = _Recorder()
    mod._state["attn"] = rec
    impl = _Impl()
    dtype = torch.float16
    if change == "fp32":
        dtype = torch.float32
    elif change == "softcap":
        impl.logits_soft_cap = 30.0
    elif change == "alibi":
        impl.alibi_slopes = torch.ones(4)
    elif change == "sinks":
        impl.sinks = torch.ones(4)
    else:
        impl.sliding_window = (10, 10)
    q, kc, out = _tensors(torch, dtype)
    assert mod.sm70_d512_forward(impl, q, kc, kc, out, _Meta(torch, 1)) is False
    assert rec.calls == []


def test_unloadable_kernels_fall_back_to_triton_and_warn_once(route, monkeypatch, tmp_path, caplog):
    mod, torch = route
    monkeypatch.setenv("OVERLAY_D512", "force")   # route on this (GPU-less) machine
    monkeypatch.setenv("OVERLAY_KERNEL_CACHE", str(tmp_path))  # nothing built there
    q, kc, out = _tensors(torch, torch.float16)
    with caplog.at_level(logging.WARNING):
        assert mod.sm70_d512_forward(_Impl(), q, kc, kc, out, _Meta(torch, 1)) is False
        assert mod.sm70_d512_forward(_Impl(), q, kc, kc, out, _Meta(torch, 1)) is False
    assert sum("using Triton" in r.message for r in caplog.records) == 1


def test_disabled_by_environment(route, monkeypatch):
    mod, torch = route
    monkeypatch.setenv("OVERLAY_D512", "off")
    q, kc, out = _tensors(torch, torch.float16)
    assert mod.sm70_d512_forward(_Impl(), q, kc, kc, out, _Meta(torch, 1)) is False
    assert mod._state["attn"] is None


# --- OVERLAY_D512: a test switch, off by default on anything but compute capability 7.0 ---------


class _Loaded:
    """What d512.load returns: objects for the log line, decode/prefill recording like _Recorder."""

    def __init__(self, splits=1):
        self.k = types.SimpleNamespace(objects=[types.SimpleNamespace(arch="compute_70", kind="ptx")])
        self.last_splits = splits
        self.calls = []

    def decode(self, *a, **kw):
        self.calls.append("decode")

    def prefill(self, *a, **kw):
        self.calls.append("prefill")


@pytest.fixture
def fake_loader(route, monkeypatch):
    """The launcher's load() replaced by a recorder of its calls."""
    d512 = sys.modules[LAUNCHER]
    loads = []
    kernels = _Loaded(splits=4)

    def load(cache=None, **kw):
        loads.append(cache)
        return kernels

    monkeypatch.setattr(d512, "load", load)
    return loads, kernels


@pytest.mark.parametrize("mode, capability, routed", [
    (None, (9, 0), False),       # default (unset) on an H200: stays on Triton, kernels never loaded
    ("auto", (8, 6), False),     # explicit auto on an RTX 3090: the same
    (None, (7, 0), True),        # default on a V100: routed
    ("force", (9, 0), True),     # the test switch: routed on any GPU
    ("off", (7, 0), False),      # off wins even on a V100
])
def test_route_default_is_sm70_only_and_force_is_an_explicit_switch(route, fake_loader, monkeypatch, mode, capability, routed):
    mod, torch = route
    loads, kernels = fake_loader
    if mode is None:
        monkeypatch.delenv("OVERLAY_D512", raising=False)
    else:
        monkeypatch.setenv("OVERLAY_D512", mode)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
    q, kc, out = _tensors(torch, torch.float16)
    assert mod.sm70_d512_forward(_Impl(), q, kc, kc, out, _Meta(torch, 1)) is routed
    assert len(loads) == (1 if routed else 0)
    assert kernels.calls == (["decode"] if routed else [])


def test_marker_lines_name_each_kind_of_launch_once_with_the_pid(route, fake_loader, monkeypatch, caplog):
    mod, torch = route
    monkeypatch.setenv("OVERLAY_D512", "force")
    q, kc, out = _tensors(torch, torch.float16)
    with caplog.at_level(logging.INFO):
        for mql in (1, 1, 7, 7):   # decode twice (4 splits), then a prefill whose context exceeds the chunk, twice
            assert mod.sm70_d512_forward(_Impl(), q, kc, kc, out, _Meta(torch, mql)) is True
    ran = [r.getMessage() for r in caplog.records if " ran on sm70-d512-attention kernels in pid " in r.getMessage()]
    kinds = [m.split("head_dim-512 attention: ")[1].split(" ran ")[0] for m in ran]
    assert kinds == ["decode", "split decode", "prefill", "chunked prefill"]
    assert all(f"pid {os.getpid()}" in m for m in ran)
    assert "4 splits" in ran[1] and "max_seq_len 9" in ran[3]
    assert any("sm70-d512-attention kernels (compute_70 ptx)" in r.getMessage() for r in caplog.records)


def test_decode_captured_in_a_cuda_graph_sizes_its_splits_for_the_longest_context(route, monkeypatch):
    """Under capture vLLM's dummy decode has seq_len 1; the graph replays at any length, so the route
    passes the block table's capacity (max blocks x block size) as max_seq_len instead."""
    mod, torch = route
    rec = _Recorder()
    mod._state["attn"] = rec
    q, kc, out = _tensors(torch, torch.float16)
    meta = _Meta(torch, 1)
    meta.block_table = torch.zeros((3, 2048), dtype=torch.int32)   # 2048 blocks x 16 = 32768 tokens
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert mod.sm70_d512_forward(_Impl(), q, kc, kc, out, meta) is True
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert mod.sm70_d512_forward(_Impl(), q, kc, kc, out, meta) is True
    assert [c[2] for c in rec.calls] == [32768, 9]
