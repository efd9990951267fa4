"""Kernel overlays: the `kernels:` manifest section, NVRTC builds into a
content-addressed cache, and a CUDA driver-API loader/launcher.

Importing this package needs neither a GPU, torch, nor NVRTC.
"""

from __future__ import annotations

from .builder import BuildItem, BuildResult, build, default_cache_dir
from .spec import EntryPoint, KernelSource, KernelsSpec, Param, load_kernels_spec

__all__ = [
    "BuildItem", "BuildResult", "build", "default_cache_dir",
    "EntryPoint", "KernelSource", "KernelsSpec", "Param", "load_kernels_spec",
]
