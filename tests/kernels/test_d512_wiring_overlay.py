"""The sm70-d512-attention wiring overlay on real vLLM releases, and its runtime module's routing (every head dim)."""

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
RELEASES = ["0.19.0", "0.19.1", "0.20.0", "0.22.0", "0.26.0", "0.30.0", "0.33.0"]
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
@pytest.mark.parametrize("version", ["0.19.1", "0.20.0", "0.33.0"])
def test_apply_routes_triton_forward_and_revert_restores(version, vllm_root):
    root = vllm_root(version)
    before = (root / TRITON).read_bytes()
    ovs = _overlay()
    apply(ovs, root)
    assert status(ovs, root).overlays[0].status == "applied"
    text = (root / TRITON).read_text()
    compile(text, TRITON, "exec")
    route = text.index("sm70_attention_forward(self, query, key_cache, value_cache, output, attn_metadata, layer)")
    assert f"# overlay:{OID} v2 route-d512" in text
    # every head dim: the route is no longer behind a head_size test
    assert "self.head_size == 512" not in text
    # the route sits after the KV cache views exist and before Triton's own call
    assert text.rindex("key_cache", 0, route) < route < text.index("unified_attention(\n", route)
    mod = (root / MODULE).read_text()
    assert mod.splitlines()[0].startswith(f"# overlay:{OID} v2 d512-module")
    compile(mod, MODULE, "exec")
    assert "from vllm.v1.attention.backends import sm70_d512_kernels" in mod
    launcher = (root / LAUNCHER_FILE).read_text()
    assert launcher.splitlines()[0].startswith(f"# overlay:{OID} v2 d512-launcher")
    assert "class SM70Attention" in launcher and "D512Attention = SM70Attention" in launcher
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
    kv_cache_dtype = "auto"


class _Layer:
    _q_scale_float = 1.0

    def __init__(self, torch):
        self._k_scale = torch.tensor([0.5])
        self._v_scale = torch.tensor([0.25])


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
        self.kw = []

    def decode(self, q, k, v, bt, sl, max_seq_len, scale, window=0, out=None, **kw):
        self.calls.append(("decode", tuple(q.shape), max_seq_len, scale, window, tuple(out.shape)))
        self.kw.append(kw)

    def prefill(self, q, k, v, bt, cu, sl, max_q, scale, causal=True, window=0, out=None, **kw):
        self.calls.append(("prefill", tuple(q.shape), max_q, scale, window, causal))
        self.kw.append(kw)


def _tensors(torch, dtype, head_dim=512, cache_dtype=None):
    q = torch.zeros((3, 4, head_dim), dtype=dtype)
    kc = torch.zeros((2, 16, 1, head_dim), dtype=cache_dtype or dtype)
    out = torch.zeros((3, 4 * head_dim), dtype=dtype)
    return q, kc, out


def _impl(head_dim=512, **attrs):
    impl = _Impl()
    impl.head_size = head_dim
    for k, v in attrs.items():
        setattr(impl, k, v)
    return impl


def test_decode_batch_goes_to_the_decode_kernel_with_the_window(route):
    mod, torch = route
    rec = _Recorder()
    mod._state["attn"] = rec
    impl = _Impl()
    impl.sliding_window = (1023, 0)
    q, kc, out = _tensors(torch, torch.float16)
    assert mod.sm70_attention_forward(impl, q, kc, kc, out, _Meta(torch, 1), _Layer(torch)) is True
    assert rec.calls == [("decode", (3, 4, 512), 9, 0.05, 1024, (3, 4, 512))]
    assert rec.kw == [{}]   # fp16: no format or scales


def test_mixed_batch_goes_to_the_causal_prefill_kernel(route):
    mod, torch = route
    rec = _Recorder()
    mod._state["attn"] = rec
    q, kc, out = _tensors(torch, torch.float16)
    assert mod.sm70_attention_forward(_Impl(), q, kc, kc, out, _Meta(torch, 7), _Layer(torch)) is True
    assert rec.calls == [("prefill", (3, 4, 512), 7, 0.05, 0, True)]


@pytest.mark.parametrize("head_dim", [64, 128, 256, 512])
def test_every_head_dim_of_the_family_is_routed(route, head_dim):
    mod, torch = route
    rec = _Recorder()
    mod._state["attn"] = rec
    q, kc, out = _tensors(torch, torch.float16, head_dim)
    impl = _impl(head_dim, sliding_window=(511, 0))
    assert mod.sm70_attention_forward(impl, q, kc, kc, out, _Meta(torch, 1), _Layer(torch)) is True
    assert mod.sm70_attention_forward(impl, q, kc, kc, out, _Meta(torch, 7), _Layer(torch)) is True
    assert rec.calls == [("decode", (3, 4, head_dim), 9, 0.05, 512, (3, 4, head_dim)),
                         ("prefill", (3, 4, head_dim), 7, 0.05, 512, True)]


def test_the_route_covers_exactly_the_launchers_head_dims(route):
    mod, _ = route
    assert mod.HEAD_DIMS == sys.modules[LAUNCHER].HEAD_DIMS


@pytest.mark.parametrize("kv_cache_dtype, cache_attr, fmt", [
    ("fp8", "float8_e4m3fn", "e4m3"),
    ("fp8_e4m3", "float8_e4m3fn", "e4m3"),
    # vLLM views every fp8 cache as the platform's fp8 type (e4m3fn on CUDA), e5m2 too: the format
    # comes from kv_cache_dtype, not from the view's dtype
    ("fp8_e5m2", "float8_e4m3fn", "e5m2"),
    ("fp8_e5m2", "uint8", "e5m2"),
])
def test_fp8_caches_go_to_the_fp8_kernels_with_the_layers_scale_tensors(route, kv_cache_dtype, cache_attr, fmt):
    mod, torch = route
    rec = _Recorder()
    mod._state["attn"] = rec
    q, kc, out = _tensors(torch, torch.float16, 256, cache_dtype=getattr(torch, cache_attr))
    layer = _Layer(torch)
    impl = _impl(256, kv_cache_dtype=kv_cache_dtype)
    assert mod.sm70_attention_forward(impl, q, kc, kc, out, _Meta(torch, 1), layer) is True
    assert mod.sm70_attention_forward(impl, q, kc, kc, out, _Meta(torch, 7), layer) is True
    assert [c[0] for c in rec.calls] == ["decode", "prefill"]
    for kw in rec.kw:   # the tensors themselves (read on the device: CUDA graphs see updates)
        assert kw["kv_format"] == fmt and kw["k_scale"] is layer._k_scale and kw["v_scale"] is layer._v_scale


@pytest.mark.parametrize("change, reason", [
    ("fp32", "query dtype torch.float32"),
    ("softcap", "logits soft-cap"),
    ("alibi", "ALiBi"),
    ("sinks", "attention sinks"),
    ("right-window", "a right-hand window (10)"),
    ("head-dim-96", "head dim 96 (the kernels cover 64/128/256/512)"),
    ("head-dim-32", "head dim 32 (the kernels cover 64/128/256/512)"),
    ("bf16-cache", "KV cache dtype torch.bfloat16"),
    ("int8-per-token-head", "kv_cache_dtype 'int8_per_token_head'"),
    ("fp8-per-token-head", "kv_cache_dtype 'fp8_per_token_head'"),
    ("q-scale", "a query scale other than 1.0"),
    ("lookback", "chunk lookback"),
    ("cascade", "cascade attention"),
])
def test_unsupported_layers_stay_on_triton_with_one_line_naming_why(route, caplog, change, reason):
    mod, torch = route
    rec = _Recorder()
    mod._state["attn"] = rec
    impl, layer, meta = _Impl(), _Layer(torch), _Meta(torch, 1)
    dtype, cache_dtype, hd = torch.float16, None, 512
    if change == "fp32":
        dtype = torch.float32
    elif change == "softcap":
        impl.logits_soft_cap = 30.0
    elif change == "alibi":
        impl.alibi_slopes = torch.ones(4)
    elif change == "sinks":
        impl.sinks = torch.ones(4)
    elif change == "right-window":
        impl.sliding_window = (10, 10)
    elif change.startswith("head-dim-"):
        hd = int(change.rsplit("-", 1)[1])
        impl.head_size = hd
    elif change == "bf16-cache":
        cache_dtype = torch.bfloat16
    elif change.endswith("per-token-head"):
        impl.kv_cache_dtype = change.replace("-per-token-head", "_per_token_head")
        impl._is_per_token_head_quant = True
        cache_dtype = torch.uint8
    elif change == "q-scale":
        impl.kv_cache_dtype = "fp8"
        cache_dtype = torch.float8_e4m3fn
        layer._q_scale_float = 2.0
    elif change == "lookback":
        impl.chunk_lookback = 4
    elif change == "cascade":
        meta.use_cascade = True
    q, kc, out = _tensors(torch, dtype, hd, cache_dtype)
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            assert mod.sm70_attention_forward(impl, q, kc, kc, out, meta, layer) is False
    assert rec.calls == []
    lines = [r.getMessage() for r in caplog.records if "stay on Triton" in r.getMessage()]
    assert lines == [f"sm70 attention: head_dim-{hd} layers stay on Triton: " + lines[0].split("stay on Triton: ")[1]]
    assert lines[0].split("stay on Triton: ")[1].startswith(reason)


def test_unloadable_kernels_fall_back_to_triton_and_warn_once_per_head_dim(route, monkeypatch, tmp_path, caplog):
    mod, torch = route
    monkeypatch.setenv("OVERLAY_SM70_ATTENTION", "force")   # route on this (GPU-less) machine
    monkeypatch.setenv("OVERLAY_KERNEL_CACHE", str(tmp_path))  # nothing built there
    with caplog.at_level(logging.WARNING):
        for hd in (512, 512, 256, 256):
            q, kc, out = _tensors(torch, torch.float16, hd)
            assert mod.sm70_attention_forward(_impl(hd), q, kc, kc, out, _Meta(torch, 1), _Layer(torch)) is False
    lines = [r.getMessage() for r in caplog.records if "using Triton" in r.getMessage()]
    assert [ln.split(" layers")[0] for ln in lines] == ["sm70 attention: head_dim-512", "sm70 attention: head_dim-256"]
    assert all("kernels unavailable (" in ln for ln in lines)


@pytest.mark.parametrize("env", ["OVERLAY_SM70_ATTENTION", "OVERLAY_D512"])
def test_disabled_by_either_switch_name(route, monkeypatch, env):
    mod, torch = route
    monkeypatch.delenv("OVERLAY_SM70_ATTENTION", raising=False)
    monkeypatch.setenv(env, "off")
    q, kc, out = _tensors(torch, torch.float16)
    assert mod.sm70_attention_forward(_Impl(), q, kc, kc, out, _Meta(torch, 1), _Layer(torch)) is False
    assert mod._state["attn"] is None


def test_the_new_switch_name_wins_over_the_old_one(route, monkeypatch):
    mod, _ = route
    monkeypatch.setenv("OVERLAY_SM70_ATTENTION", "off")
    monkeypatch.setenv("OVERLAY_D512", "force")
    assert mod.mode() == "off"
    monkeypatch.delenv("OVERLAY_SM70_ATTENTION")
    assert mod.mode() == "force"
    monkeypatch.setenv("OVERLAY_D512", "sometimes")
    assert mod.mode() == "auto"


def test_old_entry_point_name_still_routes(route):
    mod, torch = route
    rec = _Recorder()
    mod._state["attn"] = rec
    q, kc, out = _tensors(torch, torch.float16)
    assert mod.sm70_d512_forward(_Impl(), q, kc, kc, out, _Meta(torch, 1)) is True
    assert rec.calls[0][0] == "decode"


# --- the switch: off by default on anything but compute capability 7.0 -------------------------


class _Loaded:
    """What the launcher's load returns: objects for the log line, decode/prefill recording like _Recorder."""

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
    family = sys.modules[LAUNCHER]
    loads = []
    kernels = _Loaded(splits=4)

    def load(cache=None, **kw):
        loads.append(cache)
        return kernels

    monkeypatch.setattr(family, "load", load)
    return loads, kernels


@pytest.mark.parametrize("env", ["OVERLAY_SM70_ATTENTION", "OVERLAY_D512"])
@pytest.mark.parametrize("mode, capability, routed", [
    (None, (9, 0), False),       # default (unset) on an H200: stays on Triton, kernels never loaded
    ("auto", (8, 6), False),     # explicit auto on an RTX 3090: the same
    (None, (7, 0), True),        # default on a V100: routed
    ("force", (9, 0), True),     # the test switch: routed on any GPU
    ("off", (7, 0), False),      # off wins even on a V100
])
def test_route_default_is_sm70_only_and_force_is_an_explicit_switch(route, fake_loader, monkeypatch, env, mode,
                                                                    capability, routed):
    mod, torch = route
    loads, kernels = fake_loader
    monkeypatch.delenv("OVERLAY_SM70_ATTENTION", raising=False)
    monkeypatch.delenv("OVERLAY_D512", raising=False)
    if mode is not None:
        monkeypatch.setenv(env, mode)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
    q, kc, out = _tensors(torch, torch.float16, 256)
    assert mod.sm70_attention_forward(_impl(256), q, kc, kc, out, _Meta(torch, 1), _Layer(torch)) is routed
    assert len(loads) == (1 if routed else 0)
    assert kernels.calls == (["decode"] if routed else [])


def test_marker_lines_name_each_kind_of_launch_once_per_head_dim_with_the_pid(route, fake_loader, monkeypatch, caplog):
    mod, torch = route
    monkeypatch.setenv("OVERLAY_SM70_ATTENTION", "force")
    with caplog.at_level(logging.INFO):
        for hd in (512, 256):
            q, kc, out = _tensors(torch, torch.float16, hd)
            for mql in (1, 1, 7, 7):   # decode twice (4 splits), then a prefill whose context exceeds the chunk, twice
                assert mod.sm70_attention_forward(_impl(hd), q, kc, kc, out, _Meta(torch, mql), _Layer(torch)) is True
    ran = [r.getMessage() for r in caplog.records if " ran on sm70-d512-attention kernels in pid " in r.getMessage()]
    kinds = [m.split(" ran ")[0] for m in ran]
    assert kinds == [f"head_dim-{hd} attention: {k}" for hd in (512, 256)
                     for k in ("decode", "split decode", "prefill", "chunked prefill")]
    assert all(f"pid {os.getpid()}" in m for m in ran)
    assert "4 splits" in ran[1] and "max_seq_len 9" in ran[3] and "kv fp16" in ran[0]
    assert sum("sm70-d512-attention kernels (compute_70 ptx)" in r.getMessage() for r in caplog.records) == 1


def test_decode_captured_in_a_cuda_graph_sizes_its_splits_for_the_longest_context(route, monkeypatch):
    """Under capture vLLM's dummy decode has seq_len 1; the graph replays at any length, so the route
    passes the block table's capacity (max blocks x block size) as max_seq_len instead."""
    mod, torch = route
    rec = _Recorder()
    mod._state["attn"] = rec
    q, kc, out = _tensors(torch, torch.float16)
    meta = _Meta(torch, 1)
    meta.block_table = torch.zeros((3, 2048), dtype=torch.int32)   # 2048 blocks x 16 = 32768 tokens
    monkeypatch.setattr(mod, "_capturing", lambda query: True)
    assert mod.sm70_attention_forward(_Impl(), q, kc, kc, out, meta, _Layer(torch)) is True
    monkeypatch.setattr(mod, "_capturing", lambda query: False)
    assert mod.sm70_attention_forward(_Impl(), q, kc, kc, out, meta, _Layer(torch)) is True
    assert [c[2] for c in rec.calls] == [32768, 9]


def test_capture_check_asks_the_query_device_not_nvml_on_every_call(route, monkeypatch):
    """torch.cuda.is_available() is an NVML query per call under vLLM's PYTORCH_NVML_BASED_CUDA_CHECK=1;
    the route's per-call capture check must not call it (a CPU query is never being captured)."""
    mod, torch = route
    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: asked.append(1) or True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: asked.append(2) or True)
    q, _kc, _out = _tensors(torch, torch.float16)
    assert mod._capturing(q) is False
    assert asked == []


# --- the names and formats the route relies on, read from the real 0.19.1 and 0.20.0 sources ------


def _class(tree, name):
    import ast

    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def _method(cls, name):
    import ast

    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)


@pytest.mark.network
@pytest.mark.parametrize("version", ["0.19.1", "0.20.0"])
def test_every_name_the_route_reads_exists_in_the_release(version, vllm_root):
    import ast

    root = vllm_root(version)
    tree = ast.parse((root / TRITON).read_text())
    impl = _class(tree, "TritonAttentionImpl")
    stored = {a.attr for a in ast.walk(_method(impl, "__init__"))
              if isinstance(a, ast.Attribute) and isinstance(a.ctx, ast.Store) and getattr(a.value, "id", "") == "self"}
    assert {"num_heads", "head_size", "scale", "sliding_window", "alibi_slopes", "logits_soft_cap", "sinks",
            "kv_cache_dtype"} <= stored
    fwd = _method(impl, "forward")
    assert {"layer", "query", "output", "output_scale", "attn_metadata"} <= {a.arg for a in fwd.args.args}
    # key_cache / value_cache are bound (and fp8 caches viewed as the platform fp8 type) before the anchor
    anchor = next(s for s in ast.walk(fwd) if isinstance(s, ast.Assign) and ast.unparse(s) == "cu_seqlens_q = attn_metadata.query_start_loc")
    before = [s for s in ast.walk(fwd) if isinstance(s, ast.Assign) and s.lineno < anchor.lineno]
    bound = {ast.unparse(t) for s in before for t in s.targets}
    assert {"(key_cache, value_cache)", "key_cache"} <= bound
    assert any(ast.unparse(s) == "key_cache = key_cache.view(self.fp8_dtype)" for s in before)
    meta = _class(tree, "TritonAttentionMetadata")
    fields = {n.target.id for n in meta.body if isinstance(n, ast.AnnAssign)}
    fields |= {n.name for n in meta.body if isinstance(n, ast.FunctionDef)}
    assert {"num_actual_tokens", "max_query_len", "query_start_loc", "max_seq_len", "seq_lens", "block_table",
            "use_cascade", "mm_prefix_range_tensor"} <= fields
    layer = (root / "vllm/model_executor/layers/attention/attention.py").read_text()
    # per-tensor scales: one-element fp32 buffers on the layer, updated in place (copy_/fill_: the pointer the
    # kernels read stays valid in CUDA graphs), and _q_scale_float, the float vLLM asserts is 1.0
    for name in ('register_buffer("_k_scale", torch.tensor(1.0, dtype=torch.float32))',
                 'register_buffer("_v_scale", torch.tensor(1.0, dtype=torch.float32))',
                 "self._k_scale.copy_(", "self._q_scale_float = "):
        assert name in layer, name
    assert "k_descale=layer._k_scale.expand(descale_shape)" in ast.unparse(fwd) or \
        "k_descale = layer._k_scale.expand(descale_shape)" in ast.unparse(fwd)


@pytest.mark.network
@pytest.mark.parametrize("version", ["0.19.1", "0.20.0"])
def test_each_kv_cache_dtype_the_release_offers_is_routed_or_named_as_a_fallback(version, vllm_root, route):
    import ast

    mod, torch = route
    root = vllm_root(version)
    tree = ast.parse((root / TRITON).read_text())
    backend = _class(tree, "TritonAttentionBackend")
    node = next(n for n in backend.body if isinstance(n, ast.AnnAssign) and n.target.id == "supported_kv_cache_dtypes")
    offered = ast.literal_eval(node.value)
    # what vLLM allocates for each string (STR_DTYPE_TO_TORCH_DTYPE), then views at the anchor
    cache = {"auto": torch.float16, "float16": torch.float16, "bfloat16": torch.bfloat16,
             "fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e4m3fn,
             "int8_per_token_head": torch.int8, "fp8_per_token_head": torch.float8_e4m3fn}
    expected = {"auto": None, "float16": None, "fp8": None, "fp8_e4m3": None, "fp8_e5m2": None,
                "bfloat16": "kv_cache_dtype 'bfloat16'", "int8_per_token_head": "kv_cache_dtype 'int8_per_token_head'",
                "fp8_per_token_head": "kv_cache_dtype 'fp8_per_token_head'"}
    assert set(offered) <= set(expected), set(offered) - set(expected)
    for dt in offered:
        impl = _impl(256, kv_cache_dtype=dt, _is_per_token_head_quant=dt.endswith("per_token_head"))
        q, kc, _ = _tensors(torch, torch.float16, 256, cache_dtype=cache[dt])
        why = mod.route_reason(impl, _Layer(torch), q, kc, _Meta(torch, 1))
        assert (why is None) if expected[dt] is None else why.startswith(expected[dt]), (dt, why)
    assert ("int8_per_token_head" in offered) == (version == "0.20.0")
