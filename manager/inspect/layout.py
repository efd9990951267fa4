"""Key-layout and config findings, and what each engine profile will do with them.

Every rule names where its facts come from. A finding is a property of the checkpoint's files;
an EngineCheck says, per engine profile, whether it loads as is, needs overlays (which), or
fails (with the message it fails with and the source of that message).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.version import InvalidVersion, Version

from ..overlays.info import OverlayInfo
from .headers import Shard, TensorEntry
from .quant import QuantScheme
from .tensors import Placement

if TYPE_CHECKING:
    from ..catalog import Catalog
    from ..profiles import Profiles
    from ..profiles.schema import ModelProfile

PR40886 = "vllm-pr40886-gemma4-awq-moe-keys"
CONVERTOR = "gemma4-convertor-per-layer"
PLE_NVFP4 = "gemma4-ple-nvfp4-dequant"

SRC_40886 = ("this project's runs of vLLM 0.20.0 (CPU build: docs/engine.md, tests/testing/test_real_engine_ab.py; "
             "H200, 2026-11-30: docs/kernels.md); "
             "vLLM 0.20.0 gemma4.py _weight_iterator explodes only float 3-D experts")
SRC_PLE = ("a user report of the E2B NVFP4 load (not public: unverified); vLLM 0.20.0 gemma4.py builds "
           "embed_tokens_per_layer as a " "VocabParallelEmbedding whose unquantized method registers only `weight`")
SRC_AMBIG = (
    "this project's runs (vLLM 0.19.1/0.20.0 + transformers 5.24: docs/engine.md, "
    "tests/testing/test_real_engine_ab.py); "
    "transformers 5.15.0 configuration_gemma4.py (per_layer_config; vllm-openai:v0.27.1 ships 5.15.0 by a public "
    "benchmark report, not read from the image)")
SRC_ARCH = "message text: vLLM 0.20.0 vllm/model_executor/models/registry.py; support: the engine profile's families"
SRC_TF = (
    "message text: transformers 5.24.0 models/auto/configuration_auto.py; minimum version: the transformers wheels "
    "on PyPI (models/gemma4/ from 5.5.0, absent in 5.4.0; models/gemma4_unified/ in 5.10.1, absent in 5.9.0)")
SRC_GROUP = ("vLLM 0.20.0 quantization/utils/marlin_utils.py verify_marlin_supports_shape: input_size_per_partition "
             "% group_size != 0 is refused (Marlin needs the per-rank K divisible by the group size)")

# Architectures an engine serves from a release on, beyond its profile's families (the vLLM sdists' models/registry.py).
ARCH_FROM = {"Gemma4UnifiedForConditionalGeneration": "0.24.0"}
# transformers that first has each model_type's config class (PyPI wheels: models/gemma4/ from 5.5.0;
# models/gemma4_unified/ in 5.10.1, absent in 5.9.0; PyPI's index offers no 5.10.0).
MODEL_TYPE_TRANSFORMERS = {"gemma4": "5.5.0", "gemma4_text": "5.5.0", "gemma4_unified": "5.10.0"}
# model_types vLLM reads through Gemma4ModelArchConfigConvertor (what gemma4-convertor-per-layer patches)
GEMMA4_CONVERTOR_TYPES = ("gemma4", "gemma4_text")


@dataclass(frozen=True)
class Finding:
    id: str
    severity: str  # info / warn / error
    message: str
    keys: tuple[str, ...] = ()  # example keys (at most 3)
    count: int = 0
    source: str = ""

    def to_json(self) -> dict[str, object]:
        return {"id": self.id, "severity": self.severity, "message": self.message, "keys": list(self.keys),
                "count": self.count, "source": self.source}


@dataclass(frozen=True)
class Failure:
    message: str
    source: str
    finding: str

    def to_json(self) -> dict[str, str]:
        return {"message": self.message, "source": self.source, "finding": self.finding}


@dataclass(frozen=True)
class EngineCheck:
    engine: str
    vllm_version: str
    transformers_version: str
    result: str  # loads / overlays / fails
    overlays: tuple[str, ...] = ()
    failures: tuple[Failure, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, object]:
        return {"engine": self.engine, "vllm": self.vllm_version, "transformers": self.transformers_version,
                "result": self.result, "overlays": list(self.overlays),
                "failures": [f.to_json() for f in self.failures], "notes": list(self.notes)}


def _layer(name: str) -> int:
    m = re.search(r"layers\.(\d+)\.", name)
    return int(m.group(1)) if m else -1


def _vllm_key(t: TensorEntry) -> str:
    """The name vLLM 0.20.0's _weight_iterator looks up for the first expert of a fused quantized tensor."""
    m = re.search(r"layers\.(\d+)\..*experts\.(gate_up_proj|down_proj)_(packed|scale|zero_point|shape)$", t.name)
    assert m is not None
    proj = "gate_proj" if m.group(2) == "gate_up_proj" else "down_proj"
    return f"layers.{m.group(1)}.moe.experts.0.{proj}_{m.group(3)}"


def key_findings(tensors: list[TensorEntry], places: list[Placement], text: dict[str, Any], cfg: dict[str, Any],
                 scheme: QuantScheme, model, shards: list[Shard]) -> list[Finding]:
    out: list[Finding] = []
    fused = [t for t, p in zip(tensors, places, strict=False)
             if p.rule == "experts" and p.param in ("packed", "scale", "zero_point")]
    if fused:
        first = min(fused, key=lambda t: (_layer(t.name), t.name))
        shapes = sorted({f"{t.name.rsplit('.', 1)[-1]} {list(t.shape)} {t.dtype}" for t in fused
                         if _layer(t.name) == _layer(first.name)})
        out.append(Finding(
            "fused-moe-quantized-experts", "warn",
            f"fused 3-D quantized expert tensors ({'; '.join(shapes)}): vLLM < 0.22.0 explodes only float "
            f"experts -> KeyError: '{_vllm_key(first)}' unless {PR40886} is applied",
            tuple(t.name for t in sorted(fused, key=lambda t: (_layer(t.name), t.name))[:3]), len(fused), SRC_40886))
    ple = [t for t, p in zip(tensors, places, strict=False) if p.cls == "embed_tokens_per_layer" and p.quantized]
    if ple:
        order = ("weight_packed", "qweight", "weight")
        params = sorted(t.name.rsplit(".", 1)[-1] for t in ple)
        key = "embed_tokens_per_layer." + next((p for p in order if p in params), params[0])
        nvfp4 = {"weight_packed", "weight_scale", "weight_global_scale"} <= set(params)
        fix = (f"unless {PLE_NVFP4} is applied (dequantizes it at load)" if nvfp4
               else "no overlay in the catalog handles this layout")
        out.append(Finding(
            "quantized-per-layer-embedding", "warn" if nvfp4 else "error",
            f"the per-layer embedding table is quantized ({', '.join(params)}): "
            f"vLLM loads it as a plain embedding -> KeyError: '{key}'; {fix}",
            tuple(t.name for t in ple[:3]), len(ple), SRC_PLE))
    family = str(cfg.get("model_type") or text.get("model_type") or "")
    # gemma4_text: a text-only checkpoint (Gemma4ForCausalLM); vLLM maps it to the same convertor
    # (0.20.0 vllm/transformers_utils/model_arch_config_convertor.py MODEL_ARCH_CONFIG_CONVERTORS)
    if family in GEMMA4_CONVERTOR_TYPES:
        form = ("transformers >= 5.15 per_layer_config" if text.get("per_layer_config")
                else "flat (global_head_dim / num_global_key_value_heads)")
        out.append(Finding(
            "gemma4-heterogeneous-config", "info",
            f"Gemma-4 config ({form}): under transformers >= 5.15 vLLM < 0.28.0 reads config.head_dim and raises "
            f"AmbiguousGlobalPerLayerAttributeError unless {CONVERTOR} is applied", (), 0, SRC_AMBIG))
    if scheme.method != "none" and scheme.group_size and scheme.group_size > 0 and model.moe is not None:
        k = model.moe.expert_intermediate_size
        if k % scheme.group_size:
            out.append(Finding("group-size-vs-expert-k", "warn",
                               f"quant group {scheme.group_size} does not divide the expert intermediate size {k} "
                               f"({k} % {scheme.group_size} = {k % scheme.group_size}): no Marlin MoE kernel at any TP "
                               "(`overlay fits` checks the fallback per engine)", (), 0, SRC_GROUP))
    short = [s for s in shards if s.truncated]
    if short:
        s = short[0]
        out.append(Finding(
            "truncated-shards", "warn",
            f"{len(short)} of {len(shards)} shards are shorter than their headers say (e.g. {s.file}: "
            f"{s.file_size} bytes, header describes {s.data_start + s.data_bytes}): an interrupted download "
            "or a header-only file; the engine would fail reading them", tuple(x.file for x in short[:3]),
            len(short), "the files' own headers and sizes"))
    return out


def _ge(a: str, b: str) -> bool:
    try:
        return Version(a) >= Version(b)
    except InvalidVersion:
        return False


def _catalog(profiles: Profiles, catalog: Catalog | None) -> Catalog | None:
    if catalog is not None:
        return catalog
    root = profiles.root
    if root is not None and Path(root).parent.is_dir():
        from ..catalog import Catalog

        return Catalog(Path(root).parent)
    return None


def _overlay_infos(cat: Catalog | None, ids: tuple[str, ...]) -> dict[str, OverlayInfo]:
    """The few manifests the layout rules name: present? valid? their `versions` and `native_from`."""
    from ..overlays.readinfo import read_overlay

    out: dict[str, OverlayInfo] = {}
    if cat is None:
        return out
    for oid in ids:
        mf = cat.overlays_dir / oid / "overlay.yaml"
        try:
            st = mf.stat()
        except OSError:
            continue
        key = (str(mf), st.st_mtime_ns, st.st_size)
        if key not in _MANIFESTS:
            _MANIFESTS[key] = read_overlay(mf)
        out[oid] = _MANIFESTS[key]
    return out


_MANIFESTS: dict[tuple[str, int, int], OverlayInfo] = {}  # (path, mtime, size) -> OverlayInfo


def engine_checks(findings: list[Finding], cfg: dict[str, Any], model: ModelProfile, profiles: Profiles,
                  catalog: Catalog | None = None) -> list[EngineCheck]:
    from ..overlays.readinfo import shipped_overlays

    infos = _overlay_infos(_catalog(profiles, catalog), (PR40886, CONVERTOR, PLE_NVFP4))
    ids = {f.id: f for f in findings}
    text: dict[str, Any] = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else cfg
    archs = list(cfg.get("architectures") or text.get("architectures") or [model.architecture])
    model_type = str(cfg.get("model_type") or model.family)
    out = []

    def engines_sorted():
        return sorted(profiles.engines.values(), key=lambda e: (e.fork, Version(e.vllm_version), e.id))

    for e in engines_sorted():
        overlays: list[str] = []
        fails: list[Failure] = []
        notes: list[str] = []

        # need() runs within this engine's iteration only: its loop variables are current (the B023 noqa below)
        def need(oid: str, finding: str, message: str, source: str) -> None:
            info = infos.get(oid)
            said = (info if info is not None and info.invalid is None and info.native_from
                    else shipped_overlays().get(oid))
            nf = said.native_from if said is not None else None
            if nf and _ge(e.vllm_version, nf):  # noqa: B023
                notes.append(f"{finding}: native in vLLM >= {nf} ({oid} not needed)")  # noqa: B023
                return
            if info is not None and not info.invalid and info.in_range(e.vllm_version):  # noqa: B023
                overlays.append(oid)  # noqa: B023
            else:
                why = "not in the catalog" if info is None else (f"its manifest is invalid: {info.invalid}"
                                                                 if info.invalid
                                                                 else f"outside its versions {info.versions}")
                fails.append(Failure(message, f"{source}; {oid} {why}", finding))  # noqa: B023

        arch_from = next((ARCH_FROM[a] for a in archs if a in ARCH_FROM), None)
        served = model.family in e.families or (arch_from is not None and _ge(e.vllm_version, arch_from))
        if arch_from is not None and not _ge(e.vllm_version, arch_from):
            served = False
        if not served:
            fails.append(Failure(
                f"ValueError: Model architectures {archs!r} are not supported for now. "
                "Supported architectures: [...]",
                SRC_ARCH + (f"; {archs[0]} from vLLM {arch_from} (vllm {arch_from} sdist models/registry.py)"
                            if arch_from else ""),
                "architecture"))
        tmin = MODEL_TYPE_TRANSFORMERS.get(model_type)
        if tmin and not _ge(e.transformers_version, tmin):
            fails.append(Failure(
                f"ValueError: The checkpoint you are trying to load has model type `{model_type}` but "
                "Transformers does not recognize this architecture.", SRC_TF + f" ({model_type} >= {tmin})",
                "transformers"))
        if "gemma4-heterogeneous-config" in ids and _ge(e.transformers_version, "5.15"):
            need(CONVERTOR, "gemma4-heterogeneous-config",
                 "transformers AmbiguousGlobalPerLayerAttributeError on config.head_dim "
                 "(vllm/transformers_utils/model_arch_config_convertor.py get_head_size)", SRC_AMBIG)
        f = ids.get("fused-moe-quantized-experts")
        if f is not None:
            key = re.search(r"KeyError: '([^']+)'", f.message)
            need(PR40886, f.id, f"KeyError: '{key.group(1) if key else '?'}'", SRC_40886)
        f = ids.get("quantized-per-layer-embedding")
        if f is not None:
            key = re.search(r"KeyError: '([^']+)'", f.message)
            msg = f"KeyError: '{key.group(1) if key else 'embed_tokens_per_layer.weight_packed'}'"
            src = SRC_PLE + ("" if e.vllm_version == "0.20.0" else f" (loader of {e.vllm_version} not re-read)")
            if PLE_NVFP4 in f.message:
                need(PLE_NVFP4, f.id, msg, src)
            else:
                fails.append(Failure(msg, src, f.id))
        result = "fails" if fails else ("overlays" if overlays else "loads")
        out.append(EngineCheck(e.id, e.vllm_version, e.transformers_version, result, tuple(overlays), tuple(fails),
                               tuple(notes)))
    return out
