"""The quantization scheme: what config.json (or hf_quant_config.json) declares, and what the keys show.

Declared: compressed-tensors `config_groups` (targets, num_bits, type, strategy, group_size,
symmetric), `format`, `ignore`; AWQ / GPTQ / AutoRound `bits`, `group_size`, `sym`/`zero_point`,
`desc_act`, `modules_to_not_convert`; ModelOpt NVFP4 `quant_algo`, `group_size`, `exclude_modules`;
FP8 `weight_block_size`. Observed: which tensor classes carry quantized parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import InspectError


@dataclass(frozen=True)
class QuantGroup:
    name: str
    targets: tuple[str, ...]
    bits: int | None
    type: str | None  # int / float
    strategy: str | None  # group / channel / tensor / tensor_group
    group_size: int | None
    symmetric: bool | None
    activations: str | None  # e.g. "float4 group 16 (dynamic local)"; None = weight-only

    def to_json(self) -> dict[str, object]:
        return dict(name=self.name, targets=list(self.targets), bits=self.bits, type=self.type, strategy=self.strategy,
                    group_size=self.group_size, symmetric=self.symmetric, activations=self.activations)


@dataclass(frozen=True)
class QuantScheme:
    method: str  # none / compressed-tensors / awq / gptq / auto-round / modelopt / fp8 / other
    format: str | None  # compressed-tensors format (pack-quantized, nvfp4-pack-quantized, ...) or packing
    scheme: str  # a one-word summary: bf16, w4a16, nvfp4, fp8, ...
    bits: int | None
    group_size: int | None
    symmetric: bool | None
    groups: tuple[QuantGroup, ...] = ()
    ignore: tuple[str, ...] = ()
    quantized_classes: tuple[tuple[str, int], ...] = ()  # (tensor class, modules) seen with quantized params
    unquantized_classes: tuple[tuple[str, int], ...] = ()  # 2-D+ weights without quant params
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "method": self.method, "format": self.format, "scheme": self.scheme, "bits": self.bits,
            "group_size": self.group_size, "symmetric": self.symmetric,
            "groups": [g.to_json() for g in self.groups], "ignore": list(self.ignore),
            "quantized_classes": {c: n for c, n in self.quantized_classes},
            "unquantized_classes": {c: n for c, n in self.unquantized_classes}, "extra": dict(self.extra),
        }


def _int(v: Any) -> int | None:
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None


def _acts(a: object) -> str | None:
    if not isinstance(a, dict):
        return None
    parts = [f"{a.get('type', '?')}{a.get('num_bits', '?')}"]
    if a.get("group_size"):
        parts.append(f"group {a['group_size']}")
    if a.get("strategy"):
        parts.append(str(a["strategy"]))
    if a.get("dynamic") is not None:
        parts.append(f"dynamic={a['dynamic']}")
    return " ".join(parts)


def declared(q: dict[str, Any] | None, dtype: str, where: str) -> QuantScheme:
    """The scheme config.json's quantization_config declares (no key evidence yet)."""
    if not q:
        scheme = "bf16" if "bfloat16" in dtype else ("fp16" if "float16" in dtype else dtype)
        return QuantScheme("none", None, scheme, 16 if scheme in ("bf16", "fp16") else None, None, None)
    if not isinstance(q, dict):
        raise InspectError(f"{where}: quantization_config: {type(q).__name__}: must be an object")
    method = str(q.get("quant_method", "")).lower()
    if method == "compressed-tensors":
        groups = []
        cg = q.get("config_groups") or {}
        if not isinstance(cg, dict):
            raise InspectError(f"{where}: quantization_config.config_groups: {type(cg).__name__}: must be an object")
        for name, g in cg.items():
            w = (g or {}).get("weights") or {}
            groups.append(QuantGroup(str(name), tuple(map(str, (g or {}).get("targets") or [])),
                                     _int(w.get("num_bits")), w.get("type"), w.get("strategy"),
                                     _int(w.get("group_size")), w.get("symmetric"),
                                     _acts((g or {}).get("input_activations"))))
        fmt = q.get("format")
        first = groups[0] if groups else None
        if (fmt and "nvfp4" in str(fmt)) or (first and first.type == "float" and first.bits == 4):
            scheme = "nvfp4"
        elif first and first.type == "float" and first.bits == 8:
            scheme = "fp8"
        elif first:
            ab = _int((((cg.get(first.name) or {}).get("input_activations")) or {}).get("num_bits")) or 16
            scheme = f"w{first.bits}a{ab}"
        else:
            scheme = "compressed-tensors"
        return QuantScheme("compressed-tensors", fmt, scheme, first.bits if first else None,
                           first.group_size if first else None, first.symmetric if first else None,
                           tuple(groups), tuple(map(str, q.get("ignore") or [])))
    if method in ("awq", "gptq", "auto-round", "autoround", "intel/auto-round"):
        m = "auto-round" if "round" in method else method
        bits = _int(q.get("bits", q.get("w_bit")))
        gs = _int(q.get("group_size", q.get("q_group_size")))
        sym = q.get("sym")
        if sym is None and "zero_point" in q:
            sym = not bool(q["zero_point"])
        ignore = q.get("modules_to_not_convert") or q.get("to_quant_block_names_excluded") or []
        extra: dict[str, Any] = {k: q[k] for k in ("desc_act", "version", "packing_format", "backend",
                                                   "checkpoint_format") if k in q}
        if isinstance(q.get("extra_config"), dict):
            extra["extra_config_layers"] = len(q["extra_config"])
        return QuantScheme(m, q.get("packing_format") or q.get("checkpoint_format") or q.get("version"),
                           f"w{bits}a16", bits, gs, sym, (), tuple(map(str, ignore)), extra=extra)
    if method in ("modelopt", "modelopt_fp4") or str(q.get("quant_algo", "")).upper() == "NVFP4":
        algo = str(q.get("quant_algo") or "").upper()
        return QuantScheme("modelopt", algo or None,
                           "nvfp4" if "FP4" in algo or method == "modelopt_fp4" else algo.lower() or "modelopt",
                           4 if "FP4" in algo else None, _int(q.get("group_size")) or (16 if "FP4" in algo else None),
                           None, (), tuple(map(str, q.get("exclude_modules") or q.get("ignore") or [])))
    if method == "fp8":
        return QuantScheme("fp8", None, "fp8", 8, None, None, (), tuple(map(str, q.get("ignored_layers") or [])),
                           extra={k: q[k] for k in ("weight_block_size", "activation_scheme") if k in q})
    return QuantScheme(method or "other", None, method or "unknown", _int(q.get("bits")), _int(q.get("group_size")),
                       None)


def with_evidence(s: QuantScheme, quantized: dict[str, int], unquantized: dict[str, int]) -> QuantScheme:
    from dataclasses import replace

    return replace(s, quantized_classes=tuple(sorted(quantized.items())),
                   unquantized_classes=tuple(sorted(unquantized.items())))
