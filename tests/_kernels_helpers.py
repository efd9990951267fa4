"""NVRTC 12 from PyPI wheels for the kernel tests, installed once into the test cache.

`nvrtc12_lib()` pip-installs nvidia-cuda-nvrtc-cu12 (+ the runtime and cccl header
wheels) into <manager.releases.cache_dir()>/nvrtc12/<version> and returns the path of
libnvrtc.so.12 there. Nothing is committed; CI downloads once per cache.
"""

from __future__ import annotations

import importlib.util
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
OVERLAY_DIR = Path(__file__).resolve().parent.parent / "overlays"
# the sm70-d512-attention overlay's launcher: written into vLLM beside the routed module, loaded here from its file
D512_LAUNCHER = OVERLAY_DIR / "sm70-d512-attention" / "files" / "sm70_d512_kernels.py"


def d512_launcher(name: str = "sm70_d512_kernels"):
    """The overlay's launcher module (files/sm70_d512_kernels.py), loaded from its file once per
    process under `name` (its load() memo is per module object, as in the serving process)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, D512_LAUNCHER)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


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
