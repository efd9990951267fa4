"""fits(): every named constraint (no short-circuit), a verdict and the memory picture.

Size: over 400 lines on purpose. Each constraint is one short `c_*` function over the same
resolved deployment (`_Ctx`); kept together they read as the list of rules fits() runs, in
order, and no rule's context has to cross a module boundary. The memory model is memory.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.version import Version

from ..catalog import Catalog
from ..errors import ProfileError
from ..profiles.loader import Profiles
from ..profiles.schema import Documented, EngineProfile, HardwareProfile, ModelProfile, WeightVariant
from ..profiles.tp import kv_heads_split, valid_tps
from . import memory as mem
from .overlays import DeploymentFacts, OverlayIndex, index_for, shipped_overlays, sm_in_range

if TYPE_CHECKING:
    from ..inspect import Inspection
    from ..overlays.info import OverlayInfo

CONSTRAINT_IDS = (
    "gpu-count", "tp-heads", "engine-family", "weight-format", "engine-sm", "dtype", "kv-dtype",
    "head-dim", "quant-kernel", "drafter", "context", "memory", "overlays", "nvlink", "unverified",
)
RANK = {"pass": 0, "skip": 0, "warn": 1, "fail": 2}
VERDICT = {0: "fits", 1: "tight", 2: "fails"}
MARLIN_GROUP_SIZES = (-1, 32, 64, 128)  # marlin_utils.MARLIN_SUPPORTED_GROUP_SIZES
MARLIN_PATH = {"compressed-tensors": "compressed-tensors", "auto-round": "gptq", "gptq": "gptq", "awq": "awq"}
INT_FORMATS = set(MARLIN_PATH)
# sm70-w4-gemm's launcher (files/sm70_w4_kernels.py DEQUANT_MIN_ROWS): from this many rows a 4-bit linear's prefill
# dequantizes its weight to fp16 for the call and runs the fp16 GEMM (tests/fits check the two stay equal)
W4_DEQUANT_MIN_ROWS = 256
GENERIC_MOE_SLOWDOWN = "~420x slower than Marlin (a user report; not measured by this project)"


@dataclass(frozen=True)
class Constraint:
    id: str
    result: str  # pass / warn / fail / skip
    message: str

    def to_json(self) -> dict[str, str]:
        return {"id": self.id, "result": self.result, "message": self.message}


@dataclass(frozen=True)
class FitReport:
    verdict: str
    constraints: list[Constraint]
    overlays: list[str]
    memory: mem.Memory
    deployment: dict[str, Any] = field(default_factory=dict)

    def constraint(self, cid: str) -> Constraint:
        for c in self.constraints:
            if c.id == cid:
                return c
        raise KeyError(cid)

    @property
    def ok(self) -> bool:
        return self.verdict != "fails"

    @property
    def unverified(self) -> list[str]:
        """Every unverified profile field this verdict rests on (`hardware/v100-sxm2-16gb.vram_bytes`, ...)."""
        return list(self.deployment.get("unverified", []))

    @property
    def evidence(self) -> str:
        """What the verdict rests on, beside it: `rests on N unverified facts` or `every fact sourced`."""
        n = len(self.unverified)
        return f"rests on {n} unverified fact{'s' if n != 1 else ''}" if n else "every fact sourced"

    def to_json(self) -> dict[str, object]:
        return {
            "verdict": self.verdict,
            "evidence": self.evidence,
            "deployment": {k: v for k, v in self.deployment.items() if k != "unverified"},
            "constraints": [c.to_json() for c in self.constraints],
            "overlays": list(self.overlays),
            "memory": self.memory.to_json(),
            "unverified": self.unverified,
        }


def _gb(b: int | float) -> str:
    return f"{b / 1e9:.2f} GB"


def default_engine(profiles: Profiles, hw: HardwareProfile, model: ModelProfile | None = None) -> EngineProfile:
    """Newest stock engine whose image targets this SM (and serves the model's family); else a fork."""
    cands = [e for e in profiles.engines.values() if e.device == hw.device and e.min_sm <= hw.sm + 1e-9]
    if model is not None:
        serving = [e for e in cands if model.family in e.families and (
            not model.min_transformers or Version(e.transformers_version) >= Version(model.min_transformers))]
        cands = serving or cands
    if not cands:
        raise ProfileError(f"hardware/{hw.id}: no {hw.device} engine profile supports sm {hw.sm}")
    cands.sort(key=lambda e: (not e.fork, Version(e.vllm_version)), reverse=True)
    return cands[0]


class _Ctx:
    """The resolved deployment a single fits() call checks."""

    def __init__(self, profiles: Profiles, model: ModelProfile, vid: str, variant: WeightVariant,
                 hw: HardwareProfile, engine: EngineProfile, drafter, gpus: int, tp: int,
                 ctx: int | None, kv_dtype: str, max_seqs: int | None, index: OverlayIndex | None):
        self.p, self.m, self.vid, self.w, self.hw, self.e, self.d = profiles, model, vid, variant, hw, engine, drafter
        self.gpus, self.tp, self.ctx, self.kv_dtype, self.max_seqs, self.index = (
            gpus, tp, ctx, kv_dtype, max_seqs, index)


# ----------------------------------------------------------------------------- constraints


def c_gpu_count(c: _Ctx) -> Constraint:
    if c.gpus < 1 or c.tp < 1:
        return Constraint("gpu-count", "fail", f"gpus {c.gpus} / tp {c.tp}: both must be >= 1")
    if c.tp > c.gpus:
        return Constraint("gpu-count", "fail", f"TP {c.tp} needs {c.tp} GPUs, {c.gpus} given")
    if c.gpus % c.tp:
        return Constraint("gpu-count", "warn", f"{c.gpus} GPUs is not a multiple of TP {c.tp}: {c.gpus % c.tp} idle")
    if c.gpus > c.tp:
        return Constraint(
            "gpu-count", "warn",
            f"TP {c.tp} on {c.gpus} GPUs: {c.gpus - c.tp} idle unless run as {c.gpus // c.tp} data-parallel replicas")
    return Constraint("gpu-count", "pass", f"TP {c.tp} on {c.gpus} GPU{'s' if c.gpus > 1 else ''}")


def c_tp_heads(c: _Ctx) -> Constraint:
    m, tp = c.m, c.tp
    bad, replicated = [], []
    if m.num_attention_heads % tp:
        bad.append(f"attention heads {m.num_attention_heads}")
    for g in m.layer_groups:
        if g.kind == "linear" or not g.kv_heads:
            continue
        if not kv_heads_split(g.kv_heads, tp):
            bad.append(f"{g.name} KV heads {g.kv_heads} (neither divides the other)")
        elif g.kv_heads < tp:
            replicated.append(f"{g.name} KV heads {g.kv_heads} replicated {tp // g.kv_heads}x")
    valid = valid_tps(m)
    if bad:
        return Constraint("tp-heads", "fail", f"TP {tp} does not divide {', '.join(bad)}; valid TP {valid}")
    kvs = "/".join(str(g.kv_heads) for g in m.layer_groups if g.kind != "linear")
    rep = (f"; {', '.join(replicated)} (each rank holds a copy: vLLM gemma4.py Gemma4Attention, "
           f"tp_size % num_kv_heads == 0)") if replicated else ""
    return Constraint("tp-heads", "pass",
                      f"TP {tp} divides {m.num_attention_heads} heads and KV heads {kvs}{rep}; valid TP {valid}")


def _family_port(c: _Ctx) -> tuple[str | None, str]:
    """(overlay id that adds the model's family to this engine's release, or None; why not)."""
    if c.index is None:
        return None, ""
    for info in sorted(c.index.overlays.values(), key=lambda o: o.id):
        if c.m.family not in info.provides_families:
            continue
        if info.invalid:
            return None, f"{info.id} would port it but its manifest is invalid: {info.invalid}"
        stats, _ = c.index.statuses(c.e.vllm_version)
        st = stats.get(info.id, "pending" if info.in_range(c.e.vllm_version) else "not-applicable")
        if st in ("pending", "applied"):
            return info.id, ""
        return None, f"{info.id} would port it but is {st} on vLLM {c.e.vllm_version}"
    return None, ""


def c_engine_family(c: _Ctx) -> Constraint:
    m, e = c.m, c.e
    port = None
    if m.family not in e.families:
        port, why = _family_port(c)
        if port is None:
            return Constraint(
                "engine-family", "fail",
                f"{e.id} does not serve family {m.family} ({m.architecture}; serves {', '.join(e.families)})"
                + (f"; {why}" if why else ""))
    if m.min_transformers and Version(e.transformers_version) < Version(m.min_transformers):
        return Constraint(
            "engine-family", "fail",
            f"{e.id} ships transformers {e.transformers_version}; {m.family} configs need >= {m.min_transformers}")
    if port:
        return Constraint(
            "engine-family", "pass",
            f"{e.id} lacks {m.family} ({m.architecture}); overlay {port} ports it onto vLLM {e.vllm_version} "
            f"(transformers {e.transformers_version})")
    return Constraint("engine-family", "pass", f"{e.id} serves {m.family} (transformers {e.transformers_version})")


def _broken_applies(kb, c: _Ctx) -> bool:
    if kb.engines and c.e.id not in kb.engines:
        return False
    if kb.formats and c.w.format not in kb.formats:
        return False
    if kb.min_sm is not None and c.hw.sm < kb.min_sm - 1e-9:
        return False
    return not (kb.max_sm is not None and c.hw.sm > kb.max_sm + 1e-09)


def _broken_note(kb) -> str:
    return f"{kb.reason} [{kb.source}]" + (f"; fix: {kb.fix}" if kb.fix else "")


def c_weight_format(c: _Ctx) -> Constraint:
    w, e = c.w, c.e
    broken = [kb
              for kb in list(w.known_broken) + list(e.known_broken)
              if kb.constraint == "weight-format" and _broken_applies(kb, c)]
    if w.format not in e.weight_formats:
        why = "".join(f"; {_broken_note(kb)}" for kb in broken if kb.formats)
        ov, ov_why = _format_overlay_for(c)
        own = [kb for kb in broken if kb in w.known_broken]  # the checkpoint's own problems stay
        if ov and not own:
            return Constraint("weight-format", "pass", f"{c.vid}: format {w.format} loads on sm {c.hw.sm} through the "
                              f"kernel overlay {ov} ({e.id} alone: not loadable{why})")
        why += f"; {ov_why}" if ov_why else ""
        return Constraint("weight-format", "fail", f"{c.vid}: format {w.format} not loadable by {e.id}{why}")
    if broken:
        result = "fail" if any(kb.result == "fail" for kb in broken) else "warn"
        return Constraint("weight-format", result,
                          f"{c.vid} ({w.format}): " + "; ".join(_broken_note(kb) for kb in broken))
    return Constraint(
        "weight-format", "pass",
        f"{c.vid}: {w.format}" + (f" {w.bits}-bit g{w.group_size}" if w.bits else "") + f" loads in {e.id}")


def c_engine_sm(c: _Ctx) -> Constraint:
    e, sm = c.e, c.hw.sm
    if e.device != c.hw.device:
        return Constraint("engine-sm", "fail", f"{e.id} is a {e.device} build; {c.hw.id} is a {c.hw.device} device")
    if e.device == "cpu":
        return Constraint("engine-sm", "pass", f"{e.id} is vLLM's CPU build; {c.hw.id} is a CPU host")
    if sm < e.min_sm - 1e-9 or (e.cuda_arch_list and min(e.cuda_arch_list) > sm + 1e-9):
        low = min(e.cuda_arch_list) if e.cuda_arch_list else e.min_sm
        return Constraint(
            "engine-sm", "fail", f"{e.id}'s binaries carry no code for sm {sm}: built for sm >= {max(e.min_sm, low)} "
            f"(cuda_arch_list {e.cuda_arch_list or '-'}, CUDA {e.cuda_version or '?'}); {c.hw.id} is sm {sm}")
    if e.cuda_arch_list and not any(int(a) == int(sm) and a <= sm + 1e-9 for a in e.cuda_arch_list):
        return Constraint("engine-sm", "warn",
                          f"{e.id} has no sm{int(sm)}.x binaries in {e.cuda_arch_list}; relies on PTX JIT")
    return Constraint("engine-sm", "pass", f"{e.id} targets sm {sm} (min {e.min_sm})")


def c_dtype(c: _Ctx) -> Constraint:
    m, w, hw = c.m, c.w, c.hw
    msgs, result = [], "pass"
    if m.dtype == "bfloat16" and not hw.bf16:
        result = "warn"
        msgs.append(f"sm {hw.sm} has no bf16: activations run as fp16 (overflow risk; --dtype float16)")
    else:
        msgs.append(f"compute {m.dtype} on sm {hw.sm}")
    if w.format == "fp8" and hw.sm < 8.9:
        result = "warn" if hw.sm >= c.e.marlin_min_sm else "fail"
        msgs.append(f"fp8 compute needs sm >= 8.9; sm {hw.sm} "
                    + ("runs fp8 weights weight-only (Marlin)" if result == "warn" else "has no fp8 path"))
    return Constraint("dtype", result, "; ".join(msgs))


def c_kv_dtype(c: _Ctx) -> Constraint:
    kvd = mem.effective_kv_dtype(c.kv_dtype, c.m, c.hw)
    if c.kv_dtype not in c.e.kv_dtypes or (
            c.kv_dtype == "auto" and kvd not in c.e.kv_dtypes and "auto" not in c.e.kv_dtypes):
        return Constraint("kv-dtype", "fail",
                          f"--kv-cache-dtype {c.kv_dtype} not supported by {c.e.id} ({', '.join(c.e.kv_dtypes)})")
    if kvd == "bfloat16" and not c.hw.bf16:
        return Constraint("kv-dtype", "fail", f"bf16 KV cache on sm {c.hw.sm}: no bf16 support; use float16 or fp8")
    if kvd.startswith("fp8") and not c.hw.fp8:
        return Constraint("kv-dtype", "pass",
                          f"{kvd} KV on sm {c.hw.sm}: storage only (dequantised in the attention kernel), "
                          f"{mem.KV_DTYPE_BYTES[kvd]} B/elem")
    return Constraint("kv-dtype", "pass", f"KV cache {kvd} ({mem.KV_DTYPE_BYTES.get(kvd, 2)} B/elem)")


def _covers(info: OverlayInfo, d: int, sm: float) -> bool:
    """A kernel overlay whose needed_when names head_dim d and an SM range holding sm."""
    nw = info.needed_when
    return info.kernel and d in (nw.head_dims or ()) and sm_in_range(nw, sm)


def _kernel_overlay_for(c: _Ctx, d: int) -> tuple[str | None, str]:
    """(overlay id providing a D=d kernel on this SM, or None; why not). Which overlay provides
    which kernel is what the manifests say (`kernels:` plus needed_when head_dims/min_sm/max_sm);
    when the catalog lacks one, the shipped catalog names the overlay that would."""
    return _kernel_overlay(c, lambda info: _covers(info, d, c.hw.sm))


def _format_overlay_for(c: _Ctx) -> tuple[str | None, str]:
    """(kernel overlay that routes this weight format on this SM, or None; why not): a manifest with `kernels:`
    whose needed_when names the format and an SM range holding the card's (sm70-w4-gemm: compressed-tensors W4A16
    MoE and NVFP4 on sm 7.0)."""

    def covers(info: OverlayInfo) -> bool:
        nw = info.needed_when
        return info.kernel and c.w.format in (nw.weight_formats or ()) and sm_in_range(nw, c.hw.sm)

    return _kernel_overlay(c, covers)


def _kernel_overlay(c: _Ctx, covers: Callable[[OverlayInfo], bool]) -> tuple[str | None, str]:
    if c.index is None:
        return None, "no overlay catalog"
    for info in c.index.overlays.values():
        if covers(info):
            if info.invalid:
                return None, f"kernel overlay {info.id} is in the catalog but its manifest is invalid: {info.invalid}"
            return info.id, ""
    shipped = next((i for i in shipped_overlays().values() if covers(i)), None)
    if shipped is None:
        return None, ""
    mine = c.index.overlays.get(shipped.id)
    if mine is None:
        return None, f"needs the kernel overlay {shipped.id} (shipped with overlay-manager), not in the catalog"
    return None, (
        f"{shipped.id} is in the catalog but "
        + (f"its manifest is invalid: {mine.invalid}" if mine.invalid else "its needed_when does not cover this case"))


def _forced(c: _Ctx):
    dims = c.m.head_dims
    for f in c.e.forced_attention:
        if c.m.family in f.families and len(dims) > 1 and max(dims) > f.when_head_dims_differ_above:
            return f
    return None


def c_head_dim(c: _Ctx) -> Constraint:
    kvd = mem.effective_kv_dtype(c.kv_dtype, c.m, c.hw)
    parts, result = [], "pass"
    forced = _forced(c)
    if forced is not None:
        parts.append(
            f"{c.e.id} forces {forced.backend} for every layer (head dims {'/'.join(map(str, c.m.head_dims))} differ, "
            f"max > {forced.when_head_dims_differ_above}; {forced.source})")
    for d in c.m.head_dims:
        names = [b.backend
                 for b in c.e.attention
                 if b.runs_on(c.hw.sm)
                 and b.supports_head_dim(d)
                 and (c.kv_dtype in b.kv_dtypes or kvd in b.kv_dtypes)
                 and (forced is None or b.backend == forced.backend)]
        if names:
            parts.append(f"D={d}: {names[0]}")
            continue
        ov, why = _kernel_overlay_for(c, d)
        if ov:
            parts.append(f"D={d}: kernel overlay {ov}")
            continue
        result = "fail"
        extra = f" ({why})" if why else ""
        parts.append(f"D={d}: no attention kernel on sm {c.hw.sm} in {c.e.id} for KV {kvd}{extra}")
    return Constraint("head-dim", result, "; ".join(parts))


def c_quant_kernel(c: _Ctx) -> Constraint:
    """The kernel rules below, then every known_broken entry scoped to quant-kernel that applies
    (the engine's missing sm70 kernels, each with its fix)."""
    base = _quant_kernel(c)
    notes = [kb
             for kb in list(c.w.known_broken) + list(c.e.known_broken)
             if kb.constraint == "quant-kernel" and _broken_applies(kb, c)]
    ov, _ = _format_overlay_for(c)
    if ov and base.result == "pass" and f"kernel overlay {ov}" in base.message:
        # the engine's own limits for this format on this SM are what the overlay replaces
        notes = [kb for kb in notes if not (kb in c.e.known_broken and c.w.format in (kb.formats or ()))]
    if not notes:
        return base
    result = max(
        [base.result if base.result != "skip" else "pass", *(kb.result for kb in notes)], key=lambda r: RANK[r])
    return Constraint("quant-kernel", result, "; ".join([base.message, *(_broken_note(kb) for kb in notes)]))


def _quant_kernel(c: _Ctx) -> Constraint:
    w, e, hw, m, tp = c.w, c.e, c.hw, c.m, c.tp
    if w.format in ("bf16", "fp16"):
        return Constraint("quant-kernel", "skip", f"{c.vid}: unquantized")
    if w.format in ("nvfp4", "mxfp4", "fp8"):
        floor = e.quant_min_sm.get(w.format, e.marlin_min_sm)
        native = 10.0 if w.format in ("nvfp4", "mxfp4") else 8.9
        if hw.sm >= native - 1e-9:
            return Constraint("quant-kernel", "pass", f"{w.format}: native tensor-core kernels on sm {hw.sm}")
        if hw.sm >= floor - 1e-9:
            how = "Marlin weight-only (W4A16)" if hw.sm >= e.marlin_min_sm else f"{e.id} weight-only path"
            return Constraint("quant-kernel", "pass",
                              f"{w.format} on sm {hw.sm}: {how}; no {w.format} tensor cores below sm {native}")
        ov, ov_why = _format_overlay_for(c)
        if ov and w.format == "nvfp4":
            return Constraint("quant-kernel", "pass", f"nvfp4 on sm {hw.sm}: kernel overlay {ov} (WMMA, fp16 "
                              f"activations, E2M1/E4M3 decoded in registers; weights as loaded, no repack: 0 extra "
                              f"bytes; {_dequant_scratch(c)}; {e.id} alone needs sm >= {floor})")
        return Constraint(
            "quant-kernel", "fail",
            f"{w.format} needs sm >= {floor} in {e.id}; {hw.id} is sm {hw.sm}" + (f"; {ov_why}" if ov_why else ""))
    if w.format in INT_FORMATS:
        g = w.group_size if w.group_size is not None else -1
        path = MARLIN_PATH[w.format]
        if not m.moe:
            k = (m.intermediate_size or m.hidden_size * 4) // tp
            if g > 0 and k % g:
                return Constraint(
                    "quant-kernel", "fail",
                    f"group {g} does not divide per-rank K {k} (intermediate {m.intermediate_size}/TP {tp})")
            if hw.sm < e.marlin_min_sm:
                ov, _ = _format_overlay_for(c) if path == "compressed-tensors" and w.bits == 4 else (None, None)
                if ov:   # stock CompressedTensorsWNA16 needs capability 75 (0.19.1/0.20.0 compressed_tensors_wNa16.py)
                    return Constraint("quant-kernel", "pass", f"W4A16 linear on sm {hw.sm}: kernel overlay {ov} "
                                      f"(WMMA, group {g}, per-rank K {k}; weights as loaded, no repack: 0 extra bytes; "
                                      f"{_dequant_scratch(c)})")
                return Constraint(
                    "quant-kernel", "warn",
                    f"no Marlin below sm {e.marlin_min_sm}: int{w.bits} falls back to a generic kernel (slow)")
            return Constraint("quant-kernel", "pass", f"Marlin W{w.bits}A16, group {g}, per-rank K {k}")
        k = m.moe.expert_intermediate_size // tp
        pad = path in e.marlin_moe_tile_padding
        need = g if pad else max(64, g)
        problems = []
        if hw.sm < e.marlin_min_sm:
            problems.append(f"no Marlin below sm {e.marlin_min_sm}")
        if g not in MARLIN_GROUP_SIZES:
            problems.append(f"group {g} not in {list(MARLIN_GROUP_SIZES)}")
        if m.hidden_size % 128:
            problems.append(f"hidden {m.hidden_size} % 128 = {m.hidden_size % 128}")
        if need > 0 and k % need:
            problems.append(
                f"per-rank expert K {m.moe.expert_intermediate_size}/TP {tp} = {k}, {k} % {need} = {k % need} != 0")
        if not problems:
            return Constraint("quant-kernel", "pass",
                              f"MoE Marlin W{w.bits}A16: per-rank expert K {k} % {need} == 0, group {g}")
        routed = _w4a16_moe_overlay(c, k, g) if hw.sm < e.marlin_min_sm and path == "compressed-tensors" else None
        if routed is not None:
            return routed
        if (problems == [f"no Marlin below sm {e.marlin_min_sm}"] and e.marlin_moe_ignores_sm
            and path == "compressed-tensors"):
            return Constraint("quant-kernel", "fail",
                              f"per-rank expert K {k} % {need} == 0, group {g}: {e.id} picks the MoE Marlin "
                              f"kernel on shape alone (no capability test), and Marlin has no sm {hw.sm} code "
                              f"(needs sm >= {e.marlin_min_sm}); "
                              f"a TP whose per-rank K is not a multiple of {need} takes the WNA16 path instead")
        why = "; ".join(problems)
        if w.moe_fallback == "moe-wna16":
            return Constraint("quant-kernel", "warn",
                              f"{why} -> generic MoE WNA16 kernel, {GENERIC_MOE_SLOWDOWN}" if hw.sm < e.marlin_min_sm
                              else f"{why} -> generic MoE WNA16 kernel (slower than Marlin)")
        reason = f" ({w.moe_fallback_reason})" if w.moe_fallback_reason else ""
        return Constraint("quant-kernel", "fail", f"{why}: no MoE WNA16 kernel for {c.vid}{reason}")
    return Constraint("quant-kernel", "skip", f"{w.format}: no kernel rules")


def _dequant_scratch(c: _Ctx) -> str:
    """What the overlay's linear prefill holds for a call: the largest per-rank dense linear's weight as fp16 (the MLP's
    merged gate_up, an attention group's merged qkv — no v_proj where K = V — or its o_proj), transient."""
    m, tp = c.m, c.tp
    sizes = [2 * ((m.intermediate_size or 0) // tp) * m.hidden_size]
    for grp in m.layer_groups:
        if grp.kind != "linear" and grp.head_dim:
            heads = m.num_attention_heads // tp
            kv = max(1, grp.kv_heads // tp) * (1 if grp.k_eq_v else 2)
            sizes += [(heads + kv) * grp.head_dim * m.hidden_size, heads * grp.head_dim * m.hidden_size]
    mib = max(sizes) * 2 / 2**20
    return (f"a prefill of >= {W4_DEQUANT_MIN_ROWS} tokens dequantizes one linear's weight to fp16 for the call and "
            f"runs the fp16 GEMM: {mib:.0f} MiB transient at most (the largest per-rank linear), inside the activation "
            f"peak vLLM's profiling prefill measures")


def _w4a16_moe_overlay(c: _Ctx, k: int, g: int) -> Constraint | None:
    """The W4A16 MoE through a kernel overlay (sm70-w4-gemm: K multiples of 32, groups multiples of 16), or None."""
    ov, _ = _format_overlay_for(c)
    if ov is None or c.w.bits != 4:
        return None
    bad = [f"per-rank expert K {k} % 32 = {k % 32}"] if k % 32 else []
    bad += [f"hidden {c.m.hidden_size} % 32 = {c.m.hidden_size % 32}"] if c.m.hidden_size % 32 else []
    bad += [f"group {g} is not a positive multiple of 16"] if g <= 0 or g % 16 else []
    if bad:
        return Constraint("quant-kernel", "fail", f"kernel overlay {ov} cannot take this MoE: {'; '.join(bad)}")
    return Constraint("quant-kernel", "pass", f"MoE W4A16 on sm {c.hw.sm}: kernel overlay {ov} (WMMA, per-rank "
                      f"expert K {k}, group {g}; Marlin is never picked there; weights as loaded, no repack: 0 extra "
                      f"bytes)")


def c_drafter(c: _Ctx) -> Constraint:
    d, e = c.d, c.e
    if d is None:
        return Constraint("drafter", "skip", "no drafter requested")
    probs = []
    if c.m.id not in d.models:
        probs.append(f"{d.id} drafts for {', '.join(d.models)}, not {c.m.id}")
    if d.method not in e.drafter_methods:
        probs.append(f"method {d.method} unknown to {e.id}")
    if d.model_type and d.model_type not in e.drafter_model_types:
        probs.append(f"{e.id} has no {d.model_type} drafter model (vLLM >= {d.min_vllm or '?'})")
    elif d.min_vllm and Version(e.vllm_version) < Version(d.min_vllm):
        probs.append(f"needs vLLM >= {d.min_vllm}, {e.id} is {e.vllm_version}")
    if probs:
        return Constraint("drafter", "fail", "; ".join(probs))
    return Constraint("drafter", "pass",
                      f"{d.id}: {d.method}, {d.default_tokens} speculative tokens (max {d.max_tokens}), {d.size_gb} GB")


def c_context(c: _Ctx) -> Constraint:
    mx = c.m.max_context
    if c.ctx is None:
        return Constraint("context", "pass", f"no --ctx: the largest that fits, up to the model's {mx}")
    if c.ctx > mx:
        return Constraint("context", "fail", f"ctx {c.ctx} > model max_context {mx}")
    if c.ctx < 1:
        return Constraint("context", "fail", f"ctx {c.ctx} must be positive")
    return Constraint("context", "pass", f"ctx {c.ctx} <= model max_context {mx}")


def c_memory(c: _Ctx, mm: mem.Memory) -> Constraint:
    pc = mm.per_card
    head = (f"per card: weights {_gb(pc['weights'])} ({mm.weights_source}) + drafter {_gb(pc['drafter'])} "
            f"+ overhead {_gb(pc['overhead'])} + "
            f"activations {_gb(pc['activations'])} of budget {_gb(pc['budget'])} -> KV {_gb(pc['kv_available'])}")
    if pc["kv_available"] <= 0:
        over = pc["weights"] + pc["drafter"] + pc["overhead"] + pc["activations"] - pc["budget"]
        return Constraint("memory", "fail", f"{head}; over by {_gb(over)}")
    tail = f"; max ctx {mm.max_ctx} x {mm.max_seqs} seq, {mm.kv_bytes_per_token_per_card} B/token/card"
    need = c.ctx or mem.MIN_USEFUL_CTX
    if mm.max_ctx < need:
        return Constraint("memory", "fail", f"{head}{tail}; needs ctx {need}")
    if c.ctx is not None and mm.max_ctx < int(c.ctx * 1.1):
        return Constraint("memory", "warn", f"{head}{tail}; ctx {c.ctx} within 10% of the limit")
    if c.ctx is None and mm.max_ctx < 32768:
        return Constraint("memory", "warn", f"{head}{tail}; under 32K context")
    return Constraint("memory", "pass", head + tail)


def c_overlays(c: _Ctx) -> tuple[Constraint, list[str]]:
    if c.index is None:
        return Constraint("overlays", "skip", "no overlay catalog"), []
    facts = DeploymentFacts(family=c.m.family, weight_format=c.w.format, quant_method=c.w.quant_method, sm=c.hw.sm,
                            head_dims=tuple(c.m.head_dims), transformers=c.e.transformers_version,
                            moe=c.m.moe is not None, drafter_model_type=c.d.model_type if c.d is not None else None,
                            device=c.hw.device)
    verdicts = c.index.evaluate(facts, c.e.vllm_version)
    needed = [v.id for v in verdicts if v.needed and v.result != "fail"]
    if not verdicts:
        return Constraint("overlays", "pass", f"no overlay needed on vLLM {c.e.vllm_version}"), []
    worst = max((RANK[v.result] for v in verdicts), default=0)
    result = {0: "pass", 1: "warn", 2: "fail"}[worst]
    return Constraint("overlays", result, "; ".join(v.note for v in verdicts)), needed


def c_nvlink(c: _Ctx) -> Constraint:
    if c.tp <= 1:
        return Constraint("nvlink", "skip", "TP 1: no all-reduce")
    if c.hw.nvlink:
        return Constraint("nvlink", "pass", f"{c.hw.id}: NVLink for TP {c.tp} all-reduce")
    return Constraint("nvlink", "warn",
                      f"{c.hw.id}: no NVLink; TP {c.tp} all-reduce over PCIe (advisory: slower decode)")


# ----------------------------------------------------------------------------- unverified fields

# Which constraints rest on which profile field (the field's root name, as written in a
# profile's `unverified` list: `layer_groups[1].kv_heads (...)` -> `layer_groups`).
UNVERIFIED_RESTS_ON: dict[str, dict[str, tuple[str, ...]]] = {
    "models": {
        "architecture": ("engine-family",), "family": ("engine-family",), "min_transformers": ("engine-family",),
        "hidden_size": ("quant-kernel", "memory"), "num_layers": ("memory",),
        "num_attention_heads": ("tp-heads",), "layer_groups": ("tp-heads", "head-dim", "memory"),
        "vocab_size": ("memory",), "intermediate_size": ("quant-kernel",), "moe": ("quant-kernel", "memory"),
        "max_context": ("context", "memory"), "dtype": ("dtype",),
    },
    "weights": {
        "format": ("weight-format",), "quant_method": ("quant-kernel",), "bits": ("quant-kernel",),
        "group_size": ("quant-kernel",), "size_gb": ("memory",), "replicated_gb": ("memory",),
        "hf_repo": ("weight-format",), "moe_fallback": ("quant-kernel",),
    },
    "engines": {
        "image": ("engine-sm",), "image_recipe": (), "vllm_version": ("overlays", "drafter"),
        "upstream_ref": ("overlays",), "device": ("engine-sm", "overlays"), "server": (),
        "transformers_version": ("engine-family", "overlays"), "cuda_version": ("engine-sm",),
        "cuda_arch_list": ("engine-sm",), "min_sm": ("engine-sm",), "target_sm": (), "families": ("engine-family",),
        "weight_formats": ("weight-format",), "kv_dtypes": ("kv-dtype",), "attention": ("head-dim",),
        "forced_attention": ("head-dim",), "drafter_methods": ("drafter",), "drafter_model_types": ("drafter",),
        "k_eq_v_cache_copies": ("memory",), "marlin_moe_tile_padding": ("quant-kernel",),
        "marlin_min_sm": ("quant-kernel",), "marlin_moe_ignores_sm": ("quant-kernel",),
        "quant_min_sm": ("quant-kernel",),
    },
    "drafters": {
        "size_gb": ("drafter", "memory"), "default_tokens": ("drafter",), "max_tokens": ("drafter",),
        "method": ("drafter",), "model_type": ("drafter",), "min_vllm": ("drafter",), "hf_repo": ("drafter",),
    },
    "hardware": {
        "sm": ("engine-sm", "head-dim", "quant-kernel"), "device": ("engine-sm", "overlays"), "vram_gb": ("memory",),
        "vram_bytes": ("memory",), "safe_mem_util": ("memory",), "bf16": ("dtype", "kv-dtype"),
        "fp8": ("dtype", "kv-dtype"), "smem_per_block_kb": ("head-dim",), "nvlink": ("nvlink",),
    },
}


def _field_root(entry: str) -> str:
    return re.split(r"[\s(\[.:]", entry.strip(), maxsplit=1)[0]


def unverified_fields(c: _Ctx) -> list[tuple[str, str, tuple[str, ...]]]:
    """(where, field as written, constraints resting on it) for every profile in this deployment."""
    parts: list[tuple[str, str, Documented]] = [("models", f"models/{c.m.id}", c.m),
                                                ("weights", f"models/{c.m.id}.weights.{c.vid}", c.w),
                                                ("engines", f"engines/{c.e.id}", c.e),
                                                ("hardware", f"hardware/{c.hw.id}", c.hw)]
    if c.d is not None:
        parts.append(("drafters", f"drafters/{c.d.id}", c.d))
    out = []
    for kind, where, prof in parts:
        for entry in prof.unverified:
            root = _field_root(entry)
            out.append((where, entry, UNVERIFIED_RESTS_ON[kind].get(root, ())))
    return out


def mark_unverified(cons: list[Constraint], fields: list[tuple[str, str, tuple[str, ...]]]) -> list[Constraint]:
    """Each constraint resting on an unverified field names it; the `unverified` constraint warns and
    lists every field with what rests on it. It is the evidence, kept apart from the verdict (issue 26
    point 4): the verdict is what the numbers and limits say, `FitReport.evidence` how many unverified
    facts they rest on."""
    by_cid: dict[str, list[str]] = {}
    for where, entry, cids in fields:
        for cid in cids:
            by_cid.setdefault(cid, []).append(f"{where}.{_field_root(entry)}")
    out = []
    for x in cons:
        names = by_cid.get(x.id)
        if names and x.result != "skip":
            x = Constraint(x.id, x.result, f"{x.message} [rests on unverified: {', '.join(dict.fromkeys(names))}]")
        out.append(x)
    if fields:
        listed = "; ".join(f"{where}.{entry}" + (f" (-> {', '.join(cids)})" if cids else "")
                           for where, entry, cids in fields)
        out.append(Constraint("unverified", "warn", f"{len(fields)} unverified profile field(s): {listed}"))
    else:
        out.append(Constraint("unverified", "pass", "every profile field in this deployment names its source"))
    return out


# ----------------------------------------------------------------------------- entry point


def _catalog_for(profiles: Profiles, catalog: Catalog | None) -> Catalog | None:
    if catalog is not None:
        return catalog
    if profiles.root is not None:
        root = Path(profiles.root).parent
        if root.is_dir():
            return Catalog(root)
    return None


def fits(
    profiles: Profiles,
    *,
    model: str | None = None,
    hardware: str,
    gpus: int = 1,
    tp: int | None = None,
    weights: str | None = None,
    engine: str | None = None,
    drafter: str | None = None,
    ctx: int | None = None,
    kv_dtype: str | None = None,
    max_seqs: int | None = None,
    catalog: Catalog | None = None,
    overlay_index: OverlayIndex | None = None,
    checkpoint: Inspection | None = None,
) -> FitReport:
    """Check one deployment against every constraint; see docs/profiles.md.

    `checkpoint` (a manager.inspect.Inspection) replaces `model`/`weights` with the checkpoint's
    own config and its exact per-rank weight bytes from the safetensors headers."""
    measured: dict[int, tuple[int, int]] = {}
    if checkpoint is not None:
        from .checkpoint import with_checkpoint

        profiles, model, weights, measured = with_checkpoint(profiles, checkpoint)
    m: ModelProfile = profiles.get("models", model)
    hw: HardwareProfile = profiles.get("hardware", hardware)
    vid = weights or m.default_weights
    if vid not in m.weights:
        raise ProfileError(f"models/{m.id}: weights: {vid!r}: no such variant (have: {', '.join(sorted(m.weights))})")
    e = profiles.get("engines", engine) if engine else default_engine(profiles, hw, m)
    d = profiles.get("drafters", drafter) if drafter else None
    tp_ = tp if tp is not None else gpus
    kvd = kv_dtype or "auto"
    if overlay_index is None:
        cat = _catalog_for(profiles, catalog)
        overlay_index = index_for(cat) if cat is not None else None
    c = _Ctx(profiles, m, vid, m.weights[vid], hw, e, d, gpus, max(tp_, 1), ctx, kvd, max_seqs, overlay_index)
    mm = mem.compute(m, c.w, hw, e, tp=c.tp, kv_dtype=kvd, ctx=ctx, max_seqs=max_seqs,
                     drafter_gb=d.size_gb if d else 0.0, measured=measured.get(c.tp))
    ov, needed = c_overlays(c)
    cons = [c_gpu_count(c), c_tp_heads(c), c_engine_family(c), c_weight_format(c), c_engine_sm(c), c_dtype(c),
            c_kv_dtype(c), c_head_dim(c), c_quant_kernel(c), c_drafter(c), c_context(c), c_memory(c, mm), ov,
            c_nvlink(c)]
    unv = unverified_fields(c)
    cons = mark_unverified(cons, unv)
    # nvlink is advisory; `unverified` is the evidence, reported beside the verdict (FitReport.evidence)
    worst = max(RANK[x.result] for x in cons if x.id != "unverified" and (x.id != "nvlink" or x.result != "warn"))
    deployment = {"model": m.id, "weights": vid, "hardware": hw.id, "gpus": gpus, "tp": c.tp, "engine": e.id,
                  "image": e.image, "drafter": d.id if d else None, "ctx": ctx, "kv_dtype": kvd, "max_seqs": max_seqs,
                  "unverified": [f"{where}.{entry}" for where, entry, _ in unv]}
    return FitReport(VERDICT[worst], cons, needed, mm, deployment)
