"""The sm70-w4-gemm overlay's launcher (files/sm70_w4_kernels.py), loaded from its file as the kernel tests and
benchmarks/kernels_w4.py use it (the overlay writes it into vLLM; here it is loaded by path, once per process)."""

from __future__ import annotations

import importlib.util
import sys

from tests.helpers import SHIPPED_OVERLAYS

W4_DIR = SHIPPED_OVERLAYS / "sm70-w4-gemm"
W4_LAUNCHER = W4_DIR / "files" / "sm70_w4_kernels.py"


def w4_launcher(name: str = "sm70_w4_kernels"):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, W4_LAUNCHER)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]
