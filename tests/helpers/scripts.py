"""benchmarks/ scripts (not a package) loaded by path for their tests, each under a name of its own."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from . import BENCHMARKS


def load_script(name: str, tag: str = "under_test") -> ModuleType:
    """benchmarks/<name>.py as the module `<name>_<tag>` (registered in sys.modules, so dataclasses resolve)."""
    spec = importlib.util.spec_from_file_location(f"{name}_{tag}", BENCHMARKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
