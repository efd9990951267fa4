"""Build a model profile from a Hugging Face config.json.

Understands both Gemma-4 config forms:
- pre-5.15 flat: `head_dim` / `num_key_value_heads` for sliding layers plus
  `global_head_dim` / `num_global_key_value_heads` for full-attention layers;
- transformers >= 5.15 heterogeneous: the global values live in
  `per_layer_config[<layer index>]` (keys may be zero-padded strings).
Multimodal configs (`text_config` nested) and generic decoder configs (Llama/Qwen:
no `layer_types`, `num_experts_per_tok`) work too.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import yaml

from ..errors import ProfileError
from ..jsonread import parse_json
from ..state import UnreadableFile, read_bounded
from .schema import ModelProfile

MAX_CONFIG_BYTES = 64 * 1024 * 1024  # a config.json is KBs; the same bound as the checkpoint reader's JSON files


# First transformers release with the family's config class (read from the wheels: Gemma4 configs
# from 5.5.0; models/gemma4_unified is in the 5.10.0 wheel, not in 5.9.0).
MIN_TRANSFORMERS = {"gemma4": "5.5.0", "gemma4_unified": "5.10.0"}


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    text = cfg.get("text_config")
    if isinstance(text, dict):
        merged = dict(text)
        for key in ("architectures", "dtype", "torch_dtype", "quantization_config", "model_type"):
            if key in cfg and key not in merged:
                merged[key] = cfg[key]
        merged["_outer_model_type"] = cfg.get("model_type")
        merged["_multimodal"] = any(k in cfg for k in ("vision_config", "audio_config"))
        return merged
    return dict(cfg)


def _need(cfg: dict[str, Any], key: str, file: str) -> Any:
    if key not in cfg or cfg[key] is None:
        raise ProfileError(f"{file}: {key}: missing: needed to build a model profile")
    return cfg[key]


def _layer_shapes(t: dict[str, Any], file: str) -> list[dict[str, Any]]:
    """Per layer: kind, kv_heads, head_dim, window, k_eq_v, kv_shared."""
    n = int(_need(t, "num_hidden_layers", file))
    heads = int(_need(t, "num_attention_heads", file))
    hidden = int(_need(t, "hidden_size", file))
    kv = int(t.get("num_key_value_heads") or heads)
    head_dim = int(t.get("head_dim") or hidden // heads)
    layer_types = t.get("layer_types") or ["full_attention"] * n
    if len(layer_types) != n:
        raise ProfileError(
            f"{file}: layer_types: {len(layer_types)} entries: num_hidden_layers is {n}"
        )
    window: Any = t.get("sliding_window")  # a JSON value: checked below where a layer is sliding
    per_layer = {int(k): v for k, v in (t.get("per_layer_config") or {}).items()}
    g_head = t.get("global_head_dim")
    g_kv = t.get("num_global_key_value_heads")
    k_eq_v = bool(t.get("attention_k_eq_v", False))
    shared = int(t.get("num_kv_shared_layers") or 0)
    layers = []
    for i, lt in enumerate(layer_types):
        if lt in ("sliding_attention", "chunked_attention"):
            kind = "sliding"
        elif lt in ("full_attention", "attention"):
            kind = "full"
        elif lt in ("linear_attention", "mamba", "conv"):
            kind = "linear"
        else:
            raise ProfileError(f"{file}: layer_types[{i}]: {lt!r}: unknown layer type")
        d, h = head_dim, kv
        if kind == "full":
            if g_head:
                d = int(g_head)
            if g_kv:
                h = int(g_kv)
            over = per_layer.get(i) or {}
            d = int(over.get("head_dim", d))
            h = int(over.get("num_key_value_heads", h))
        if kind == "sliding" and not window:
            raise ProfileError(f"{file}: sliding_window: missing: layer {i} is sliding_attention")
        layers.append(
            {
                "kind": kind,
                "kv_heads": 0 if kind == "linear" else h,
                "head_dim": 0 if kind == "linear" else d,
                "window": int(window) if kind == "sliding" else None,
                "k_eq_v": k_eq_v and kind == "full",
                "kv_shared": i >= n - shared if shared else False,
            }
        )
    return layers


def _groups(layers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: OrderedDict[tuple, dict[str, Any]] = OrderedDict()
    for layer in layers:
        key = (layer["kind"], layer["kv_heads"], layer["head_dim"], layer["window"], layer["k_eq_v"])
        g = groups.get(key)
        if g is None:
            g = groups[key] = {"kind": layer["kind"], "count": 0, "kv_heads": layer["kv_heads"],
                               "head_dim": layer["head_dim"]}
            if layer["window"]:
                g["window"] = layer["window"]
            if layer["k_eq_v"]:
                g["k_eq_v"] = True
            g["kv_shared"] = 0
        g["count"] += 1
        g["kv_shared"] += int(layer["kv_shared"])
    out = []
    names: dict[str, int] = {}
    for g in groups.values():
        base = g["kind"]
        names[base] = names.get(base, 0) + 1
        g = {"name": base if names[base] == 1 else f"{base}-{names[base]}", **g}
        if not g["kv_shared"]:
            del g["kv_shared"]
        out.append(g)
    return out


def _ct_nvfp4(q: dict[str, Any]) -> bool:
    if "nvfp4" in str(q.get("format", "")).lower():
        return True
    groups = q.get("config_groups") or {}
    w = (next(iter(groups.values()), None) or {}).get("weights") or {} if isinstance(groups, dict) and groups else {}
    return w.get("type") == "float" and int(w.get("num_bits") or 0) == 4


def _variant(t: dict[str, Any], size_gb: float | None, hf_repo: str, params: int) -> tuple[str, dict[str, Any]]:
    q = t.get("quantization_config") or {}
    method = str(q.get("quant_method", "")).lower()
    v: dict[str, Any] = {}
    bits: float = 16  # 4.5 for NVFP4 (4-bit values plus a scale per 16)
    if not q:
        dtype = str(t.get("dtype") or t.get("torch_dtype") or "bfloat16")
        vid = "bf16" if "bfloat16" in dtype else "fp16"
        v["format"] = vid
    elif method == "compressed-tensors" and _ct_nvfp4(q):
        # compressed-tensors NVFP4 (format nvfp4-pack-quantized: float4 weights, group 16)
        v.update(format="nvfp4", quant_method="nvfp4", bits=4, group_size=16)
        bits, vid = 4.5, "nvfp4"
    elif method == "compressed-tensors":
        v["format"] = "compressed-tensors"
        groups: dict[str, Any] = q.get("config_groups") or {}
        first: dict[str, Any] = next(iter(groups.values()), {})
        w = first.get("weights", {}) if groups else {}
        bits = int(w.get("num_bits", 4))
        v["quant_method"] = "awq" if "awq" in json.dumps(q).lower() else f"w{bits}a16"
        v["bits"] = bits
        if w.get("group_size") is not None:
            v["group_size"] = int(w["group_size"])
        vid = f"int{bits}-compressed-tensors"
    elif method in ("awq", "gptq", "auto-round", "autoround", "intel/auto-round"):
        fmt = "auto-round" if "round" in method else method
        bits = int(q.get("bits", q.get("w_bit", 4)))
        v.update(format=fmt, quant_method="gptq" if fmt == "auto-round" else method, bits=bits)
        gs = q.get("group_size", q.get("q_group_size"))
        if gs is not None:
            v["group_size"] = int(gs)
        vid = f"{fmt}-int{bits}"
    elif method in ("modelopt", "modelopt_fp4") or "nvfp4" in json.dumps(q).lower():
        v.update(format="nvfp4", quant_method="nvfp4", bits=4, group_size=16)
        bits, vid = 4.5, "nvfp4"
    elif method == "fp8":
        v.update(format="fp8", quant_method="fp8", bits=8)
        bits, vid = 8, "fp8"
    else:
        raise ProfileError(f"config: quantization_config.quant_method: {method!r}: not understood")
    if size_gb is None:
        size_gb = round(params * bits / 8 / 1e9, 1)
        v["unverified"] = ["size_gb"]
        v["sources"] = {"size_gb": "estimated from the config's parameter count by import-config"}
    v["size_gb"] = size_gb
    v["hf_repo"] = hf_repo
    return vid, v


def _params(t: dict[str, Any], layers: list[dict[str, Any]]) -> int:
    hidden = int(t["hidden_size"])
    heads = int(t["num_attention_heads"])
    vocab = int(t.get("vocab_size") or 0)
    inter = int(t.get("intermediate_size") or 4 * hidden)
    total = vocab * hidden
    if t.get("hidden_size_per_layer_input") and t.get("vocab_size_per_layer_input"):
        total += int(t["vocab_size_per_layer_input"]) * len(layers) * int(t["hidden_size_per_layer_input"])
    experts = int(t.get("num_experts") or 0)
    moe_inter = int(t.get("moe_intermediate_size") or 0)
    for layer in layers:
        d = layer["head_dim"] or hidden // heads
        total += hidden * d * (2 * heads + 2 * layer["kv_heads"])
        total += 3 * hidden * inter
        if experts and moe_inter:
            total += experts * 3 * hidden * moe_inter
    return total


def profile_from_config(
    cfg: dict[str, Any],
    *,
    model_id: str,
    hf_repo: str | None = None,
    size_gb: float | None = None,
    file: str = "config.json",
) -> dict[str, Any]:
    """A model profile (plain dict, validated against the schema) from a config.json dict."""
    if not isinstance(cfg, dict):
        raise ProfileError(f"{file}: <root>: {type(cfg).__name__}: a config.json must be a mapping")
    t = _text_config(cfg)
    layers = _layer_shapes(t, file)
    groups = _groups(layers)
    model_type = str(t.get("_outer_model_type") or t.get("model_type") or "unknown")
    family = model_type.removesuffix("_text")
    archs = cfg.get("architectures") or t.get("architectures") or ["unknown"]
    dtype = str(t.get("dtype") or t.get("torch_dtype") or "bfloat16").removeprefix("torch.")
    if dtype not in ("bfloat16", "float16", "float32"):
        dtype = "bfloat16"
    repo = hf_repo or cfg.get("_name_or_path") or model_id
    vid, variant = _variant(t, size_gb, repo, _params(t, layers))
    prof: dict[str, Any] = {
        "id": model_id,
        "name": model_id,
        "hf_repo": repo,
        "family": family,
        "architecture": archs[0],
        "dtype": dtype,
        "hidden_size": int(t["hidden_size"]),
        "num_layers": len(layers),
        "num_attention_heads": int(t["num_attention_heads"]),
        "vocab_size": int(_need(t, "vocab_size", file)),
    }
    if t.get("intermediate_size"):
        prof["intermediate_size"] = int(t["intermediate_size"])
    prof["layer_groups"] = groups
    experts = t.get("num_experts") or t.get("n_routed_experts")
    top_k = t.get("top_k_experts") or t.get("num_experts_per_tok")
    moe_inter = t.get("moe_intermediate_size")
    if experts and (t.get("enable_moe_block", True)):
        if not (top_k and moe_inter):
            raise ProfileError(f"{file}: num_experts: {experts}: MoE config lacks top-k or moe_intermediate_size")
        prof["moe"] = {"experts": int(experts), "top_k": int(top_k), "expert_intermediate_size": int(moe_inter)}
    prof["max_context"] = int(_need(t, "max_position_embeddings", file))
    if family in MIN_TRANSFORMERS:
        prof["min_transformers"] = MIN_TRANSFORMERS[family]
    prof["multimodal"] = bool(t.get("_multimodal"))
    prof["weights"] = {vid: variant}
    prof["default_weights"] = vid
    prof["sources"] = {"architecture": f"imported from {file} by `overlay profiles import-config`"}
    try:
        ModelProfile.model_validate(prof)
    except Exception as exc:  # noqa: BLE001 - re-raised as a profile error naming the file
        first = str(exc).splitlines()
        raise ProfileError(f"{file}: imported profile is invalid: {' '.join(first[:3])}") from exc
    return prof


def read_config_json(path: Path) -> Any:
    """The JSON of `path`, bounded (`state.read_bounded`: regular files only, never blocking, at most
    MAX_CONFIG_BYTES) and parsed by `jsonread.parse_json` (nesting past the parser's stack and integers
    longer than CPython converts are one error); every error names `path` as given."""
    try:
        data = read_bounded(str(path), MAX_CONFIG_BYTES)  # follows a Hugging Face cache's link into blobs/
    except UnreadableFile as exc:
        raise ProfileError(f"{path}: cannot read: {exc.strerror}") from None
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read: {exc.strerror}") from None
    return parse_json(data, str(path), ProfileError)


def import_config(path: Path, *, model_id: str | None = None, hf_repo: str | None = None,
                  size_gb: float | None = None) -> dict[str, Any]:
    path = Path(path)
    cfg = read_config_json(path)
    mid = model_id or (path.parent.name if path.name == "config.json" else path.stem)
    mid = mid.lower().replace("_", "-")
    return profile_from_config(cfg, model_id=mid, hf_repo=hf_repo, size_gb=size_gb, file=str(path))


def to_yaml(profile: dict[str, Any]) -> str:
    return yaml.safe_dump(profile, sort_keys=False, default_flow_style=None, width=100)
