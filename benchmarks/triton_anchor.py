"""Stage vLLM 0.20.0's Triton `unified_attention` alone, for `benchmarks/kernels.py --triton` on a machine
without vLLM (the H200 image has torch and Triton 3.6, not vLLM).

    python benchmarks/triton_anchor.py DEST      # then PYTHONPATH=DEST python3 benchmarks/kernels.py --triton ...

Copies the two kernel files from the pinned 0.20.0 sdist (`manager.releases.release_file`, sha256-checked:
vllm/v1/attention/ops/triton_unified_attention.py and triton_attention_helpers.py) into DEST/vllm/... and
writes the few names they import from the rest of vLLM as stubs (vllm.envs.VLLM_BATCH_INVARIANT = False,
vllm.logger.init_logger, vllm.platforms.current_platform.fp8_dtype() = torch.float8_e4m3fn as on CUDA,
vllm.triton_utils.{tl, triton}, vllm.v1.kv_cache_interface.KVQuantMode as in 0.20.0). Nothing of vLLM is
committed here; DEST is a scratch directory.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VERSION = "0.20.0"
FILES = {
    "vllm/v1/attention/ops/triton_unified_attention.py":
        "f41f855b762b7ef84c57e900b7fd5baa5dd001277401b7b84df3e4c2d634f1eb",
    "vllm/v1/attention/ops/triton_attention_helpers.py":
        "6edac7cd3d021f41c9c5a59af739e0d032836d0f06da4d782b02e5a0b951ff50",
}
STUBS = {
    "vllm/__init__.py": f'__version__ = "{VERSION} (triton_unified_attention only, benchmarks/triton_anchor.py)"\n',
    "vllm/envs.py": "VLLM_BATCH_INVARIANT = False\n",
    "vllm/logger.py": "import logging\n\n\ndef init_logger(name):\n    return logging.getLogger(name)\n",
    "vllm/platforms/__init__.py": ("import torch\n\n\nclass _Cuda:\n    @staticmethod\n    def fp8_dtype():\n"
                                   "        return torch.float8_e4m3fn\n\n\ncurrent_platform = _Cuda()\n"),
    "vllm/triton_utils/__init__.py": "import triton\nimport triton.language as tl\n",
    "vllm/v1/__init__.py": "", "vllm/v1/attention/__init__.py": "", "vllm/v1/attention/ops/__init__.py": "",
    "vllm/v1/kv_cache_interface.py": (
        "from enum import IntEnum\n\n\nclass KVQuantMode(IntEnum):   # vllm/v1/kv_cache_interface.py (0.20.0)\n"
        "    NONE = 0\n    FP8_PER_TENSOR = 1\n    INT8_PER_TOKEN_HEAD = 2\n"
        "    FP8_PER_TOKEN_HEAD = 3\n    NVFP4 = 4\n\n"
        "    @property\n    def is_per_token_head(self):\n"
        "        return self in (KVQuantMode.INT8_PER_TOKEN_HEAD, KVQuantMode.FP8_PER_TOKEN_HEAD)\n"),
}


def stage(dest: Path) -> Path:
    from manager.releases import release_file

    dest = Path(dest)
    for rel, text in STUBS.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_text(text)
    for rel, sha in FILES.items():
        (dest / rel).write_bytes(release_file(VERSION, rel, sha))
    return dest


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python benchmarks/triton_anchor.py DEST")
    print(stage(Path(sys.argv[1])))
