"""Kernel overlays: the `kernels:` manifest section, NVRTC builds into a
content-addressed cache, and a CUDA driver-API loader/launcher.

Importing this package needs neither a GPU, torch, nor NVRTC. Names are loaded
lazily (PEP 562) so that the manifest schema (`manager.kernels.spec`) does not
pull in the builder and its dependencies on every `overlay` start.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names __getattr__ loads lazily, for type checkers and editors
    from .builder import BuildItem, BuildResult, build, default_cache_dir
    from .spec import EntryPoint, KernelSource, KernelsSpec, Param, load_kernels_spec

_EXPORTS = {
    "BuildItem": "builder", "BuildResult": "builder", "build": "builder", "default_cache_dir": "builder",
    "EntryPoint": "spec", "KernelSource": "spec", "KernelsSpec": "spec", "Param": "spec",
    "load_kernels_spec": "spec",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
