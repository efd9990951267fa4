"""The sm70-w4-gemm overlay's launcher (files/sm70_w4_kernels.py), loaded from its file as the kernel tests and
benchmarks/kernels_w4.py use it (the overlay writes it into vLLM; here it is loaded by path, once per process)."""

from __future__ import annotations

import re

from tests.helpers import SHIPPED_OVERLAYS
from tests.kernels.launcher import load_by_path

W4_DIR = SHIPPED_OVERLAYS / "sm70-w4-gemm"
W4_LAUNCHER = W4_DIR / "files" / "sm70_w4_kernels.py"
W4_SOURCE = W4_DIR / "csrc" / "w4_gemm.cu"


def w4_launcher(name: str = "sm70_w4_kernels"):
    return load_by_path(name, W4_LAUNCHER)


def gemv_entries(src: str | None = None) -> dict[str, dict[str, int]]:
    """The W4_GEMV_ENTRY lines of csrc/w4_gemm.cu: entry name -> {field: value} named by the macro's own parameter
    list (FMT, FUSE, CPW, KC, BMAX, XR, MINB; true/false as 1/0), so a new field needs no second parser."""
    src = W4_SOURCE.read_text() if src is None else src
    fields = re.search(r"^#define W4_GEMV_ENTRY\(NAME, ([^)]*)\)", src, flags=re.M).group(1).split(", ")
    out = {}
    for line in re.findall(r"^W4_GEMV_ENTRY\((.*)\)$", src, flags=re.M):
        name, *vals = line.split(", ")
        if len(vals) != len(fields):
            raise ValueError(f"W4_GEMV_ENTRY({line}): {len(vals)} values for {len(fields)} fields {fields}")
        out[name] = {f: 1 if v == "true" else 0 if v == "false" else int(v)
                     for f, v in zip(fields, vals, strict=True)}
    return out
