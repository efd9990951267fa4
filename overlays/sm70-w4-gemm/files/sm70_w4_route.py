"""4-bit weights on compute capability 7.0 (V100) through the sm70-w4-gemm kernels: the engine route.

CompressedTensorsConfig (compressed_tensors.py, the same path in vLLM 0.19.1 and 0.20.0) asks this module first:
* `moe_method(config, layer, prefix)` for a FusedMoE layer: a compressed-tensors W4A16 (pack-quantized int4,
  symmetric, group strategy) MoE gets `SM70CompressedTensorsWNA16MoEMethod` (its __qualname__; a subclass of
  vLLM's CompressedTensorsWNA16MoEMethod under that __name__, which vLLM's FusedMoE loader keys on: its weights,
  loader and repack, then the launcher's fused_moe after vLLM's moe_align_block_size (none before a router-direct
  decode or a dequant prefill, which read topk_ids as they are); the router's topk_softmax ran before apply). On
  compute capability 7.0 this also keeps vLLM from picking CompressedTensorsWNA16MarlinMoEMethod (0.19.1 picks
  Marlin on shape alone, and Marlin has no sm_70 code): where the kernels cannot run there, the layer gets vLLM's
  own CompressedTensorsWNA16MoEMethod (Triton fused_moe). An NVFP4 MoE gets
  `SM70CompressedTensorsW4A4Nvfp4MoEMethod` (no NVFP4 backend selection, weight_packed / weight_scale kept as the
  checkpoint has them: the kernels read that layout).
* `linear_scheme(config, weight_quant, input_quant)`: an NVFP4 Linear layer (W4A4 or W4A16 NVFP4) gets a subclass of
  CompressedTensorsW4A4Fp4 / CompressedTensorsW4A16Fp4 whose get_min_capability() is 70 on compute capability 7.0
  (stock: 75) and whose apply_weights calls the launcher's linear. A layer whose K the kernels cannot take (not a
  multiple of 32) is dequantized to fp16 at load instead (4x the packed bytes; logged). A compressed-tensors W4A16
  Linear layer (pack-quantized CompressedTensorsWNA16: stock get_min_capability 75, so vLLM refuses every such layer
  on compute capability 7.0) gets a subclass whose minimum is 70 there and whose MPLinearKernel is this module's
  `SM70W4LinearKernel` (vLLM's create_weights and loader run unchanged): int4 group layers (symmetric or with zero
  points, groups multiples of 16, no act-order, K a multiple of 32) run the launcher's linear on the checkpoint's
  tensors as loaded; any other WNA16 layer (act-order, channelwise, 8 bits, K not a multiple of 32) is dequantized
  to fp16 at load (logged once per reason).

None of this happens unless the route is on and the kernels load: $OVERLAY_W4 unset/auto = compute capability 7.0
only, `off` disables it, `force` routes any GPU (a test switch). Otherwise the answer is None and vLLM's own
selection runs, with one log line per reason ("sm70 w4: ... stay on vLLM's path: <why>"). Each kernel kind that
runs is logged once ("sm70 w4: <kind> ran on sm70-w4-gemm kernels in pid N (...)"): the runtime marker.

No repack at load: vLLM's CompressedTensorsWNA16MoEMethod.process_weights_after_loading already transposes the
int4 experts to [E, N, K/8] int32 viewed as uint8, the kernels' layout; its scales become fp16 in place when they
are bf16 (same size). NVFP4 weights stay as loaded; the global scales become 1 / weight_global_scale (one float per
expert / layer). The kernels come from the `overlay build` cache ($OVERLAY_KERNEL_CACHE); the launcher is the
overlay's sm70_w4_kernels module beside this one, on overlay-manager's kernel runtime ($OVERLAY_MANAGER_HOME).
"""

from __future__ import annotations

import os
import sys

import torch

from vllm.logger import init_logger

logger = init_logger(__name__)

ENV = "OVERLAY_W4"
# vLLM's MoEActivation values -> the launcher's activations (vLLM's "gelu" is gelu_and_mul: erf GELU)
ACTIVATIONS = {"gelu": "gelu", "silu": "silu"}
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_MODULE = "vllm.model_executor.layers.quantization.sm70_w4_route"
_state: dict = {}
_classes: dict = {}


def mode() -> str:
    """auto | off | force, from $OVERLAY_W4 (unset: auto)."""
    raw = os.environ.get(ENV) or "auto"
    m = raw.strip().lower()
    if m not in ("auto", "off", "force"):
        fallback(f"{ENV}={raw!r} is not auto, off or force; using auto", key="bad-mode")
        m = "auto"
    return m


def fallback(why: str, key=None, quiet: bool = False) -> None:
    """One log line per distinct reason (info when the route is merely off or not on sm70)."""
    seen = _state.setdefault("fallbacks", set())
    k = key or why
    if k not in seen:
        seen.add(k)
        (logger.info if quiet else logger.warning)("sm70 w4: %s", why)


def ran(kind: str, detail: str) -> None:
    """The runtime marker: one line per kernel kind that ran, with the worker's pid."""
    seen = _state.setdefault("ran", set())
    if kind not in seen:
        seen.add(kind)
        logger.info("sm70 w4: %s ran on sm70-w4-gemm kernels in pid %d (%s)", kind, os.getpid(), detail)


def capability():
    return tuple(torch.cuda.get_device_capability()) if torch.cuda.is_available() else None


def on_sm70() -> bool:
    return capability() == (7, 0)


def active() -> str | None:
    """None when the route is on for this GPU, else why not (the kernels are not loaded here)."""
    m = mode()
    if m == "off":
        return f"disabled ({ENV}=off)"
    if m == "force" or on_sm70():
        return None
    cc = capability()
    where = "no CUDA device" if cc is None else f"compute capability {cc[0]}.{cc[1]} is not 7.0"
    return f"{where} ({ENV}=force routes any GPU)"


def kernels():
    """The launcher's W4Kernels for this device, or None (why in _state['why']); loaded once."""
    if "kernels" in _state:
        return _state["kernels"]
    k = None
    try:
        home = os.environ.get("OVERLAY_MANAGER_HOME")
        if home and home not in sys.path:
            sys.path.append(home)
        from vllm.model_executor.layers.quantization import sm70_w4_kernels as launcher

        k = launcher.load(cache=os.environ.get("OVERLAY_KERNEL_CACHE") or None)
        logger.info("sm70 w4: sm70-w4-gemm kernels (%s)", ", ".join(f"{o.arch} {o.kind}" for o in k.k.objects))
    except Exception as exc:  # noqa: BLE001 - any failure keeps vLLM's own path
        _state["why"] = f"sm70-w4-gemm kernels unavailable ({exc})"
    _state["kernels"] = k
    return k


def routed(what: str):
    """The kernels when `what` goes to them, else None after one line naming why."""
    why = active()
    if why is None:
        k = kernels()
        if k is not None:
            return k
        why = _state.get("why", "kernels unavailable")
    fallback(f"{what} stay on vLLM's path: {why}", key=(what, why), quiet=why.startswith(("disabled", "compute", "no ")))
    return None


def launcher():
    from vllm.model_executor.layers.quantization import sm70_w4_kernels

    return sm70_w4_kernels


# --- MoE ---------------------------------------------------------------------------------------------------------


def _moe_bases():
    """vLLM's MoE method classes: one module in 0.19.x, one module per method from 0.20."""
    try:
        from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe import (
            compressed_tensors_moe_w4a4_nvfp4 as nv,
            compressed_tensors_moe_wna16 as wna16,
        )

        return wna16.CompressedTensorsWNA16MoEMethod, nv.CompressedTensorsW4A4Nvfp4MoEMethod
    except ImportError:
        from vllm.model_executor.layers.quantization.compressed_tensors import compressed_tensors_moe as ct

        return ct.CompressedTensorsWNA16MoEMethod, ct.CompressedTensorsW4A4Nvfp4MoEMethod


def moe_shape_reason(layer, group: int) -> str | None:
    h = layer.hidden_size
    i = layer.intermediate_size_per_partition
    if h % 32 or i % 32:
        return f"hidden {h} / intermediate {i} per partition (the kernels need multiples of 32)"
    if group <= 0 or group % 16:
        return f"group size {group} (the kernels take multiples of 16)"
    if not getattr(layer.moe_config, "is_act_and_mul", True):
        return "a non-gated activation"
    act = getattr(layer, "activation", "gelu")
    if getattr(act, "value", act) not in ACTIVATIONS:
        return f"activation {getattr(act, 'value', act)!r} (the route runs {'/'.join(ACTIVATIONS)})"
    if getattr(layer, "apply_router_weight_on_input", False):
        return "router weights applied on the input"
    if getattr(layer, "expert_map", None) is not None or getattr(layer, "use_ep", False):
        return "expert parallelism"
    return None


def moe_method(config, layer, prefix: str):
    """The MoE method for `layer` on the route, or None: vLLM's get_moe_method decides."""
    config._add_fused_moe_to_target_scheme_map()
    schemes = [config.get_scheme_dict(layer, prefix + p) for p in (".0.gate_proj", ".0.up_proj", ".0.down_proj")]
    scheme = schemes[-1]
    if scheme is None or any(s != scheme for s in schemes):
        return None
    wq, iq, fmt = scheme.get("weights"), scheme.get("input_activations"), scheme.get("format")
    wna16_base, nvfp4_base = _moe_bases()
    if config._is_wNa16_group_channel(wq, iq):
        if wq.num_bits != 4 or fmt != "pack-quantized" or wq.strategy != "group" or not wq.symmetric \
                or wq.actorder in ("group", "dynamic"):
            return None
        what = f"W4A16 MoE layers (group {wq.group_size})"
        why = moe_shape_reason(layer, wq.group_size or -1)
        if why is None:
            if routed(what) is not None:
                return _moe_class("wna16", wna16_base)(wq, iq, layer.moe_config)
        else:
            fallback(f"{what} stay on vLLM's path: {why}", key=(what, why))
        if active() is None and on_sm70():
            # Marlin has no sm_70 code: never let vLLM pick it here (0.19.1 picks it on shape alone)
            fallback(f"{what}: CompressedTensorsWNA16MoEMethod (Triton fused_moe), not Marlin (no sm_70 code)",
                     key=(what, "not-marlin"), quiet=True)
            return wna16_base(wq, iq, layer.moe_config)
        return None
    if config._is_nvfp4_format(wq) and (iq is None or config._is_nvfp4_format(iq)):
        what = "NVFP4 MoE layers"
        why = moe_shape_reason(layer, 16)
        if why is not None:
            fallback(f"{what} stay on vLLM's path: {why}", key=(what, why))
            return None
        if routed(what) is None:
            return None
        return _moe_class("nvfp4", nvfp4_base)(layer.moe_config, prefix, use_a16=iq is None)
    return None


def _moe_apply(method, base_apply, fmt: str, layer, x, topk_weights, topk_ids, shared_experts_input):
    k = kernels()
    if k is None or getattr(layer, "sm70_w4", None) is None:
        return base_apply(layer, x, topk_weights, topk_ids, shared_experts_input)
    lm = launcher()
    w13, w2 = (layer.w13_weight_packed, layer.w2_weight_packed) if fmt == "int4" else (layer.w13_weight,
                                                                                      layer.w2_weight)
    e = w13.shape[0]
    m, top_k = topk_ids.shape
    path = lm.pick_path(m, top_k, e)
    align = None   # a router-direct decode (the launcher's DIRECT_VARIANTS) takes topk_ids without the layout
    if lm.needs_align(path, fmt, m * top_k):
        from vllm.model_executor.layers.fused_moe.moe_align_block_size import moe_align_block_size

        align = moe_align_block_size(topk_ids, lm.align_block(path, fmt=fmt), e)
    act = getattr(layer.activation, "value", layer.activation)
    xin = x if x.dtype == torch.float16 else x.to(torch.float16)
    extra = {"gscale13": layer.sm70_w4_gscale13, "gscale2": layer.sm70_w4_gscale2} if fmt == "fp4" else {}
    out = k.fused_moe(xin, w13, layer.w13_weight_scale, w2, layer.w2_weight_scale, topk_weights, topk_ids, fmt,
                      group=method.group_size, activation=ACTIVATIONS[act], path=path, align=align, **extra)
    # the router-direct decode and the dequant prefill are their own kinds: their marker lines show that the step took
    # topk_ids without the layout
    how = "" if align is not None else " (router-direct)" if path == "decode" else " (dequant + fp16 GEMM)"
    kind = f"{'W4A16' if fmt == 'int4' else 'NVFP4'} MoE {path}{how}"
    ran(kind, f"{m} tokens, top-{top_k} of {e} experts, group {method.group_size}, x {x.dtype}")
    return out if out.dtype == x.dtype else out.to(x.dtype)


def _wna16_after_loading(self, layer) -> None:
    self._sm70_base.process_weights_after_loading(self, layer)   # vLLM's transpose: the kernels' layout
    for name in ("w13_weight_scale", "w2_weight_scale"):
        s = getattr(layer, name)
        if s.dtype != torch.float16:   # bf16 scales (fp16 models on sm70 have fp16 ones): same bytes, in place
            setattr(layer, name, torch.nn.Parameter(s.data.to(torch.float16), requires_grad=False))
    layer.sm70_w4 = "int4"


def _wna16_apply(self, layer, x, topk_weights, topk_ids, shared_experts_input=None):
    return _moe_apply(self, lambda *a: self._sm70_base.apply(self, *a), "int4", layer, x, topk_weights, topk_ids,
                      shared_experts_input)


def _nvfp4_moe_init(self, moe, layer_name=None, use_a16=False):
    # vLLM's FusedMoEMethodBase.__init__, skipping select_nvfp4_moe_backend (no sm_70 backend; the kernels need none)
    super(self._sm70_base, self).__init__(moe)
    self.group_size = 16
    self.nvfp4_backend = None
    self.use_global_sf = False
    self.use_a16 = use_a16


def _nvfp4_moe_after_loading(self, layer) -> None:
    for n in ("w13", "w2"):   # vLLM's own rename (wN_weight_packed -> wN_weight); the bytes stay as loaded
        packed = getattr(layer, f"{n}_weight_packed").data
        delattr(layer, f"{n}_weight_packed")
        setattr(layer, f"{n}_weight", torch.nn.Parameter(packed, requires_grad=False))
    g13 = layer.w13_weight_global_scale.data
    if g13.dim() == 2 and g13.shape[1] == 2 and not torch.allclose(g13[:, 0], g13[:, 1]):
        fallback("NVFP4 MoE: gate and up global scales differ; gate's is used for both, as vLLM does",
                 key="nvfp4-gscale")
    layer.sm70_w4_gscale13 = (1.0 / g13.reshape(g13.shape[0], -1)[:, 0].float()).contiguous()
    layer.sm70_w4_gscale2 = (1.0 / layer.w2_weight_global_scale.data.reshape(-1).float()).contiguous()
    layer.sm70_w4 = "fp4"


def _nvfp4_moe_apply(self, layer, x, topk_weights, topk_ids, shared_experts_input=None):
    def unavailable(*a):
        raise RuntimeError(f"sm70 w4: NVFP4 MoE has no other path here: {_state.get('why', 'kernels unavailable')}")

    return _moe_apply(self, unavailable, "fp4", layer, x, topk_weights, topk_ids, shared_experts_input)


def _moe_class(kind: str, base):
    key = (kind, base)
    if key not in _classes:
        if kind == "wna16":
            body = {"process_weights_after_loading": _wna16_after_loading, "apply": _wna16_apply}
        else:
            body = {"__init__": _nvfp4_moe_init, "process_weights_after_loading": _nvfp4_moe_after_loading,
                    "apply": _nvfp4_moe_apply, "is_monolithic": property(lambda self: False),
                    "get_fused_moe_quant_config": lambda self, layer: None,
                    "maybe_make_prepare_finalize": lambda self, routing_tables=None: None}
        body.update(__doc__=f"{base.__name__} on the sm70-w4-gemm kernels (overlay sm70-w4-gemm).", _sm70_base=base,
                    __qualname__=f"SM70{base.__name__}")
        # W4A16 keeps vLLM's class name: FusedMoE.weight_loader transposes compressed-tensors packed weights and
        # scales only for a method whose __class__.__name__ is CompressedTensorsWNA16(Marlin)MoEMethod (layer.py,
        # 0.19.1 and 0.20.0), and create_weights gets intermediate_size_full by the same test (issue 29)
        name = base.__name__ if kind == "wna16" else f"SM70{base.__name__}"
        _classes[key] = type(name, (base,), body)
    return _classes[key]


# --- linear (NVFP4) -----------------------------------------------------------------------------------------------


def dequantize_nvfp4(packed, scale, gscale, dtype=torch.float16):
    """[N, K/2] uint8 E2M1 pairs (even k low nibble) x [N, K/16] E4M3 scales x gscale -> [N, K] `dtype`."""
    lut = torch.tensor(E2M1, dtype=torch.float32, device=packed.device)
    p = packed.to(torch.int64)
    codes = torch.stack((p & 0xF, p >> 4), dim=-1).reshape(packed.shape[0], -1)
    vals = lut[codes & 7] * torch.where(codes & 8 > 0, -1.0, 1.0)
    s = scale.to(torch.float32).repeat_interleave(16, dim=-1)[:, : vals.shape[1]]
    return (vals * s * gscale.to(torch.float32)).to(dtype)


def linear_scheme(config, weight_quant, input_quant, format=None, layer_name=None):
    """The NVFP4 or W4A16 linear scheme on the route, or None: vLLM's _get_scheme_from_parts decides."""
    if not config._is_nvfp4_format(weight_quant):
        return wna16_scheme(config, weight_quant, input_quant, format, layer_name)
    a16 = input_quant is None
    if not a16 and not config._is_nvfp4_format(input_quant):
        return None
    if routed("NVFP4 linear layers") is None:
        return None
    from vllm.model_executor.layers.quantization.compressed_tensors import schemes

    base = schemes.CompressedTensorsW4A16Fp4 if a16 else schemes.CompressedTensorsW4A4Fp4
    key = ("linear", base)
    if key not in _classes:
        _classes[key] = type(f"SM70{base.__name__}", (base,), {
            "__doc__": f"{base.__name__} on the sm70-w4-gemm kernels (overlay sm70-w4-gemm).", "_sm70_base": base,
            "__init__": _linear_init, "get_min_capability": classmethod(_linear_min_capability),
            "process_weights_after_loading": _linear_after_loading, "apply_weights": _linear_apply})
    return _classes[key]()


def _linear_init(self):
    self.group_size = 16   # no backend selection: vLLM's NVFP4 GEMM backends have no sm_70 code


def _linear_min_capability(cls) -> int:
    return 70 if on_sm70() else cls._sm70_base.get_min_capability()


def _linear_after_loading(self, layer) -> None:
    packed = layer.weight_packed.data
    del layer.weight_packed
    scale = layer.weight_scale.data.contiguous()
    g = layer.weight_global_scale.data.float()
    if g.numel() > 1 and not torch.all(g == g[0]):
        fallback("NVFP4 linear: fused layers with different global scales; the largest is used, as vLLM does",
                 key="nvfp4-linear-gscale")
    gscale = (1.0 / g.max()).reshape(1).contiguous()
    layer.weight_global_scale = torch.nn.Parameter(gscale, requires_grad=False)
    k = layer.input_size_per_partition
    if k % 32:
        dense = dequantize_nvfp4(packed, scale, gscale)
        fallback(f"NVFP4 linear layers with K={k} (not a multiple of 32) run dequantized to fp16 "
                 f"({dense.numel() * 2 - packed.numel() - scale.numel()} more bytes per such layer)", key=("k", k))
        layer.weight = torch.nn.Parameter(dense, requires_grad=False)
        layer.sm70_w4 = "dense"
        return
    layer.weight = torch.nn.Parameter(packed, requires_grad=False)
    layer.weight_scale = torch.nn.Parameter(scale, requires_grad=False)
    layer.sm70_w4 = "fp4"
    linear_op()   # registered at load, outside any torch.compile trace


def _linear_apply(self, layer, x, bias=None):
    if layer.sm70_w4 == "dense":
        return torch.nn.functional.linear(x, layer.weight.to(x.dtype), bias)
    x2 = x.reshape(-1, x.shape[-1])
    xin = x2 if x2.dtype == torch.float16 and x2.is_contiguous() else x2.to(torch.float16).contiguous()
    y = torch.ops.sm70_w4.nvfp4_linear(xin, layer.weight, layer.weight_scale, layer.weight_global_scale)
    y = y.to(x.dtype).reshape(*x.shape[:-1], y.shape[-1])
    return y if bias is None else y + bias


def _nvfp4_linear(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The launch (run eagerly: inside torch.compile'd models it is the opaque op `sm70_w4::nvfp4_linear`)."""
    route = sys.modules[_MODULE]   # the module instance serving now (the op is registered once per process)
    path = "decode" if x.shape[0] <= route.launcher().TILES["decode"][0] else "prefill"
    y = route.kernels().linear(x, w, s, "fp4", group=16, gscale=g, path=path)
    route.ran(f"NVFP4 linear {_linear_kind(route, path, x.shape[0])}", f"{x.shape[0]} rows, K {x.shape[1]}, N {y.shape[1]}")
    return y


def _linear_kind(route: Any, path: str, rows: int) -> str:
    """The marker's kernel kind of a linear launch: "decode", "prefill" (the WMMA tile) or "prefill (dequant + fp16
    GEMM)" (the launcher's prefill_choice)."""
    if path == "prefill" and route.launcher().prefill_choice(rows) == "dequant":
        return "prefill (dequant + fp16 GEMM)"
    return path


def linear_op():
    """`sm70_w4::nvfp4_linear`: the NVFP4 linear launch as a torch custom op (vLLM compiles model forwards with
    torch.compile: a ctypes launch must not be traced), registered once per process."""
    try:
        return torch.ops.sm70_w4.nvfp4_linear
    except (AttributeError, RuntimeError):
        op = torch.library.custom_op("sm70_w4::nvfp4_linear", mutates_args=())(_nvfp4_linear)
        op.register_fake(lambda x, w, s, g: x.new_empty((x.shape[0], w.shape[0]), dtype=torch.float16))
        return torch.ops.sm70_w4.nvfp4_linear


# --- linear (compressed-tensors W4A16: CompressedTensorsWNA16) ----------------------------------------------------


def wna16_scheme(config, weight_quant, input_quant, format=None, layer_name=None):
    """The W4A16 (WNA16) linear scheme on the route, or None.

    `format`: the layer's compression format, the local `format` of vLLM's _get_scheme_from_parts (the route-linear
    insert runs right after vLLM sets it and passes none: read from the caller's frame, else the config's)."""
    if format is None:
        caller = sys._getframe(1)
        if caller.f_code.co_name == "linear_scheme":
            caller = caller.f_back
        format = caller.f_locals.get("format") if caller is not None else None
        layer_name = layer_name or (caller.f_locals.get("layer_name") if caller is not None else None)
    format = format or config.quant_format
    if not config._is_wNa16_group_channel(weight_quant, input_quant) or format != "pack-quantized":
        return None
    from vllm.model_executor.layers.quantization.compressed_tensors import schemes

    base = schemes.CompressedTensorsWNA16
    if weight_quant.num_bits not in base.__init__.__globals__.get("WNA16_SUPPORTED_BITS", (4, 8)):
        return None   # vLLM's own test (compressed_tensors.py): not a WNA16 layer
    if routed("W4A16 linear layers") is None:
        return None
    key = ("wna16-linear", base)
    if key not in _classes:
        _classes[key] = type(f"SM70{base.__name__}", (base,), {
            "__doc__": f"{base.__name__} on the sm70-w4-gemm kernels (overlay sm70-w4-gemm).", "_sm70_base": base,
            "get_min_capability": classmethod(_linear_min_capability), "create_weights": _wna16_create_weights})
    return _classes[key](num_bits=weight_quant.num_bits, strategy=weight_quant.strategy,
                         symmetric=weight_quant.symmetric, group_size=weight_quant.group_size,
                         actorder=weight_quant.actorder, layer_name=layer_name)


def _wna16_create_weights(self, layer, *args, **kwargs):
    """vLLM's create_weights (its parameters and loaders) with SM70W4LinearKernel as the chosen MPLinearKernel: the
    stock choose_mp_linear_kernel has nothing for 7.0 but Exllama (fp16 symmetric only, FMA) and raises otherwise."""
    base = self._sm70_base.create_weights
    g = base.__globals__
    real = g["choose_mp_linear_kernel"]
    g["choose_mp_linear_kernel"] = lambda config, *a, **kw: SM70W4LinearKernel
    try:
        base(self, layer, *args, **kwargs)
    finally:
        g["choose_mp_linear_kernel"] = real


def wna16_reason(c, group: int) -> str | None:
    """Why the kernels cannot take this WNA16 layer (it is then dequantized at load), or None."""
    bits = getattr(c.weight_type, "size_bits", None)
    if bits != 4:
        return f"{bits}-bit weights (the kernels take 4 bits)"
    if c.has_g_idx:
        return "act-order (g_idx) weights"
    if group <= 0:
        return "channelwise scales (the kernels take groups)"
    if group % 16:
        return f"group size {group} (the kernels take multiples of 16)"
    k, n = c.partition_weight_shape
    if k % 32:
        return f"K={k} (not a multiple of 32)"
    if c.zero_points and n % 8:
        return f"N={n} with zero points (not a multiple of 8)"
    return None


def dequantize_wna16(packed, scale, zeros, bits: int, group: int, g_idx=None, dtype=torch.float16):
    """vLLM's compressed-tensors WNA16 tensors -> [N, K] `dtype`: packed int32 [N, K*bits/32] (LSB first along K),
    scale [N, G], zeros int32 [N*bits/32, G] packed along N or None (symmetric: 2^(bits-1)), g_idx [K] or None."""
    per = 32 // bits
    mask = (1 << bits) - 1
    p = packed.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(per, device=p.device) * bits
    q = ((p.unsqueeze(-1) >> shifts) & mask).reshape(p.shape[0], -1)
    n, k = q.shape
    gi = g_idx.to(torch.int64) if g_idx is not None and g_idx.numel() else \
        torch.arange(k, device=p.device) // (group if group > 0 else k)
    if zeros is None:
        z = torch.full((n, scale.shape[1]), 1 << (bits - 1), dtype=torch.int64, device=p.device)
    else:
        zp = zeros.to(torch.int64) & 0xFFFFFFFF
        z = ((zp.unsqueeze(1) >> shifts.reshape(1, per, 1)) & mask).reshape(-1, zp.shape[-1])[:n]
    return ((q - z[:, gi]).float() * scale.float()[:, gi]).to(dtype)


class SM70W4LinearKernel:
    """The MPLinearKernel vLLM's CompressedTensorsWNA16 holds on the route (built by its create_weights)."""

    def __init__(self, c, w_q_param_name="weight_packed", w_s_param_name="weight_scale",
                 w_zp_param_name="weight_zero_point", w_gidx_param_name="weight_g_idx"):
        self.config = c
        self.names = (w_q_param_name, w_s_param_name, w_zp_param_name, w_gidx_param_name)

    def process_weights_after_loading(self, layer) -> None:
        c = self.config
        wq, ws, wz, wg = self.names
        k, n = c.partition_weight_shape
        group = c.group_size if c.group_size > 0 else k
        why = wna16_reason(c, c.group_size)
        packed = getattr(layer, wq).data
        scale = getattr(layer, ws).data
        zeros = getattr(layer, wz).data if c.zero_points else None
        if why is not None:
            g_idx = getattr(layer, wg).data if c.has_g_idx else None
            dense = dequantize_wna16(packed, scale, zeros, c.weight_type.size_bits, group, g_idx)
            fallback(f"W4A16 linear layers with {why} run dequantized to fp16 "
                     f"({dense.numel() * 2 - packed.numel() * 4} more bytes per such layer)", key=("wna16", why))
            for name in (wq, wz, wg):
                if hasattr(layer, name):
                    delattr(layer, name)
            layer.weight = torch.nn.Parameter(dense, requires_grad=False)
            layer.sm70_w4 = "dense"
            return
        # the checkpoint's tensors as loaded are the kernels' layout: [N, K/8] int32 packed along K, LSB first;
        # zero points [N/8, G] packed along N; the scales become fp16 (bf16 -> fp16: the same bytes)
        setattr(layer, wq, torch.nn.Parameter(packed.contiguous(), requires_grad=False))
        setattr(layer, ws, torch.nn.Parameter(scale.to(torch.float16).contiguous(), requires_grad=False))
        z = zeros.contiguous() if zeros is not None else torch.empty(0, dtype=torch.int32, device=packed.device)
        layer.sm70_w4_zeros = z
        layer.sm70_w4_group = group
        layer.sm70_w4 = "int4zp" if zeros is not None else "int4"
        int4_linear_op()   # registered at load, outside any torch.compile trace

    def apply_weights(self, layer, x, bias=None):
        if layer.sm70_w4 == "dense":
            return torch.nn.functional.linear(x, layer.weight.to(x.dtype), bias)
        wq, ws, _, _ = self.names
        x2 = x.reshape(-1, x.shape[-1])
        xin = x2 if x2.dtype == torch.float16 and x2.is_contiguous() else x2.to(torch.float16).contiguous()
        y = torch.ops.sm70_w4.int4_linear(xin, getattr(layer, wq), getattr(layer, ws), layer.sm70_w4_zeros,
                                          layer.sm70_w4_group)
        y = y.to(x.dtype).reshape(*x.shape[:-1], y.shape[-1])
        return y if bias is None else y + bias


def _int4_linear(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, z: torch.Tensor, group: int) -> torch.Tensor:
    """The W4A16 launch (eager; inside torch.compile'd models the opaque op `sm70_w4::int4_linear`). z: zero points
    [N/8, G] int32, empty for symmetric weights."""
    route = sys.modules[_MODULE]
    path = "decode" if x.shape[0] <= route.launcher().TILES["decode"][0] else "prefill"
    fmt = "int4zp" if z.numel() else "int4"
    y = route.kernels().linear(x, w, s, fmt, group=group, zeros=z if z.numel() else None, path=path)
    route.ran(f"W4A16 linear {_linear_kind(route, path, x.shape[0])}", f"{x.shape[0]} rows, K {x.shape[1]}, N {y.shape[1]}, {fmt}, group {group}")
    return y


def int4_linear_op():
    """`sm70_w4::int4_linear`: the W4A16 linear launch as a torch custom op, registered once per process."""
    try:
        return torch.ops.sm70_w4.int4_linear
    except (AttributeError, RuntimeError):
        op = torch.library.custom_op("sm70_w4::int4_linear", mutates_args=())(_int4_linear)
        op.register_fake(lambda x, w, s, z, group: x.new_empty((x.shape[0], w.shape[0]), dtype=torch.float16))
        return torch.ops.sm70_w4.int4_linear
