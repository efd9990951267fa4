"""inspect_checkpoint(): config.json + safetensors headers -> model facts, quantization, exact
weight bytes (total and per TP rank) and key-layout findings per engine profile.

Reads: config.json, model.safetensors.index.json, hf_quant_config.json (when present) and
8 + N bytes at the start of each shard. Never a byte of tensor data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InspectError, ProfileError
from ..profiles.importcfg import profile_from_config
from ..profiles.schema import ModelProfile
from ..profiles.tp import TP_SIZES, valid_tps
from .headers import Shard, TensorEntry, read_shard
from .layout import EngineCheck, Finding, engine_checks, key_findings
from .quant import QuantScheme, declared, with_evidence
from .source import LocalSource, Source, check_name, open_source
from .tensors import RULES, Placement, classify, rank_bytes

INDEX = "model.safetensors.index.json"
_K_PROJ = re.compile(r"layers\.(\d+)\.self_attn\.k_proj\.")


@dataclass(frozen=True)
class ClassBytes:
    cls: str
    rule: str
    tensors: int
    bytes: int
    params: tuple[str, ...]
    dims: tuple[int, ...]  # split dims seen (per param layout)
    why: str = ""

    def to_json(self) -> dict[str, object]:
        return {"class": self.cls, "rule": self.rule, "tensors": self.tensors, "bytes": self.bytes,
                "params": list(self.params), "split_dims": list(self.dims), "why": self.why}


@dataclass(frozen=True)
class TpSplit:
    tp: int
    ranks: tuple[int, ...]  # checkpoint bytes each rank holds (empty when the split is invalid)
    sharded: int  # total bytes of split tensors (whole model)
    replicated: int  # bytes every rank holds whole
    k_eq_v_copy: int  # extra bytes per rank vLLM materializes by loading k_proj into V too (K=V layers)
    problems: tuple[str, ...] = ()

    @property
    def valid(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, object]:
        return {"tp": self.tp, "valid": self.valid, "per_rank": list(self.ranks), "sharded": self.sharded,
                "replicated": self.replicated, "k_eq_v_copy_per_rank": self.k_eq_v_copy,
                "problems": list(self.problems)}


@dataclass(frozen=True)
class WeightBytes:
    total: int
    tensors: int
    by_dtype: dict[str, int]
    by_class: tuple[ClassBytes, ...]
    tp: tuple[TpSplit, ...]
    head_valid_tps: tuple[int, ...]  # what attention/KV heads allow (fits' tp-heads rule)

    def split(self, tp: int) -> TpSplit | None:
        return next((s for s in self.tp if s.tp == tp), None)

    def to_json(self) -> dict[str, object]:
        return {"total": self.total, "tensors": self.tensors, "by_dtype": dict(self.by_dtype),
                "rules": dict(RULES), "by_class": [c.to_json() for c in self.by_class],
                "head_valid_tps": list(self.head_valid_tps), "tp": [s.to_json() for s in self.tp]}


@dataclass(frozen=True)
class ShardInfo:
    file: str
    tensors: int
    header_bytes: int
    data_bytes: int
    file_size: int | None
    truncated: bool

    def to_json(self) -> dict[str, object]:
        return {"file": self.file, "tensors": self.tensors, "header_bytes": self.header_bytes,
                "data_bytes": self.data_bytes, "file_size": self.file_size, "truncated": self.truncated}


@dataclass(frozen=True)
class Inspection:
    source: str
    model_id: str
    profile: dict[str, Any]  # the import-config profile, size measured from headers
    shards: tuple[ShardInfo, ...]
    quant: QuantScheme
    weights: WeightBytes
    findings: tuple[Finding, ...]
    engines: tuple[EngineCheck, ...]
    bytes_read: int  # everything read from the source (JSON files + headers)
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def model(self) -> ModelProfile:
        return ModelProfile.model_validate(self.profile)

    def to_json(self) -> dict[str, object]:
        return {
            "source": self.source, "model_id": self.model_id, "profile": self.profile,
            "shards": [s.to_json() for s in self.shards], "quantization": self.quant.to_json(),
            "weights": self.weights.to_json(), "findings": [f.to_json() for f in self.findings],
            "engines": [e.to_json() for e in self.engines], "bytes_read": self.bytes_read, "notes": list(self.notes),
        }


# ----------------------------------------------------------------------------- reading


def _quant_config(source: Source, cfg: dict[str, Any]) -> None:
    """ModelOpt NVFP4 exports keep the scheme in hf_quant_config.json; fold it into the config."""
    tc = cfg.get("text_config")
    text: dict[str, Any] = tc if isinstance(tc, dict) else {}
    if cfg.get("quantization_config") or text.get("quantization_config"):
        return
    if source.exists("hf_quant_config.json"):
        hq = source.read_json("hf_quant_config.json")
        q = (hq or {}).get("quantization") if isinstance(hq, dict) else None
        if isinstance(q, dict):
            cfg["quantization_config"] = {"quant_method": "modelopt", **q}


def _shard_files(source: Source) -> tuple[list[str], dict[str, str] | None]:
    if source.exists(INDEX):
        idx = source.read_json(INDEX)
        wm = idx.get("weight_map") if isinstance(idx, dict) else None
        if not isinstance(wm, dict) or not wm:
            raise InspectError(f"{source.where(INDEX)}: weight_map: missing or empty")
        for v in set(wm.values()):
            check_name(v, f"{source.where(INDEX)}: weight_map")
        return sorted(set(wm.values())), {str(k): str(v) for k, v in wm.items()}
    files = source.list_safetensors()
    if not files:
        raise InspectError(f"{source.label}: no *.safetensors and no {INDEX}: nothing to inspect")
    return files, None


def _model_id(source: Source, target: str) -> str:
    if isinstance(source, LocalSource):
        name = source.root.resolve().name
    else:
        name = target.rstrip("/").rsplit("/", 1)[-1].split("@")[0]
    return re.sub(r"[^a-z0-9.-]+", "-", name.lower().replace("_", "-")).strip("-") or "checkpoint"


# ----------------------------------------------------------------------------- bytes


def _weights(tensors: list[TensorEntry], places: list[Placement], model: ModelProfile,
             k_eq_v_layers: set[int]) -> WeightBytes:
    total = sum(t.nbytes for t in tensors)
    by_dtype: dict[str, int] = {}
    groups: dict[str, dict[str, Any]] = {}
    for t, p in zip(tensors, places, strict=False):
        by_dtype[t.dtype] = by_dtype.get(t.dtype, 0) + t.nbytes
        g = groups.setdefault(p.cls, {"n": 0, "b": 0, "rep": 0, "params": set(), "dims": set(), "rule": p.rule,
                                      "why": p.why})
        g["n"] += 1
        g["b"] += t.nbytes
        g["params"].add(p.param)
        if p.dim is not None:
            g["dims"].add(p.dim)
            if g["rule"] == "replicated":
                g["rule"], g["why"] = p.rule, ""
        else:
            g["rep"] += t.nbytes
            if len(t.shape) >= 2 and g["rule"] == "replicated":
                g["why"] = p.why
    by_class = tuple(sorted((ClassBytes(c, g["rule"], g["n"], g["b"], tuple(sorted(g["params"])),
                                        tuple(sorted(g["dims"])),
                                        g["why"] if g["rule"] == "replicated" else
                                        (f"{g['rep']:,} B of per-tensor metadata replicated" if g["rep"] else ""))
                             for c, g in groups.items()), key=lambda c: (-c.bytes, c.cls)))
    heads_ok = valid_tps(model)
    k_layers = []
    for t in tensors:
        m = _K_PROJ.search(t.name) if k_eq_v_layers and "k_proj." in t.name else None
        k_layers.append(m is not None and int(m.group(1)) in k_eq_v_layers)
    splits = []
    for tp in TP_SIZES:
        if tp not in heads_ok:
            continue
        rank = 0
        sharded = replicated = dup = 0
        bad: dict[str, str] = {}
        for t, p, kl in zip(tensors, places, k_layers, strict=False):
            b = rank_bytes(t, p, tp)
            if b is None:
                assert p.dim is not None  # rank_bytes returns None only for a split dimension tp does not divide
                bad.setdefault(p.cls, f"{p.cls}: {t.name.rsplit('.', 1)[-1]} dim {p.dim} = {t.shape[p.dim]} "
                                      f"not divisible by TP {tp}")
                continue
            rank += b
            if p.dim is None:
                replicated += t.nbytes
            else:
                sharded += t.nbytes
            if kl:
                dup += b
        problems = tuple(bad.values())
        splits.append(TpSplit(tp, () if problems else tuple([rank] * tp), sharded, replicated, dup, problems))
    return WeightBytes(total, len(tensors), by_dtype, by_class, tuple(splits), tuple(heads_ok))


def _k_eq_v_layers(tensors: list[TensorEntry], cfg_text: dict[str, Any]) -> set[int]:
    """Full-attention layers whose checkpoint has k_proj but no v_proj (attention_k_eq_v)."""
    if not cfg_text.get("attention_k_eq_v"):
        return set()
    k: set[int] = set()
    v: set[int] = set()
    pat = re.compile(r"layers\.(\d+)\.self_attn\.([kv])_proj\.")
    for t in tensors:
        m = pat.search(t.name) if "_proj." in t.name else None
        if m:
            (k if m.group(2) == "k" else v).add(int(m.group(1)))
    return k - v


# ----------------------------------------------------------------------------- entry point


def inspect_checkpoint(target: str | Path, *, profiles=None, catalog=None, source: Source | None = None,
                       revision: str = "main", endpoint: str | None = None) -> Inspection:
    """Inspect a checkpoint directory, an http(s) base URL, or a Hugging Face repo id."""
    src = source or open_source(str(target), revision=revision, endpoint=endpoint)
    if not src.exists("config.json"):
        raise InspectError(f"{src.where('config.json')}: missing (a checkpoint needs its config.json)")
    cfg = src.read_json("config.json")
    if not isinstance(cfg, dict):
        raise InspectError(f"{src.where('config.json')}: {type(cfg).__name__}: must be a JSON object")
    _quant_config(src, cfg)
    files, weight_map = _shard_files(src)
    shards: list[Shard] = [read_shard(src, f) for f in files]
    tensors: list[TensorEntry] = [t for s in shards for t in s.tensors]
    notes: list[str] = []
    seen: dict[str, str] = {}
    for t in tensors:
        if t.name in seen:
            raise InspectError(f"{src.where(t.file)}: {t.name}: also in {seen[t.name]} (a tensor must be in one shard)")
        seen[t.name] = t.file
    if weight_map is not None:
        missing = [k for k, f in weight_map.items() if seen.get(k) != f]
        extra = [k for k in seen if k not in weight_map]
        if missing:
            k = missing[0]
            raise InspectError(f"{src.where(INDEX)}: weight_map[{k!r}]: {weight_map[k]!r}: "
                               + ("not in that shard's header" if k not in seen else f"the tensor is in {seen[k]!r}")
                               + (f" (+{len(missing) - 1} more)" if len(missing) > 1 else ""))
        if extra:
            notes.append(f"{len(extra)} tensors in the shards are not in {INDEX} (e.g. {extra[0]}); "
                         "vLLM loads them anyway")
    total = sum(t.nbytes for t in tensors)
    mid = _model_id(src, str(target))
    where = src.where("config.json")
    try:
        prof = profile_from_config(cfg, model_id=mid, size_gb=round(total / 1e9, 3) or 0.001, file=where)
    except ProfileError as exc:
        raise InspectError(str(exc)) from exc
    tc = cfg.get("text_config")
    text: dict[str, Any] = tc if isinstance(tc, dict) else cfg
    places = [classify(t) for t in tensors]
    model = ModelProfile.model_validate(prof)
    kev = _k_eq_v_layers(tensors, text)
    weights = _weights(tensors, places, model, kev)
    q = (text.get("quantization_config") or cfg.get("quantization_config"))
    scheme = declared(q, str(prof.get("dtype")), where)
    quantized: dict[str, int] = {}
    unquantized: dict[str, int] = {}
    mods: dict[str, set[str]] = {}
    for t, p in zip(tensors, places, strict=False):
        mods.setdefault(p.cls, set()).add(t.name.rsplit(".", 1)[0] if p.rule != "experts" else t.name)
    qcls = {p.cls for p in places if p.quantized}
    for cls, names in mods.items():
        if cls in qcls:
            quantized[cls] = len({re.sub(r"_(packed|scale|zero_point|shape)$", "", n) for n in names})
    for t, p in zip(tensors, places, strict=False):
        if (p.cls not in qcls and len(t.shape) >= 2 and p.param == "weight"
                and p.cls.split(".")[0] not in ("vision_tower", "audio_tower")):
            unquantized[p.cls] = unquantized.get(p.cls, 0) + 1
    scheme = with_evidence(scheme, quantized, unquantized)
    # finish the profile's weight variant: the size is measured, with its source
    vid = prof["default_weights"]
    var = prof["weights"][vid]
    rep = max((s.replicated for s in weights.tp if s.tp > 1), default=0)
    var["size_gb"] = round(total / 1e9, 3) or 0.001
    if rep:
        var["replicated_gb"] = round(rep / 1e9, 3)
    var["sources"] = {
        "size_gb": f"measured from safetensors headers: {total} bytes in {len(shards)} shard(s) of {src.label}"
    }
    var.pop("unverified", None)
    if scheme.group_size is not None and var.get("group_size") is None and scheme.method != "none":
        var["group_size"] = scheme.group_size
    prof["sources"] = dict(prof.get("sources") or {}, weights=f"overlay inspect {src.label} (headers only)")
    findings = key_findings(tensors, places, text, cfg, scheme, model, shards)
    engines: tuple[EngineCheck, ...] = ()
    if profiles is not None:
        engines = tuple(engine_checks(findings, cfg, model, profiles, catalog))
    return Inspection(src.label, mid, prof,
                      tuple(ShardInfo(s.file, len(s.tensors), s.data_start, s.data_bytes, s.file_size, s.truncated)
                            for s in shards),
                      scheme, weights, tuple(findings), engines, src.bytes_read, tuple(notes))
