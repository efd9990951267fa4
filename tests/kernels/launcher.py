"""The sm70-d512-attention overlay's launcher (files/sm70_d512_kernels.py), as the kernel tests and
benchmarks/kernels*.py load it: written into vLLM beside the routed module by the overlay, loaded here from its file."""

from __future__ import annotations

import importlib.util
import sys

from tests.helpers import SHIPPED_OVERLAYS

D512_LAUNCHER = SHIPPED_OVERLAYS / "sm70-d512-attention" / "files" / "sm70_d512_kernels.py"


def load_by_path(name: str, path):
    """The module in `path`, loaded once per process under `name` (a launcher's load() memo is per
    module object, as in the serving process); a failed load leaves no half module behind."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


def d512_launcher(name: str = "sm70_d512_kernels"):
    """The overlay's launcher module (files/sm70_d512_kernels.py), loaded from its file once per process."""
    return load_by_path(name, D512_LAUNCHER)
