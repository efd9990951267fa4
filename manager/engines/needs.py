"""Which CUDA components a Gemma-4 step needs on a given SM, as vLLM 0.19.x selects them.

Each rule names a component (a binary, or a group of its translation units), what it is for,
and the SM from which vLLM selects it, with the source file (vLLM 0.19.1 sdist, path:line)
that says so. `classify` turns a component's code (runs on the SM or not) into a finding:

- needed: a Gemma-4 step calls it on any SM; no code for the SM -> the engine does not run.
- backend: an alternative vLLM selects only from `min_sm` (flash-attn, FlashMLA, cutlass sm90+);
  below it, missing code is harmless.
- format: kernels of named weight formats; missing code is a limit (those formats are
  unusable on the SM), not a failure.
- other: not on a Gemma-4 path (other model families, CPU-side tools); reported, not decisive.

Derived from the sources, not from a run on the hardware: nothing here was run on a V100.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

NEEDED, BACKEND, FORMAT, OTHER = "needed", "backend", "format", "other"
V = "vLLM 0.19.1 sdist"


@dataclass(frozen=True)
class Rule:
    component: str
    binary: str  # fnmatch pattern on the path inside site-packages
    tus: str | None  # regex (fullmatch) on TU names; None: the whole binary
    role: str
    why: str
    source: str
    min_sm: int = 0  # backend/format: vLLM selects it only from this SM
    whole_library: bool = False  # a vendor library dispatching per arch: runs if any TU has code


MARLIN_TUS = r"(marlin|marlin_int4_fp8_preprocess|gptq_marlin_repack|awq_marlin_repack|ops|sm\d+_kernel_\w+)_cu"

RULES: tuple[Rule, ...] = (
    # vllm/_C: the kernels of every forward step
    Rule("vllm _C: cache, rms_norm, activation, rotary, sampler, topk", "vllm/_C.abi3.so",
         r"(cache_kernels|cache_kernels_fused|layernorm_kernels|activation_kernels|pos_encoding_kernels"
         r"|fused_qknorm_rope_kernel|sampler|topk|merge_attn_states|cuda_view)_cu",
         NEEDED, "called by every decoder step (rms_norm, gelu_and_mul, rotary, reshape_and_cache, sampling)",
         f"{V}: vllm/_custom_ops.py:391 rotary_embedding, :405 rms_norm, :2508 reshape_and_cache_flash; "
         "vllm/model_executor/layers/activation.py:277 (gelu_tanh_and_mul, Gemma4MLP: models/gemma4.py:94)"),
    Rule("vllm _C: custom all-reduce (TP > 1)", "vllm/_C.abi3.so", r"custom_all_reduce_cu", NEEDED,
         "tensor parallel all-reduce (TP=2 deployments)",
         f"{V}: vllm/_custom_ops.py:2715 (torch.ops._C_custom_ar.init_custom_ar)"),
    Rule("vllm _C: Marlin (GPTQ/AWQ-Marlin, FP8-Marlin, NVFP4-Marlin)", "vllm/_C.abi3.so", MARLIN_TUS, FORMAT,
         "weight formats gptq_marlin, awq_marlin, fp8/nvfp4 Marlin fallbacks",
         f"{V}: vllm/model_executor/layers/quantization/gptq_marlin.py:183, awq_marlin.py:206 (min capability 75)",
         min_sm=75),
    Rule("vllm _C: NVFP4 / MXFP4 / MXFP8 kernels", "vllm/_C.abi3.so",
         r"(nvfp4_\w+|activation_nvfp4_quant_fusion_kernels|fused_quantize_\w+|mxfp8_experts_quant"
         r"|cutlass_mxfp8_grouped_mm|gemm|gemm_ada)_cu",
         FORMAT, "weight formats NVFP4/MXFP4/MXFP8 (Blackwell kernels)",
         f"{V}: vllm/model_executor/layers/quantization/modelopt.py:1013 (NVFP4: min capability 75, "
         "Marlin below sm_100), :1501 (MXFP8: min 100)", min_sm=100),
    Rule("vllm _C: cutlass scaled_mm / grouped_mm (FP8, INT8 W8A8)", "vllm/_C.abi3.so",
         r"(scaled_mm_\w+|grouped_mm_c3x_\w+|moe_data|w4a8_\w+)_cu", FORMAT,
         "FP8/INT8 W8A8 GEMMs (cutlass 2.x from sm75, 3.x sm90+)",
         f"{V}: vllm/model_executor/layers/quantization/fp8.py:145 (min capability 75)", min_sm=75),
    Rule("vllm _C: machete (W4A16 on Hopper)", "vllm/_C.abi3.so", r"machete_\w+_cu", FORMAT,
         "mixed-input GEMM kernels of Hopper",
         f"{V}: vllm/model_executor/kernels/linear/mixed_precision/machete.py:26 (min capability 90)",
         min_sm=90),
    Rule("vllm _C: AllSpark W8A16", "vllm/_C.abi3.so", r"allspark_\w+_cu", FORMAT,
         "AllSpark W8A16 GEMM (Ampere+)", f"{V}: csrc/quantization/gptq_allspark", min_sm=80),
    Rule("vllm _C: GPTQ q_gemm", "vllm/_C.abi3.so", r"q_gemm_cu", FORMAT, "weight format gptq (exllama kernels)",
         f"{V}: vllm/model_executor/layers/quantization/gptq.py:135 (min capability 60)", min_sm=60),
    Rule("vllm _C: GGUF", "vllm/_C.abi3.so", r"gguf_kernel_cu", FORMAT, "weight format gguf",
         f"{V}: vllm/model_executor/layers/quantization/gguf.py:71 (min capability 60)", min_sm=60),
    Rule("vllm _C: cutlass MLA (sm100)", "vllm/_C.abi3.so", r"sm100_cutlass_mla_kernel_cu", BACKEND,
         "MLA attention of DeepSeek-style models on Blackwell", f"{V}: vllm/platforms/cuda.py:59", min_sm=100),
    # vllm/_moe_C
    Rule("vllm _moe_C: moe_align, topk_softmax", "vllm/_moe_C.abi3.so",
         r"(moe_align_sum_kernels|topk_softmax_kernels)_cu", NEEDED,
         "routing of every MoE layer (Gemma-4 26B-A4B) before Triton's fused_moe",
         f"{V}: vllm/_custom_ops.py:2142 moe_align_block_size, :2294 topk_softmax (torch.ops._moe_C)"),
    Rule("vllm _moe_C: moe_wna16 (W4A16 MoE, CUDA cores)", "vllm/_moe_C.abi3.so", r"moe_wna16_cu", FORMAT,
         "W4A16 MoE weights (GPTQ/AWQ MoE) on CUDA cores",
         f"{V}: vllm/model_executor/layers/quantization/moe_wna16.py:97 (min capability 70)", min_sm=70),
    Rule("vllm _moe_C: Marlin MoE", "vllm/_moe_C.abi3.so", MARLIN_TUS, FORMAT,
         "Marlin MoE kernels (W4A16/FP8/NVFP4 MoE via Marlin)",
         f"{V}: vllm/model_executor/layers/quantization/gptq_marlin.py:183 (min capability 75)", min_sm=75),
    Rule("vllm _moe_C: DeepSeek-V3 router GEMM", "vllm/_moe_C.abi3.so", r"dsv3_router_gemm\w*_cu", BACKEND,
         "DeepSeek-V3 router (sm90+)", f"{V}: vllm/_custom_ops.py:2269", min_sm=90),
    # vllm/_C_stable_libtorch
    Rule("vllm _C_stable_libtorch", "vllm/_C_stable_libtorch.abi3.so", None, OTHER,
         "permute_cols, per_token_group_quant (FP8 block quantization)", f"{V}: csrc/libtorch_stable"),
    # attention backends vLLM does not select below their SM
    Rule("vllm flash-attn 2 (_vllm_fa2_C)", "vllm/vllm_flash_attn/_vllm_fa2_C*.so", None, BACKEND,
         "FLASH_ATTN backend (Gemma-4 forces TRITON_ATTN anyway)",
         f"{V}: vllm/v1/attention/backends/flash_attn.py:179 (capability >= 8.0), "
         "vllm/model_executor/models/config.py:103", min_sm=80),
    Rule("vllm flash-attn 3 (_vllm_fa3_C)", "vllm/vllm_flash_attn/_vllm_fa3_C*.so", None, BACKEND,
         "FLASH_ATTN backend, FA3 on Hopper", f"{V}: vllm/v1/attention/backends/flash_attn.py:179", min_sm=90),
    Rule("vllm FlashMLA", "vllm/_flashmla*.so", None, BACKEND,
         "MLA attention (DeepSeek-style models; Gemma-4 is not MLA)",
         f"{V}: vllm/platforms/cuda.py:59-95", min_sm=90),
    Rule("vllm DeepGEMM", "vllm/third_party/deep_gemm/*.so", None, BACKEND, "FP8 block GEMMs on Hopper+",
         "vLLM 0.20.0 wheel (vllm/third_party/deep_gemm)", min_sm=90),
    # torch and the CUDA libraries: vendor libraries dispatching per architecture
    Rule("torch libtorch_cuda", "torch/lib/libtorch_cuda.so", None, NEEDED, "every CUDA op of torch",
         "torch wheel (torch/lib)", whole_library=True),
    Rule("torch libtorch_cuda_linalg", "torch/lib/libtorch_cuda_linalg.so", None, NEEDED,
         "linalg ops (torch.linalg, used at load time by some layers)", "torch wheel (torch/lib)", whole_library=True),
    Rule("torch libc10_cuda", "torch/lib/libc10_cuda.so", None, NEEDED, "CUDA allocator/streams of torch",
         "torch wheel (torch/lib)", whole_library=True),
    Rule("torch libtorch_nvshmem", "torch/lib/libtorch_nvshmem.so", None, OTHER,
         "symmetric memory (not used by vLLM 0.19.1 TP)",
         "torch wheel (torch/lib)", whole_library=True),
    Rule("cuSPARSELt", "nvidia/cusparselt/lib/*.so*", None, BACKEND,
         "2:4 structured sparsity (not on the Gemma-4 path)",
         "nvidia-cusparselt-cu12 wheel", min_sm=80, whole_library=True),
    Rule("cuFFTW (FFTW interface)", "nvidia/cufft/lib/libcufftw.so*", None, OTHER,
         "FFTW-compatible wrapper over cuFFT; torch does not load it",
         "torch 2.10.0 wheel: torch/lib/libtorch_cuda.so DT_NEEDED lists libcufft.so.11, not libcufftw",
         whole_library=True),
    Rule("NVIDIA CUDA libraries", "nvidia/*/lib/*.so*", None, NEEDED,
         "cuBLAS, cuDNN, NCCL, cuRAND, cuSPARSE, cuSOLVER, cuFFT, NVSHMEM used by torch", "nvidia-*-cu12 wheels",
         whole_library=True),
    Rule("torchvision / torchaudio", "torch[va]*/*.so", None, OTHER,
         "image/audio ops (Gemma-4 preprocessing runs on CPU)",
         "torchvision / torchaudio wheels", whole_library=True),
)

FALLBACK_VLLM = Rule("vllm (other kernels)", "vllm/*", None, OTHER,
                     "kernels of other model families or features (mamba, minimax, sparse attention...)",
                     f"{V}: csrc/")
FALLBACK = Rule("other CUDA code", "*", None, OTHER, "not on a vLLM/Gemma-4 path", "", whole_library=True)


def rule_for(binary: str, tu: str | None) -> Rule:
    """The first rule whose binary pattern matches and whose TU pattern (if any) matches `tu`."""
    for rule in RULES:
        if not fnmatch.fnmatchcase(binary, rule.binary):
            continue
        if rule.tus is None:
            return rule
        if tu is not None and re.fullmatch(rule.tus, tu):
            return rule
    return FALLBACK_VLLM if binary.startswith("vllm/") else FALLBACK


@dataclass(frozen=True)
class Finding:
    verdict: str  # "runs" | "does not run" | "harmless" | "limit" | "not needed"
    note: str


def classify(rule: Rule, runs: bool, sm: int) -> Finding:
    """What a component whose code does (not) run on `sm` means for a Gemma-4 step there."""
    if runs:
        return Finding("runs", rule.why)
    if rule.role == NEEDED:
        return Finding("does not run", f"no code for sm_{sm}: {rule.why}")
    if rule.role == BACKEND:
        if sm < rule.min_sm:
            return Finding("harmless", f"not selected below sm_{rule.min_sm}: {rule.why}")
        return Finding("limit", f"selected from sm_{rule.min_sm} but has no code for sm_{sm}: {rule.why}")
    if rule.role == FORMAT:
        return Finding("limit", f"unusable on sm_{sm}: {rule.why}")
    return Finding("not needed", rule.why)
