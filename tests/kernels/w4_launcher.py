"""The sm70-w4-gemm overlay's launcher (files/sm70_w4_kernels.py), loaded from its file as the kernel tests and
benchmarks/kernels_w4.py use it (the overlay writes it into vLLM; here it is loaded by path, once per process)."""

from __future__ import annotations

from tests.helpers import SHIPPED_OVERLAYS
from tests.kernels.launcher import load_by_path

W4_DIR = SHIPPED_OVERLAYS / "sm70-w4-gemm"
W4_LAUNCHER = W4_DIR / "files" / "sm70_w4_kernels.py"


def w4_launcher(name: str = "sm70_w4_kernels"):
    return load_by_path(name, W4_LAUNCHER)
