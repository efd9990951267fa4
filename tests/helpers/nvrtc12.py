"""NVRTC 12 from PyPI wheels for the kernel tests, installed once into the test cache.

`nvrtc12_lib()` pip-installs nvidia-cuda-nvrtc-cu12 (+ the runtime and cccl header
wheels) into <manager.releases.cache_dir()>/nvrtc12/<version> and returns the path of
libnvrtc.so.12 there. Nothing is committed; CI downloads once per cache.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from filelock import FileLock

from manager.releases import cache_dir

NVRTC12_WHEELS = (
    "nvidia-cuda-nvrtc-cu12==12.9.86",
    "nvidia-cuda-runtime-cu12==12.9.79",
    "nvidia-cuda-cccl-cu12==12.9.27",
)


def nvrtc12_lib() -> Path:
    target = cache_dir() / "nvrtc12" / "12.9.86"
    lib = target / "nvidia" / "cuda_nvrtc" / "lib" / "libnvrtc.so.12"
    marker = target / ".ready"
    if marker.exists() and lib.exists():
        return lib
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if marker.exists() and lib.exists():
            return lib
        env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--only-binary=:all:",
             "--target", str(target), "--upgrade", *NVRTC12_WHEELS],
            capture_output=True, text=True, env=env,
        )
        if proc.returncode != 0 or not lib.exists():
            raise RuntimeError(f"installing NVRTC 12 wheels failed: {(proc.stderr or proc.stdout)[-500:]}")
        marker.write_text("ok\n")
    return lib
