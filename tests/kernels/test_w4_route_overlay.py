"""The sm70-w4-gemm engine route on the real vLLM 0.19.1 and 0.20.0 sources.

The overlay is applied to each release's tree from PyPI; the classes the route touches are then executed from that
patched tree (CompressedTensorsConfig.get_quant_method / _get_scheme_from_parts / _check_scheme_supported, vLLM's
get_moe_method with its real Marlin test, CompressedTensorsWNA16MoEMethod, CompressedTensorsW4A4Nvfp4MoEMethod,
CompressedTensorsW4A4Fp4 / W4A16Fp4 and their create_weights / process_weights_after_loading), with the route module
the overlay writes. Only the GPU launcher is a stub (its load() returns a recorder of the launches), and the names
those classes import from the rest of vLLM are small stand-ins (parameters, the platform's capability, logger).
Each case asserts the chosen class, the weights as the kernels will read them, the recorded launch and the log line.
"""

from __future__ import annotations

import enum
import importlib.util
import logging
import sys
import types

import pytest

from manager.catalog import Catalog
from manager.overlays import apply, load_overlays, revert, status, status_on_release
from tests.helpers import SHIPPED_OVERLAYS
from tests.kernels.w4_launcher import w4_launcher
from tests.overlays.shipped.extracted import extract_def

torch = pytest.importorskip("torch")

OID = "sm70-w4-gemm"
Q = "vllm/model_executor/layers/quantization"
CT = f"{Q}/compressed_tensors"
CT_FILE = f"{CT}/compressed_tensors.py"
ROUTE_FILE = f"{Q}/sm70_w4_route.py"
LAUNCHER_FILE = f"{Q}/sm70_w4_kernels.py"
PKG = "vllm.model_executor.layers.quantization"
MOE_PKG = f"{PKG}.compressed_tensors.compressed_tensors_moe"


def _overlay():
    return [o for o in load_overlays(Catalog.locate(SHIPPED_OVERLAYS.parent)) if o.manifest.id == OID]


@pytest.mark.network
@pytest.mark.parametrize("version, expected", [("0.19.1", "pending"), ("0.20.0", "pending"),
                                               ("0.22.0", "not-applicable")])
def test_the_route_applies_to_the_releases_it_was_written_for(version, expected):
    rep = status_on_release(version, Catalog.locate(SHIPPED_OVERLAYS.parent), [OID])
    assert rep.overlays[0].status == expected, [(t.path, t.status, t.detail) for t in rep.overlays[0].targets]


@pytest.mark.network
@pytest.mark.parametrize("version", ["0.19.1", "0.20.0"])
def test_apply_inserts_both_routes_and_revert_restores(version, vllm_root):
    root = vllm_root(version)
    before = (root / CT_FILE).read_bytes()
    ovs = _overlay()
    apply(ovs, root)
    assert status(ovs, root).overlays[0].status == "applied"
    text = (root / CT_FILE).read_text()
    compile(text, CT_FILE, "exec")
    assert f"# overlay:{OID} v2 route-moe" in text and f"# overlay:{OID} v2 route-linear" in text
    # the MoE route is asked before vLLM's get_moe_method; the linear one before any scheme is built
    assert text.index("sm70_w4_route.moe_method(self, layer, prefix)") < text.index(
        "return CompressedTensorsMoEMethod.get_moe_method(")
    parts = text.index("def _get_scheme_from_parts(")
    assert parts < text.index("sm70_w4_route.linear_scheme(self, weight_quant, input_quant)") < text.index(
        "return CompressedTensorsW4A16Fp4()", parts)
    for f in (ROUTE_FILE, LAUNCHER_FILE):
        compile((root / f).read_text(), f, "exec")
    revert(ovs, ovs, root)
    assert (root / CT_FILE).read_bytes() == before and not (root / ROUTE_FILE).exists()


# --- the harness: the patched release's classes, run on CPU torch -------------------------------------------------


class QuantizationStrategy(str, enum.Enum):
    TENSOR = "tensor"
    CHANNEL = "channel"
    GROUP = "group"
    TENSOR_GROUP = "tensor_group"
    TOKEN = "token"


class QuantizationType(str, enum.Enum):
    INT = "int"
    FLOAT = "float"


class ActivationOrdering(str, enum.Enum):
    GROUP = "group"
    WEIGHT = "weight"
    DYNAMIC = "dynamic"


class CompressionFormat(enum.Enum):
    pack_quantized = "pack-quantized"
    nvfp4_pack_quantized = "nvfp4-pack-quantized"


class QArgs(types.SimpleNamespace):
    """compressed_tensors' QuantizationArgs: the fields vLLM reads."""


def w4a16(group=32):
    return QArgs(num_bits=4, strategy="group", group_size=group, symmetric=True, type=QuantizationType.INT,
                 dynamic=False, actorder=None, scale_dtype=None)


def nvfp4():
    return QArgs(num_bits=4, strategy="tensor_group", group_size=16, symmetric=True, type=QuantizationType.FLOAT,
                 dynamic=False, actorder=None, scale_dtype=None)


class _ScalarType(types.SimpleNamespace):
    """vllm.scalar_type.ScalarType: the fields the WNA16 scheme and Exllama read."""

    def has_bias(self):
        return self.bias != 0


class ScalarTypes:
    uint4b8 = _ScalarType(name="uint4b8", size_bits=4, bias=8)
    uint8b128 = _ScalarType(name="uint8b128", size_bits=8, bias=128)
    uint4 = _ScalarType(name="uint4", size_bits=4, bias=0)
    uint8 = _ScalarType(name="uint8", size_bits=8, bias=0)


class _Param(torch.nn.Parameter):
    """vLLM's ModelWeightParameter / GroupQuantScaleParameter / PerTensorScaleParameter: data + loader attrs."""

    def __new__(cls, data=None, **kw):
        p = super().__new__(cls, data, requires_grad=False)
        p.loader_attrs = kw
        return p


class MoEActivation(enum.Enum):
    SILU = "silu"
    GELU = "gelu"


class FusedMoE(torch.nn.Module):
    """The attributes vLLM's FusedMoE gives its quant method (26B-A4B shapes by default, TP=1)."""

    def __init__(self, hidden=2816, inter=704, experts=8, activation="gelu"):
        super().__init__()
        self.hidden_size, self.intermediate_size_per_partition = hidden, inter
        self.global_num_experts = experts
        self.moe_config = types.SimpleNamespace(is_act_and_mul=True, disable_inplace=False, is_lora_enabled=False)
        self.activation = MoEActivation(activation)
        self.apply_router_weight_on_input = False
        self.expert_map = None


class LinearLayer(torch.nn.Module):
    pass


class Launches:
    """The stub GPU launcher's W4Kernels: records every call, returns zeros of the right shape."""

    def __init__(self):
        self.calls = []
        self.k = types.SimpleNamespace(objects=[types.SimpleNamespace(arch="compute_70", kind="ptx")])

    def linear(self, x, w, scales, fmt, *, group, gscale=None, path=None, **kw):
        self.calls.append(("linear", fmt, group, path, tuple(x.shape), w, scales, gscale, kw))
        return torch.zeros((x.shape[0], w.shape[0]), dtype=torch.float16)

    def fused_moe(self, x, w13, s13, w2, s2, topk_weights, topk_ids, fmt, *, group, activation, path, align, **kw):
        self.calls.append(("fused_moe", fmt, group, activation, path, w13, s13, w2, s2, align, kw))
        return torch.zeros_like(x)


class _Logger(logging.LoggerAdapter):
    """vLLM's logger: the stdlib one plus its *_once methods."""

    def __init__(self, name):
        super().__init__(logging.getLogger(name), {})

    def info_once(self, msg, *a, **kw):
        self.info(msg, *a)

    def warning_once(self, msg, *a, **kw):
        self.warning(msg, *a)


def _stubs(capability):
    platform = types.SimpleNamespace(
        is_rocm=lambda: False, is_cuda=lambda: True, is_cuda_alike=lambda: True, _enum="CUDA",
        get_device_capability=lambda: types.SimpleNamespace(to_int=lambda: capability[0] * 10 + capability[1]))

    def set_weight_attrs(p, attrs):
        for k, v in (attrs or {}).items():
            setattr(p, k, v)

    class QuantizeMethodBase:
        def __init__(self):
            pass

    class CompressedTensorsScheme:
        pass

    class Marlin:
        def __init__(self, *a, **kw):
            self.args = a

    class UnquantizedFusedMoEMethod:
        def __init__(self, *a):
            pass

    backends = []

    def select_nvfp4_moe_backend(**kw):
        backends.append(kw)
        if capability < (7, 5):   # vLLM's NVFP4 MoE backends have no sm_70 code
            raise ValueError("no NVFP4 MoE backend supports this device")
        return "CUTLASS", types.SimpleNamespace(is_monolithic=lambda: False)

    linear_backends = []

    def select_nvfp4_linear_backend():
        linear_backends.append(capability)
        if capability < (7, 5):
            raise ValueError("No NVFP4 GEMM backend selected")
        return "cutlass"

    ns = dict(
        torch=torch, Parameter=torch.nn.Parameter, logger=_Logger("vllm-under-test"),
        QuantizationStrategy=QuantizationStrategy, QuantizationType=QuantizationType,
        ActivationOrdering=ActivationOrdering, CompressionFormat=CompressionFormat,
        current_platform=platform, set_weight_attrs=set_weight_attrs, QuantizeMethodBase=QuantizeMethodBase,
        CompressedTensorsScheme=CompressedTensorsScheme, abstractmethod=lambda f: f,
        ModelWeightParameter=_Param, GroupQuantScaleParameter=_Param, PerTensorScaleParameter=_Param,
        FusedMoeWeightScaleSupported=types.SimpleNamespace(GROUP=types.SimpleNamespace(value="group"),
                                                           TENSOR=types.SimpleNamespace(value="tensor")),
        UnquantizedFusedMoEMethod=UnquantizedFusedMoEMethod, WNA16_SUPPORTED_BITS=[4, 8],
        CompressedTensorsWNA16MarlinMoEMethod=type("CompressedTensorsWNA16MarlinMoEMethod", (Marlin,), {}),
        select_nvfp4_moe_backend=select_nvfp4_moe_backend, kNvfp4Static="static", kNvfp4Dynamic="dynamic",
        is_global_sf_supported_for_nvfp4_backend=lambda b: False,
        select_nvfp4_linear_backend=select_nvfp4_linear_backend,
        init_nvfp4_linear_kernel=lambda: types.SimpleNamespace(backend=select_nvfp4_linear_backend()),
        is_activation_quantization_format=lambda fmt: fmt == "nvfp4-pack-quantized",
        FusedMoE=FusedMoE, LinearBase=LinearLayer, Attention=type("Attention", (), {}),
        ParallelLMHead=type("ParallelLMHead", (), {}),
        # CompressedTensorsWNA16 and vLLM's mixed-precision kernel selection
        ABC=object, scalar_types=ScalarTypes, envs=types.SimpleNamespace(VLLM_DISABLED_KERNELS=[]),
        BasevLLMParameter=_Param, ChannelQuantScaleParameter=_Param, PackedColumnParameter=_Param,
        PackedvLLMParameter=_Param, RowvLLMParameter=_Param, get_marlin_input_dtype=lambda prefix=None: None,
        PlatformEnum=types.SimpleNamespace(CUDA="CUDA", ROCM="ROCM", XPU="XPU", CPU="CPU"),
    )
    return ns, backends, linear_backends


def _run(ns, code):
    exec(compile("from __future__ import annotations\n" + code, "<patched release>", "exec"), ns)


def _class_source(source, name, methods):
    """`class name:` holding the release's own defs of `methods` (each as written in `source`)."""
    import textwrap

    return f"class {name}:\n" + "".join(textwrap.indent(extract_def(source, f"{name}.{m}"), "    ") for m in methods)


class Release:
    """One patched release: its classes built from the patched files, the route module, the stub launcher."""

    def __init__(self, root, version, capability, monkeypatch):
        self.version = version
        ns, self.moe_backends, self.linear_backends = _stubs(capability)
        read = lambda rel: (root / rel).read_text()
        fm = "vllm/model_executor/layers/fused_moe/fused_moe_method_base.py"
        _run(ns, extract_def(read(fm), "FusedMoEMethodBase"))
        marlin = read(f"{Q}/utils/marlin_utils.py")
        _run(ns, extract_def(marlin, "check_moe_marlin_supports_layer"))
        if version.startswith("0.19"):
            moe = read(f"{CT}/compressed_tensors_moe.py")
            sources = {"CompressedTensorsMoEMethod": moe, "CompressedTensorsWNA16MoEMethod": moe,
                       "CompressedTensorsW4A4Nvfp4MoEMethod": moe}
        else:
            d = f"{CT}/compressed_tensors_moe"
            sources = {"CompressedTensorsMoEMethod": read(f"{d}/compressed_tensors_moe.py"),
                       "CompressedTensorsWNA16MoEMethod": read(f"{d}/compressed_tensors_moe_wna16.py"),
                       "CompressedTensorsW4A4Nvfp4MoEMethod": read(f"{d}/compressed_tensors_moe_w4a4_nvfp4.py")}
        ns["__package__"] = MOE_PKG   # 0.20's get_moe_method imports its methods relatively
        for name, src in sources.items():
            _run(ns, extract_def(src, name))
        for f, name in (("compressed_tensors_w4a4_nvfp4", "CompressedTensorsW4A4Fp4"),
                        ("compressed_tensors_w4a16_nvfp4", "CompressedTensorsW4A16Fp4")):
            _run(ns, extract_def(read(f"{CT}/schemes/{f}.py"), name))
        # CompressedTensorsWNA16 with its module constants, and vLLM's mixed-precision kernel choice over the
        # release's own Marlin and Exllama kernels (the only CUDA ones whose minimum capability is below 80)
        _run(ns, extract_def(read(f"{Q}/utils/marlin_utils.py"), "marlin_repeat_scales_on_all_ranks"))
        mp = "vllm/model_executor/kernels/linear"
        mpk = read(f"{mp}/mixed_precision/MPLinearKernel.py")
        ns["dataclass"] = __import__("dataclasses").dataclass
        _run(ns, extract_def(mpk, "MPLinearLayerConfig") + extract_def(mpk, "MPLinearKernel"))
        for f, name in (("marlin", "MarlinLinearKernel"), ("exllama", "ExllamaLinearKernel")):
            _run(ns, extract_def(read(f"{mp}/mixed_precision/{f}.py"), name))
        mp_init = read(f"{mp}/__init__.py")
        ns["_POSSIBLE_KERNELS"] = {"CUDA": [ns["MarlinLinearKernel"], ns["ExllamaLinearKernel"]]}
        _run(ns, extract_def(mp_init, "choose_mp_linear_kernel"))
        wna16 = read(f"{CT}/schemes/compressed_tensors_wNa16.py")
        _run(ns, "\n".join(line for line in wna16.splitlines() if line.startswith("WNA16_")))
        _run(ns, extract_def(wna16, "CompressedTensorsWNA16"))
        ct = read(CT_FILE)
        methods = ["get_quant_method", "_get_scheme_from_parts", "_is_nvfp4_format", "_is_wNa16_group_channel",
                   "_is_mxfp4", "_add_fused_moe_to_target_scheme_map", "_check_scheme_supported",
                   "_is_fp8_w4a8_sm90", "_is_fp8_w4a8"]
        if "def _is_mxfp8(" in ct:
            methods.append("_is_mxfp8")
        _run(ns, _class_source(ct, "CompressedTensorsConfig", methods))
        self.ns = ns
        self._modules(root, monkeypatch)
        self.launches = Launches()
        self.loads = []

        def load(cache=None, **kw):
            self.loads.append(cache)
            if isinstance(self.load_error, Exception):
                raise self.load_error
            return self.launches

        self.load_error = None
        monkeypatch.setattr(self.launcher, "load", load)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)   # (no CUDA graph here)

    def _modules(self, root, monkeypatch):
        ns = self.ns

        def mod(name, **attrs):
            m = types.ModuleType(name)
            m.__dict__.update(attrs)
            monkeypatch.setitem(sys.modules, name, m)
            parent, _, child = name.rpartition(".")
            if parent in sys.modules:
                monkeypatch.setattr(sys.modules[parent], child, m, raising=False)
            return m

        for name in ("vllm", "vllm.model_executor", "vllm.model_executor.layers", PKG, f"{PKG}.compressed_tensors",
                     "vllm.model_executor.layers.fused_moe"):
            mod(name, __path__=[])
        mod("vllm.logger", init_logger=_Logger)
        classes = {n: ns[n] for n in ("CompressedTensorsMoEMethod", "CompressedTensorsWNA16MoEMethod",
                                      "CompressedTensorsW4A4Nvfp4MoEMethod")}
        if self.version.startswith("0.19"):
            mod(MOE_PKG, **classes)
        else:   # a package: one module per method, as 0.20.0 ships it
            mod(MOE_PKG, __path__=[], CompressedTensorsMoEMethod=classes["CompressedTensorsMoEMethod"])
            mod(f"{MOE_PKG}.compressed_tensors_moe_wna16", **classes)
            mod(f"{MOE_PKG}.compressed_tensors_moe_w4a4_nvfp4", **classes)
            mod(f"{MOE_PKG}.compressed_tensors_moe_wna16_marlin",
                CompressedTensorsWNA16MarlinMoEMethod=ns["CompressedTensorsWNA16MarlinMoEMethod"])
        mod(f"{PKG}.compressed_tensors.schemes", CompressedTensorsW4A4Fp4=ns["CompressedTensorsW4A4Fp4"],
            CompressedTensorsW4A16Fp4=ns["CompressedTensorsW4A16Fp4"],
            CompressedTensorsWNA16=ns["CompressedTensorsWNA16"])
        self.aligned = []
        real = w4_launcher(f"sm70_w4_kernels_route_{self.version}")

        def moe_align_block_size(topk_ids, block_size, num_experts, *a, **kw):
            self.aligned.append((block_size, num_experts))
            return real.moe_align(topk_ids, block_size, num_experts)

        mod("vllm.model_executor.layers.fused_moe.moe_align_block_size", moe_align_block_size=moe_align_block_size)
        self.launcher = real
        monkeypatch.setitem(sys.modules, f"{PKG}.sm70_w4_kernels", real)
        monkeypatch.setattr(sys.modules[PKG], "sm70_w4_kernels", real, raising=False)
        spec = importlib.util.spec_from_file_location(f"{PKG}.sm70_w4_route", root / ROUTE_FILE)
        route = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(route)
        monkeypatch.setitem(sys.modules, f"{PKG}.sm70_w4_route", route)
        monkeypatch.setattr(sys.modules[PKG], "sm70_w4_route", route, raising=False)
        self.route = route

    def config(self, weights, inputs=None, fmt="pack-quantized"):
        cfg = self.ns["CompressedTensorsConfig"]()
        cfg.target_scheme_map = {"Linear": {"weights": weights, "input_activations": inputs, "format": fmt}}
        cfg.quant_format = fmt
        cfg.get_scheme_dict = lambda layer, name=None: cfg.target_scheme_map.get("FusedMoE") or \
            cfg.target_scheme_map["Linear"]
        return cfg


@pytest.fixture(scope="module")
def patched_trees(tmp_path_factory):
    """version -> the release's tree with the overlay applied (once per version; the tests only read it)."""
    from manager import releases

    trees = {}

    def get(version):
        if version not in trees:
            root = releases.copy_release(version, tmp_path_factory.mktemp(f"w4-route-{version}") / "site")
            apply(_overlay(), root)
            trees[version] = root
        return trees[version]

    return get


@pytest.fixture(params=["0.19.1", "0.20.0"])
def patched(request, patched_trees):
    return request.param, patched_trees(request.param)


@pytest.fixture
def release(patched, monkeypatch):
    version, root = patched
    monkeypatch.delenv("OVERLAY_W4", raising=False)
    return lambda capability=(7, 0): Release(root, version, capability, monkeypatch)


def _messages(caplog, needle):
    return [r.getMessage() for r in caplog.records if needle in r.getMessage()]


# --- W4A16 MoE ---------------------------------------------------------------------------------------------------


def _load_wna16(rel, method, layer, experts=8, dtype=torch.float16):
    method.create_weights(layer, experts, layer.hidden_size, layer.intermediate_size_per_partition, dtype)
    g = torch.Generator().manual_seed(0)
    for name in ("w13_weight_packed", "w2_weight_packed"):
        p = getattr(layer, name)
        p.data.copy_(torch.randint(-2**31, 2**31 - 1, p.shape, generator=g, dtype=torch.int64).to(torch.int32))
    for name in ("w13_weight_scale", "w2_weight_scale"):
        getattr(layer, name).data.uniform_(0.01, 0.02)
    loaded = {n: getattr(layer, n).data.clone() for n in ("w13_weight_packed", "w13_weight_scale")}
    method.process_weights_after_loading(layer)
    return loaded


@pytest.mark.network
@pytest.mark.parametrize("mode, capability", [(None, (7, 0)), ("force", (9, 0))])
def test_w4a16_moe_goes_to_the_kernels_on_sm70_or_forced(release, monkeypatch, caplog, mode, capability):
    rel = release(capability)
    monkeypatch.delenv("OVERLAY_W4_DECODE", raising=False)
    if mode:
        monkeypatch.setenv("OVERLAY_W4", mode)
    layer = FusedMoE()
    with caplog.at_level(logging.INFO):
        method = rel.config(w4a16(32)).get_quant_method(layer, "model.layers.0.moe.experts")
        # vLLM's class name (FusedMoE's loader keys its compressed-tensors transpose on it, issue 29), the route's
        # qualified name
        assert type(method).__name__ == "CompressedTensorsWNA16MoEMethod"
        assert type(method).__qualname__ == "SM70CompressedTensorsWNA16MoEMethod"
        assert isinstance(method, rel.ns["CompressedTensorsWNA16MoEMethod"])
        loaded = _load_wna16(rel, method, layer, dtype=torch.bfloat16)
        # vLLM's own transpose is the kernels' layout: [E, N, K/8] int32 as bytes, no further repack
        w13 = layer.w13_weight_packed
        assert w13.dtype == torch.uint8 and tuple(w13.shape) == (8, 2 * 704, 2816 // 2)
        assert torch.equal(w13.view(torch.int32), loaded["w13_weight_packed"].transpose(1, 2).contiguous())
        # bf16 group scales become fp16 (same size), transposed to [E, N, K/group] by vLLM
        assert layer.w13_weight_scale.dtype == torch.float16
        assert tuple(layer.w13_weight_scale.shape) == (8, 2 * 704, 2816 // 32)
        x = torch.zeros((3, 2816), dtype=torch.bfloat16)
        ids = torch.tensor([[0, 1], [1, 2], [7, 0]])
        out = method.apply(layer, x, torch.full((3, 2), 0.5), ids, None)
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (3, 2816)
    (call,) = rel.launches.calls
    assert call[:5] == ("fused_moe", "int4", 32, "gelu", "decode")
    assert call[5] is layer.w13_weight_packed and call[6] is layer.w13_weight_scale
    # no moe_align_block_size: "auto" runs the router-direct decode for its 6 routed rows (q4+p8, topk_ids as they are)
    assert rel.aligned == [] and call[9] is None
    assert len(_messages(caplog, "W4A16 MoE decode (router-direct) ran on sm70-w4-gemm kernels in pid")) == 1
    assert len(rel.loads) == 1


@pytest.mark.network
@pytest.mark.parametrize("decode, rows", [("wmma", 16), ("gemv", 8), ("auto", None)])
def test_w4a16_moe_decode_aligns_with_the_block_the_chosen_decode_kernel_takes(release, monkeypatch, caplog, decode,
                                                                               rows):
    """$OVERLAY_W4_DECODE reaches vLLM's moe_align_block_size through the launcher's align_block(path, fmt=...):
    the WMMA decode's 16-row blocks, the aligned GEMV's GEMV_BLOCK_ROWS; "auto" on int4 runs the router-direct decode
    for few routed rows, which takes topk_ids without any alignment (the launcher's needs_align) and is its own kind
    in the runtime marker."""
    rel = release((7, 0))
    monkeypatch.setenv("OVERLAY_W4_DECODE", decode)
    layer = FusedMoE()
    method = rel.config(w4a16(32)).get_quant_method(layer, "model.layers.0.moe.experts")
    _load_wna16(rel, method, layer, dtype=torch.bfloat16)
    with caplog.at_level(logging.INFO):
        method.apply(layer, torch.zeros((3, 2816), dtype=torch.bfloat16), torch.full((3, 2), 0.5),
                     torch.tensor([[0, 1], [1, 2], [7, 0]]), None)
    assert rel.aligned == ([] if rows is None else [(rows, 8)])
    kind = "W4A16 MoE decode (router-direct)" if rows is None else "W4A16 MoE decode"
    assert len(_messages(caplog, f"{kind} ran on sm70-w4-gemm kernels in pid")) == 1


@pytest.mark.network
@pytest.mark.parametrize("prefill, rows", [("dequant", None), ("wmma", 64)])
def test_w4a16_moe_prefill_from_the_dequant_threshold_takes_no_alignment_and_is_its_own_kind(release, monkeypatch,
                                                                                           caplog, prefill, rows):
    """A prefill of MOE_DEQUANT_MIN_ROWS routed rows: with $OVERLAY_W4_PREFILL dequant (opt-in for the MoE) the
    launcher's moe_dequant reads topk_ids as they come (no moe_align_block_size) and the marker names it; with wmma
    (the MoE's default) the 64-row prefill tile's alignment runs first."""
    rel = release((7, 0))
    monkeypatch.setenv("OVERLAY_W4_PREFILL", prefill)
    layer = FusedMoE()
    method = rel.config(w4a16(32)).get_quant_method(layer, "model.layers.0.moe.experts")
    _load_wna16(rel, method, layer, dtype=torch.bfloat16)
    tokens = rel.launcher.MOE_DEQUANT_MIN_ROWS // 2
    ids = torch.stack([torch.arange(tokens) % 8, (torch.arange(tokens) + 1) % 8], dim=1)
    with caplog.at_level(logging.INFO):
        method.apply(layer, torch.zeros((tokens, 2816), dtype=torch.bfloat16), torch.full((tokens, 2), 0.5), ids,
                     None)
    (call,) = rel.launches.calls
    assert call[4] == "prefill" and (call[9] is None) == (rows is None)
    assert rel.aligned == ([] if rows is None else [(rows, 8)])
    kind = "W4A16 MoE prefill (dequant + fp16 GEMM)" if rows is None else "W4A16 MoE prefill"
    assert len(_messages(caplog, f"{kind} ran on sm70-w4-gemm kernels in pid")) == 1


@pytest.mark.network
def test_w4a16_moe_on_sm80_is_left_to_vllm_which_picks_marlin_on_26b_shapes(release, caplog):
    rel = release((8, 0))
    with caplog.at_level(logging.INFO):
        method = rel.config(w4a16(32)).get_quant_method(FusedMoE(), "model.layers.0.moe.experts")
    assert type(method).__name__ == "CompressedTensorsWNA16MarlinMoEMethod"
    assert rel.loads == []   # not on the route: the kernels are never loaded
    (line,) = _messages(caplog, "W4A16 MoE layers (group 32) stay on vLLM's path")
    assert "compute capability 8.0 is not 7.0 (OVERLAY_W4=force routes any GPU)" in line


@pytest.mark.network
def test_w4a16_moe_on_sm70_without_kernels_gets_triton_not_marlin(release, caplog):
    rel = release((7, 0))
    rel.load_error = RuntimeError("no kernel cache")
    with caplog.at_level(logging.INFO):
        for i in range(3):
            method = rel.config(w4a16(32)).get_quant_method(FusedMoE(), f"model.layers.{i}.moe.experts")
            assert type(method) is rel.ns["CompressedTensorsWNA16MoEMethod"]
    (line,) = _messages(caplog, "stay on vLLM's path")
    assert "sm70-w4-gemm kernels unavailable (no kernel cache)" in line
    assert len(_messages(caplog, "not Marlin (no sm_70 code)")) == 1


@pytest.mark.network
def test_w4a16_moe_is_marlin_on_sm70_without_the_overlay_route_the_failure_the_route_removes(release):
    """Stock 0.19.1/0.20.0 on a V100 at TP=1: Marlin on shape alone (704 % 64 == 0), which has no sm_70 code."""
    rel = release((7, 0))
    layer = FusedMoE()
    cfg = rel.config(w4a16(32))
    assert rel.ns["check_moe_marlin_supports_layer"](layer, 32) is True
    stock = rel.ns["CompressedTensorsMoEMethod"].get_moe_method(cfg, layer, layer_name="model.layers.0.moe.experts")
    assert type(stock).__name__ == "CompressedTensorsWNA16MarlinMoEMethod"


@pytest.mark.network
@pytest.mark.parametrize("group", [16, 32, 128])
def test_w4a16_moe_group_sizes_of_the_tiny_checkpoints_are_routed(release, group):
    rel = release((7, 0))
    layer = FusedMoE(hidden=256, inter=128, experts=4)
    method = rel.config(w4a16(group)).get_quant_method(layer, "model.layers.0.moe.experts")
    assert type(method).__qualname__ == "SM70CompressedTensorsWNA16MoEMethod"
    _load_wna16(rel, method, layer, experts=4)
    method.apply(layer, torch.zeros((40, 256), dtype=torch.float16), torch.ones((40, 2)),
                 torch.randint(0, 4, (40, 2)), None)
    assert rel.launches.calls[0][1:5] == ("int4", group, "gelu", "prefill")
    assert rel.aligned == [(64, 4)]   # the prefill tile's 64 rows


@pytest.mark.network
@pytest.mark.parametrize("shape, reason", [
    ((2816, 700), "hidden 2816 / intermediate 700 per partition (the kernels need multiples of 32)"),
    ((2816, 704, "silu_no_mul"), None),
])
def test_w4a16_moe_shapes_the_kernels_cannot_take_stay_on_triton_with_the_reason(release, caplog, shape, reason):
    rel = release((7, 0))
    layer = FusedMoE(*shape[:2])
    if len(shape) > 2:
        layer.moe_config.is_act_and_mul = False
        reason = "a non-gated activation"
    with caplog.at_level(logging.INFO):
        method = rel.config(w4a16(32)).get_quant_method(layer, "model.layers.0.moe.experts")
    assert type(method) is rel.ns["CompressedTensorsWNA16MoEMethod"]
    (line,) = _messages(caplog, "stay on vLLM's path")
    assert line == f"sm70 w4: W4A16 MoE layers (group 32) stay on vLLM's path: {reason}"


@pytest.mark.network
def test_off_leaves_every_decision_to_vllm(release, monkeypatch, caplog):
    rel = release((7, 0))
    monkeypatch.setenv("OVERLAY_W4", "off")
    with caplog.at_level(logging.INFO):
        method = rel.config(w4a16(32)).get_quant_method(FusedMoE(), "model.layers.0.moe.experts")
    assert type(method).__name__ == "CompressedTensorsWNA16MarlinMoEMethod" and rel.loads == []
    assert any("disabled (OVERLAY_W4=off)" in m for m in _messages(caplog, "stay on vLLM's path"))


# --- NVFP4 MoE ---------------------------------------------------------------------------------------------------


def _load_nvfp4_moe(method, layer, experts=8):
    method.create_weights(layer, experts, layer.hidden_size, layer.intermediate_size_per_partition, torch.float16)
    g = torch.Generator().manual_seed(1)
    for n in ("w13_weight_packed", "w2_weight_packed"):
        getattr(layer, n).data.copy_(torch.randint(0, 256, getattr(layer, n).shape, generator=g).to(torch.uint8))
    for n in ("w13_weight_scale", "w2_weight_scale"):
        p = getattr(layer, n)
        p.data.copy_(torch.rand(p.shape, generator=g).to(torch.float8_e4m3fn))
    layer.w13_weight_global_scale.data.fill_(448.0 * 6 / 2.0)
    layer.w2_weight_global_scale.data.fill_(448.0 * 6 / 4.0)
    layer.w13_input_global_scale.data.fill_(1.0)
    layer.w2_input_global_scale.data.fill_(1.0)
    loaded = {n: getattr(layer, n).data.clone() for n in ("w13_weight_packed", "w13_weight_scale")}
    method.process_weights_after_loading(layer)
    return loaded


@pytest.mark.network
@pytest.mark.parametrize("inputs", [None, "nvfp4"])
def test_nvfp4_moe_on_sm70_gets_the_kernels_with_the_checkpoint_layout(release, caplog, inputs):
    rel = release((7, 0))
    layer = FusedMoE(hidden=256, inter=128, experts=4)
    with caplog.at_level(logging.INFO):
        method = rel.config(nvfp4(), nvfp4() if inputs else None, "nvfp4-pack-quantized").get_quant_method(
            layer, "model.layers.0.moe.experts")
        assert type(method).__name__ == "SM70CompressedTensorsW4A4Nvfp4MoEMethod"
        assert rel.moe_backends == []   # vLLM's NVFP4 backend selection (none on sm_70) is skipped
        assert method.is_monolithic is False
        loaded = _load_nvfp4_moe(method, layer, experts=4)
        assert torch.equal(layer.w13_weight, loaded["w13_weight_packed"])   # unswizzled: bytes as loaded
        assert torch.equal(layer.w13_weight_scale.view(torch.uint8), loaded["w13_weight_scale"].view(torch.uint8))
        assert not hasattr(layer, "w13_weight_packed")
        torch.testing.assert_close(layer.sm70_w4_gscale13, torch.full((4,), 2.0 / (448.0 * 6)))
        torch.testing.assert_close(layer.sm70_w4_gscale2, torch.full((4,), 4.0 / (448.0 * 6)))
        method.apply(layer, torch.zeros((2, 256), dtype=torch.float16), torch.ones((2, 2)),
                     torch.tensor([[0, 3], [1, 2]]), None)
    call = rel.launches.calls[0]
    assert call[:5] == ("fused_moe", "fp4", 16, "gelu", "decode")
    assert call[10]["gscale13"] is layer.sm70_w4_gscale13 and call[10]["gscale2"] is layer.sm70_w4_gscale2
    assert len(_messages(caplog, "NVFP4 MoE decode (router-direct) ran on sm70-w4-gemm kernels")) == 1


@pytest.mark.network
def test_nvfp4_moe_on_sm70_without_kernels_is_left_to_vllm_which_has_no_backend(release, caplog):
    rel = release((7, 0))
    rel.load_error = OSError("libcuda.so.1: cannot open shared object file")
    cfg = rel.config(nvfp4(), None, "nvfp4-pack-quantized")
    with caplog.at_level(logging.INFO), pytest.raises(ValueError, match="no NVFP4 MoE backend"):
        cfg.get_quant_method(FusedMoE(hidden=256, inter=128), "model.layers.0.moe.experts")
    (line,) = _messages(caplog, "NVFP4 MoE layers stay on vLLM's path")
    assert "kernels unavailable (libcuda.so.1" in line


@pytest.mark.network
def test_nvfp4_moe_on_sm90_is_vllms_own_method_unless_forced(release, monkeypatch):
    rel = release((9, 0))
    cfg = rel.config(nvfp4(), None, "nvfp4-pack-quantized")
    stock = cfg.get_quant_method(FusedMoE(hidden=256, inter=128), "model.layers.0.moe.experts")
    assert type(stock) is rel.ns["CompressedTensorsW4A4Nvfp4MoEMethod"] and len(rel.moe_backends) == 1
    monkeypatch.setenv("OVERLAY_W4", "force")
    forced = cfg.get_quant_method(FusedMoE(hidden=256, inter=128), "model.layers.1.moe.experts")
    assert type(forced).__name__ == "SM70CompressedTensorsW4A4Nvfp4MoEMethod" and len(rel.moe_backends) == 1


# --- NVFP4 linear ------------------------------------------------------------------------------------------------


def _load_linear(scheme, k=256, parts=(96, 32, 32), gscales=(3.0, 3.0, 3.0)):
    layer = LinearLayer()
    scheme.create_weights(layer, list(parts), k, torch.float16, weight_loader=None)
    g = torch.Generator().manual_seed(2)
    layer.weight_packed.data.copy_(torch.randint(0, 256, layer.weight_packed.shape, generator=g).to(torch.uint8))
    layer.weight_scale.data.copy_(torch.rand(layer.weight_scale.shape, generator=g).to(torch.float8_e4m3fn))
    layer.weight_global_scale.data.copy_(torch.tensor(gscales))
    if hasattr(layer, "input_global_scale"):
        layer.input_global_scale.data.fill_(1.0)
    loaded = (layer.weight_packed.data.clone(), layer.weight_scale.data.clone())
    scheme.process_weights_after_loading(layer)
    return layer, loaded


def _scheme(rel, a4):
    cfg = rel.config(nvfp4(), nvfp4() if a4 else None, "nvfp4-pack-quantized")
    scheme = cfg._get_scheme_from_parts(cfg.target_scheme_map["Linear"]["weights"],
                                        cfg.target_scheme_map["Linear"]["input_activations"],
                                        format="nvfp4-pack-quantized", layer_name="model.layers.0.mlp.down_proj")
    return cfg, scheme


@pytest.mark.network
@pytest.mark.parametrize("a4", [False, True])
def test_nvfp4_linear_on_sm70_lowers_the_capability_to_70_and_runs_the_kernels(release, caplog, a4):
    rel = release((7, 0))
    with caplog.at_level(logging.INFO):
        cfg, scheme = _scheme(rel, a4)
        base = rel.ns["CompressedTensorsW4A4Fp4" if a4 else "CompressedTensorsW4A16Fp4"]
        assert isinstance(scheme, base) and type(scheme) is not base
        assert base.get_min_capability() == 75 and scheme.get_min_capability() == 70
        assert cfg._check_scheme_supported(scheme.get_min_capability()) is True   # get_scheme's check passes
        assert rel.linear_backends == []   # no NVFP4 GEMM backend selection (none has sm_70 code)
        layer, (packed, scale) = _load_linear(scheme)
        assert torch.equal(layer.weight, packed) and torch.equal(layer.weight_scale.view(torch.uint8),
                                                                 scale.view(torch.uint8))
        torch.testing.assert_close(layer.weight_global_scale, torch.tensor([1 / 3.0]))
        y = scheme.apply_weights(layer, torch.zeros((2, 5, 256), dtype=torch.float16), torch.ones(160))
    assert tuple(y.shape) == (2, 5, 160) and torch.equal(y, torch.ones_like(y))   # bias added
    call = rel.launches.calls[0]
    assert call[:5] == ("linear", "fp4", 16, "decode", (10, 256))
    assert len(_messages(caplog, "NVFP4 linear decode ran on sm70-w4-gemm kernels")) == 1


@pytest.mark.network
@pytest.mark.parametrize("a4", [False, True])
def test_nvfp4_linear_on_sm70_without_kernels_keeps_vllms_scheme_and_its_capability_refusal(release, caplog, a4):
    rel = release((7, 0))
    rel.load_error = RuntimeError("kernel cache empty")
    with caplog.at_level(logging.INFO):
        if a4:   # vLLM's W4A4 scheme selects a GEMM backend when built: none on sm_70
            with pytest.raises(ValueError, match="No NVFP4 GEMM backend"):
                _scheme(rel, a4)
        else:
            cfg, scheme = _scheme(rel, a4)
            assert type(scheme) is rel.ns["CompressedTensorsW4A16Fp4"]
            with pytest.raises(RuntimeError):
                cfg._check_scheme_supported(scheme.get_min_capability())
    (line,) = _messages(caplog, "NVFP4 linear layers stay on vLLM's path")
    assert "kernel cache empty" in line


@pytest.mark.network
def test_nvfp4_linear_on_sm80_is_vllms_scheme_unless_forced(release, monkeypatch):
    rel = release((8, 0))
    _, stock = _scheme(rel, True)
    assert type(stock) is rel.ns["CompressedTensorsW4A4Fp4"] and rel.loads == []
    monkeypatch.setenv("OVERLAY_W4", "force")
    _, forced = _scheme(rel, True)
    assert type(forced).__name__ == "SM70CompressedTensorsW4A4Fp4"
    assert forced.get_min_capability() == 75   # lowered only on compute capability 7.0


@pytest.mark.network
def test_nvfp4_linear_with_k_not_a_multiple_of_32_is_dequantized_at_load_with_one_line(release, caplog):
    rel = release((7, 0))
    _, scheme = _scheme(rel, False)
    with caplog.at_level(logging.INFO):
        layer, (packed, scale) = _load_linear(scheme, k=48, parts=(64,), gscales=(2.0,))
        x = torch.randn((3, 48), dtype=torch.float16)
        y = scheme.apply_weights(layer, x)
    lut = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    codes = torch.stack((packed & 15, packed >> 4), -1).reshape(64, 48).long()
    ref = lut[codes & 7] * (1 - 2 * (codes >> 3)) * scale.float().repeat_interleave(16, -1) / 2.0
    assert layer.weight.dtype == torch.float16 and torch.allclose(layer.weight.float(), ref, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(y.float(), x.float() @ layer.weight.float().T, rtol=2e-3, atol=2e-3)
    assert rel.launches.calls == []
    (line,) = _messages(caplog, "K=48")
    assert "run dequantized to fp16" in line


@pytest.mark.network
def test_nvfp4_linear_apply_is_one_opaque_op_inside_a_fullgraph_torch_compile(release, monkeypatch):
    """vLLM compiles model forwards (fullgraph): the ctypes launch sits behind the custom op sm70_w4::nvfp4_linear."""
    rel = release((7, 0))
    _, scheme = _scheme(rel, False)
    layer, _ = _load_linear(scheme)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)   # dynamo must not initialise CUDA here
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: scheme.apply_weights(layer, x), fullgraph=True, backend="eager")
    y = compiled(torch.zeros((4, 256), dtype=torch.float16))
    assert tuple(y.shape) == (4, 160)
    assert [c[:4] for c in rel.launches.calls] == [("linear", "fp4", 16, "decode")]


# --- W4A16 linear (CompressedTensorsWNA16) -------------------------------------------------------------------------


def _wna16_scheme(rel, wq):
    cfg = rel.config(wq)
    return cfg, cfg._get_scheme_from_parts(wq, None, format="pack-quantized",
                                           layer_name="model.layers.0.mlp.down_proj")


def _load_wna16_linear(scheme, wq, k=256, parts=(96, 32, 32), dtype=torch.bfloat16, seed=3):
    """vLLM's create_weights, then the checkpoint's tensors (testing/checkpoints.py's compressed-tensors quantizers)
    copied into its parameters as its loader would, then process_weights_after_loading."""
    from testing.checkpoints import pack_int4, pack_int4_rows, quantize_w4_groups, quantize_w4_groups_asym

    layer = LinearLayer()
    n = sum(parts)
    scheme.create_weights(layer, n, k, list(parts), k, dtype, weight_loader=None)
    w = torch.randn((n, k), generator=torch.Generator().manual_seed(seed))
    group = wq.group_size if wq.group_size and wq.group_size > 0 else k
    if wq.symmetric:
        q, scale, deq = quantize_w4_groups(w, group, dtype)
        packed, zeros = pack_int4(q), None
    else:
        nib, scale, zero, deq = quantize_w4_groups_asym(w, group, dtype)
        packed, zeros = pack_int4(nib.to(torch.int32) - 8), pack_int4_rows(zero)
        layer.weight_zero_point.data.copy_(zeros)
    layer.weight_packed.data.copy_(packed)
    layer.weight_scale.data.copy_(scale)
    scheme.process_weights_after_loading(layer)
    return layer, packed, scale, zeros, deq


def _wq(group=32, symmetric=True, bits=4, actorder=None, strategy="group"):
    return QArgs(num_bits=bits, strategy=strategy, group_size=group, symmetric=symmetric, type=QuantizationType.INT,
                 dynamic=False, actorder=actorder, scale_dtype=None)


@pytest.mark.network
@pytest.mark.parametrize("symmetric", [True, False])
def test_w4a16_linear_on_stock_sm70_is_refused_by_the_schemes_minimum_capability_75(release, monkeypatch,
                                                                                     symmetric):
    """0.19.1/0.20.0 compressed_tensors_wNa16.py: get_min_capability() 75, checked in get_scheme before any kernel."""
    rel = release((7, 0))
    monkeypatch.setenv("OVERLAY_W4", "off")
    cfg, scheme = _wna16_scheme(rel, _wq(symmetric=symmetric))
    assert type(scheme) is rel.ns["CompressedTensorsWNA16"] and scheme.get_min_capability() == 75
    with pytest.raises(RuntimeError, match="Quantization scheme is not supported"):
        cfg._check_scheme_supported(scheme.get_min_capability())
    assert rel.loads == []


@pytest.mark.network
@pytest.mark.parametrize("act, zero_points, chosen", [
    (torch.float16, False, "ExllamaLinearKernel"), (torch.bfloat16, False, None), (torch.float16, True, None)])
def test_w4a16_linear_kernels_vllm_would_choose_on_cc70_exllama_fp16_symmetric_only(release, act, zero_points,
                                                                                   chosen):
    """choose_mp_linear_kernel at capability 70 (the releases' own Marlin 75 and Exllama 60 classes): only Exllama,
    and only for fp16 activations without zero points."""
    rel = release((7, 0))
    ns = rel.ns
    c = ns["MPLinearLayerConfig"](full_weight_shape=(256, 160), partition_weight_shape=(256, 160),
                                  weight_type=ScalarTypes.uint4 if zero_points else ScalarTypes.uint4b8,
                                  act_type=act, group_size=32, zero_points=zero_points, has_g_idx=False)
    if chosen is None:
        with pytest.raises(ValueError, match="MarlinLinearKernel requires capability 75"):
            ns["choose_mp_linear_kernel"](c, 70)
    else:
        assert ns["choose_mp_linear_kernel"](c, 70).__name__ == chosen


@pytest.mark.network
@pytest.mark.parametrize("mode, capability, symmetric, group", [
    (None, (7, 0), True, 32), (None, (7, 0), False, 32), (None, (7, 0), True, 128), ("force", (9, 0), True, 32),
    ("force", (8, 0), False, 128)])
def test_w4a16_linear_goes_to_the_kernels_on_sm70_or_forced_with_the_checkpoint_tensors(
        release, monkeypatch, caplog, mode, capability, symmetric, group):
    rel = release(capability)
    if mode:
        monkeypatch.setenv("OVERLAY_W4", mode)
    wq = _wq(group, symmetric)
    with caplog.at_level(logging.INFO):
        cfg, scheme = _wna16_scheme(rel, wq)
        base = rel.ns["CompressedTensorsWNA16"]
        assert isinstance(scheme, base) and type(scheme).__name__ == "SM70CompressedTensorsWNA16"
        assert scheme.get_min_capability() == (70 if capability == (7, 0) else 75)
        assert cfg._check_scheme_supported(scheme.get_min_capability()) is True
        layer, packed, scale, zeros, _ = _load_wna16_linear(scheme, wq)
        assert type(scheme.kernel).__name__ == "SM70W4LinearKernel"
        # the checkpoint's tensors as loaded: [N, K/8] int32 packed along K, scales fp16 [N, K/group]
        assert torch.equal(layer.weight_packed, packed)
        assert layer.weight_scale.dtype == torch.float16 and torch.equal(layer.weight_scale, scale.half())
        if not symmetric:
            assert torch.equal(layer.weight_zero_point, zeros) \
                and layer.sm70_w4_zeros.data_ptr() == layer.weight_zero_point.data_ptr()
        y = scheme.apply_weights(layer, torch.zeros((2, 5, 256), dtype=torch.bfloat16),
                                  torch.ones(160, dtype=torch.bfloat16))
        scheme.apply_weights(layer, torch.zeros((40, 256), dtype=torch.float16), None)
    assert y.dtype == torch.bfloat16 and tuple(y.shape) == (2, 5, 160) and torch.equal(y, torch.ones_like(y))
    fmt = "int4" if symmetric else "int4zp"
    assert [c[:5] for c in rel.launches.calls] == [("linear", fmt, group, "decode", (10, 256)),
                                                   ("linear", fmt, group, "prefill", (40, 256))]
    call = rel.launches.calls[0]
    assert call[5] is layer.weight_packed.data or torch.equal(call[5], layer.weight_packed)
    assert (call[8]["zeros"] is None) == symmetric
    assert len(_messages(caplog, "W4A16 linear decode ran on sm70-w4-gemm kernels in pid")) == 1
    assert len(_messages(caplog, "W4A16 linear prefill ran on sm70-w4-gemm kernels in pid")) == 1
    assert len(rel.loads) == 1


@pytest.mark.network
def test_w4a16_linear_prefill_from_the_launchers_threshold_logs_the_dequant_kernel_once(release, monkeypatch, caplog):
    rel = release((7, 0))
    monkeypatch.delenv("OVERLAY_W4_PREFILL", raising=False)
    wq = _wq(32, True)
    with caplog.at_level(logging.INFO):
        _cfg, scheme = _wna16_scheme(rel, wq)
        layer, *_ = _load_wna16_linear(scheme, wq)
        for rows in (255, 256, 1024):
            scheme.apply_weights(layer, torch.zeros((rows, 256), dtype=torch.float16), None)
    assert [c[3:5] for c in rel.launches.calls] == [("prefill", (255, 256)), ("prefill", (256, 256)),
                                                    ("prefill", (1024, 256))]
    assert len(_messages(caplog, "W4A16 linear prefill ran on sm70-w4-gemm kernels in pid")) == 1   # 255 rows
    assert len(_messages(caplog, "W4A16 linear prefill (dequant + fp16 GEMM) ran on sm70-w4-gemm kernels")) == 1


@pytest.mark.network
@pytest.mark.parametrize("wq, k, reason", [
    (_wq(16), 48, "K=48 (not a multiple of 32)"),
    (_wq(32, actorder="group"), 256, "act-order (g_idx) weights"),
    (_wq(-1, strategy="channel"), 256, "channelwise scales (the kernels take groups)"),
    (_wq(32, bits=8), 256, "8-bit weights (the kernels take 4 bits)")])
def test_w4a16_linear_the_kernels_cannot_take_is_dequantized_at_load_with_one_line(release, caplog, wq, k, reason):
    rel = release((7, 0))
    _, scheme = _wna16_scheme(rel, wq)
    layer = LinearLayer()
    scheme.create_weights(layer, 64, k, [64], k, torch.float16, weight_loader=None)
    g = torch.Generator().manual_seed(4)
    per = 32 // wq.num_bits
    vals = torch.randint(0, 1 << wq.num_bits, (64, k), generator=g)
    packed = sum((vals.reshape(64, -1, per)[..., i] << (wq.num_bits * i)) for i in range(per))
    layer.weight_packed.data.copy_(torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32))
    layer.weight_scale.data.uniform_(0.01, 0.02)
    group = k if wq.strategy == "channel" else wq.group_size
    gi = torch.arange(k) // group
    if wq.actorder:
        gi = torch.randperm(k, generator=g) % (k // group)
        layer.weight_g_idx.data.copy_(gi.to(torch.int32))
    with caplog.at_level(logging.INFO):
        scheme.process_weights_after_loading(layer)
        x = torch.randn((3, k), dtype=torch.float16)
        y = scheme.apply_weights(layer, x, None)
    ref = (vals - (1 << (wq.num_bits - 1))).float() * layer.weight_scale.float()[:, gi] \
        if hasattr(layer, "weight_scale") else None
    assert layer.sm70_w4 == "dense" and layer.weight.dtype == torch.float16
    torch.testing.assert_close(layer.weight.float(), ref, rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(y.float(), x.float() @ layer.weight.float().T, rtol=2e-3, atol=2e-3)
    assert rel.launches.calls == [] and not hasattr(layer, "weight_packed")
    (line,) = _messages(caplog, "run dequantized to fp16")
    assert f"W4A16 linear layers with {reason} run dequantized" in line


@pytest.mark.network
def test_w4a16_linear_on_sm70_without_kernels_keeps_vllms_scheme_and_its_refusal(release, caplog):
    rel = release((7, 0))
    rel.load_error = RuntimeError("kernel cache empty")
    with caplog.at_level(logging.INFO):
        cfg, scheme = _wna16_scheme(rel, _wq())
    assert type(scheme) is rel.ns["CompressedTensorsWNA16"]
    with pytest.raises(RuntimeError):
        cfg._check_scheme_supported(scheme.get_min_capability())
    (line,) = _messages(caplog, "W4A16 linear layers stay on vLLM's path")
    assert "kernel cache empty" in line


@pytest.mark.network
def test_w4a16_linear_on_sm80_is_vllms_scheme_and_kernel_choice(release, caplog):
    rel = release((8, 0))
    with caplog.at_level(logging.INFO):
        _, scheme = _wna16_scheme(rel, _wq())
    assert type(scheme) is rel.ns["CompressedTensorsWNA16"] and rel.loads == []
    (line,) = _messages(caplog, "W4A16 linear layers stay on vLLM's path")
    assert "compute capability 8.0 is not 7.0" in line


@pytest.mark.network
def test_w4a16_linear_format_is_read_from_vllms_own_local_in_the_patched_get_scheme_from_parts(release):
    """The route-linear insert passes no format: a layer whose own format is not pack-quantized stays vLLM's."""
    rel = release((7, 0))
    cfg = rel.config(_wq())
    with pytest.raises(NotImplementedError):   # vLLM's own answer for this format: no scheme
        cfg._get_scheme_from_parts(_wq(), None, format="marlin-24", layer_name="x")
    routed_ = cfg._get_scheme_from_parts(_wq(), None, format=None, layer_name="x")   # the config's format
    assert type(routed_).__name__ == "SM70CompressedTensorsWNA16"


@pytest.mark.network
def test_w4a16_linear_apply_is_one_opaque_op_inside_a_fullgraph_torch_compile(release, monkeypatch):
    rel = release((7, 0))
    wq = _wq(32, symmetric=False)
    _, scheme = _wna16_scheme(rel, wq)
    layer, *_ = _load_wna16_linear(scheme, wq, dtype=torch.float16)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: scheme.apply_weights(layer, x, None), fullgraph=True, backend="eager")
    y = compiled(torch.zeros((4, 256), dtype=torch.float16))
    assert tuple(y.shape) == (4, 160)
    assert [c[:4] for c in rel.launches.calls] == [("linear", "int4zp", 32, "decode")]
