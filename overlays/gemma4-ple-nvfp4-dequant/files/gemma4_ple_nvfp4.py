"""Gemma-4's per-layer embedding (E2B/E4B) from an NVFP4 checkpoint, dequantized to the model's dtype at load.

NVFP4 checkpoints of E2B/E4B store `embed_tokens_per_layer` in compressed-tensors' nvfp4-pack-quantized form
(`weight_packed` uint8 [vocab, D/2], `weight_scale` float8_e4m3fn [vocab, D/16], `weight_global_scale` float32 [1],
and an `input_global_scale` no embedding reads), while vLLM builds the table as a plain VocabParallelEmbedding whose
only parameter is `weight`: loading stops with KeyError: 'embed_tokens_per_layer.weight_packed'. Gemma4Model's
load_weights hands those tensors here (the overlay's edit); once the three a dequantization needs have arrived, the
table is rebuilt as value = e2m1 x e4m3 / weight_global_scale (vLLM's own convention: nvfp4_emulation_utils.py,
dequantize_to_dtype) in row chunks, in the parameter's dtype, and loaded through the parameter's own weight_loader
(which keeps this rank's vocab shard).

Memory: the table is held dequantized, 2 bytes per element instead of 0.5625 (packed + scales): E2B 262144 x 8960
-> 4.70 GB instead of 1.32 GB (+3.38 GB), E4B 262144 x 10752 -> 5.64 GB instead of 1.59 GB (+4.05 GB), divided over
the tensor-parallel ranks (vocab-sharded), the same as the bf16 checkpoint's table; while loading, the host holds one
full dequantized copy once.
"""

from __future__ import annotations

import torch

from vllm.logger import init_logger

logger = init_logger(__name__)

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
NEEDED = ("weight_packed", "weight_scale", "weight_global_scale")
ROWS_PER_CHUNK = 4096
_pending: dict[str, dict[str, torch.Tensor]] = {}


def dequantize(packed: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[V, D/2] uint8 E2M1 pairs (even column in the low nibble) x [V, D/16] E4M3 / global scale -> [V, D] `dtype`."""
    rows, half = packed.shape
    out = torch.empty((rows, half * 2), dtype=dtype, device=packed.device)
    lut = torch.tensor(E2M1, dtype=torch.float32, device=packed.device)
    g = global_scale.reshape(-1)[0].to(torch.float32)
    for r in range(0, rows, ROWS_PER_CHUNK):
        p = packed[r:r + ROWS_PER_CHUNK].to(torch.int64)
        codes = torch.stack((p & 0xF, p >> 4), dim=-1).reshape(p.shape[0], -1)
        vals = lut[codes & 7] * torch.where(codes & 8 > 0, -1.0, 1.0)
        step = (scale[r:r + ROWS_PER_CHUNK].to(torch.float32) / g).repeat_interleave(16, dim=-1)
        out[r:r + ROWS_PER_CHUNK] = (vals * step).to(dtype)
    return out


def collect(name: str, tensor: torch.Tensor, params_dict: dict) -> str | None:
    """Keep one NVFP4 tensor of the per-layer embedding; when the set is complete, load the dequantized table and
    return the parameter's name (None while waiting)."""
    prefix, part = name.rsplit(".", 1)
    if part == "input_global_scale":
        return None   # activations of an embedding lookup are not quantized
    got = _pending.setdefault(prefix, {})
    got[part] = tensor
    if not all(k in got for k in NEEDED):
        return None
    del _pending[prefix]
    target = prefix + ".weight"
    param = params_dict[target]
    table = dequantize(got["weight_packed"], got["weight_scale"], got["weight_global_scale"], param.dtype)
    logger.info("gemma4 per-layer embedding: NVFP4 %s dequantized to %s at load (%.2f GB instead of %.2f GB packed)",
                tuple(table.shape), param.dtype, table.numel() * table.element_size() / 1e9,
                (got["weight_packed"].numel() + got["weight_scale"].numel()) / 1e9)
    param.weight_loader(param, table)
    return target
