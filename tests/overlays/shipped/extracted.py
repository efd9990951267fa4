"""Code pulled out of real (patched or pristine) release files and run without vLLM.

- `extract_def(source, "Class.method._nested")`: the dedented source of a definition.
- `run_extracted(code, namespace)`: exec it in `namespace` (returned).
- `convertor_class(source, utils_source, name)`: a model-arch convertor class of `source` (and the
  overlay's helper, when present) on a base holding vLLM's own __init__ / head and KV-head getters
  plus a stand-in get_head_size.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Callable, Sequence
from typing import Any


def extract_def(source: str, qualname: str) -> str:
    """Source of the def/class at a dotted path (through classes and functions), decorators
    included, dedented by the definition's own column so it can be exec'd at module level."""
    node: ast.AST = ast.parse(source)
    for part in qualname.split("."):
        found = [
            n
            for n in ast.walk(node)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == part
            and n is not node
        ]
        # the nearest definition with that name (ast.walk is breadth first)
        if not found:
            raise LookupError(f"{qualname}: {part} not found")
        node = found[0]
    lines = source.splitlines()
    first = min([d.lineno for d in node.decorator_list] + [node.lineno])  # type: ignore[attr-defined]
    col = node.col_offset  # type: ignore[attr-defined]
    body = lines[first - 1 : node.end_lineno]  # type: ignore[attr-defined]
    out = []
    for line in body:
        if line[:col].strip():
            raise ValueError(f"{qualname}: line less indented than its def: {line!r}")
        out.append(line[col:])
    return "\n".join(out) + "\n"


def run_extracted(code: str, namespace: dict[str, Any]) -> dict[str, Any]:
    exec(compile(code, "<extracted>", "exec"), namespace)
    return namespace


STAND_IN_HEAD_SIZE = '''
def get_head_size(self) -> int:
    # vLLM's non-MLA fallback of ModelArchConfigConvertorBase.get_head_size
    if getattr(self.hf_text_config, "head_dim", None) is not None:
        return self.hf_text_config.head_dim
    if (heads := self.get_total_num_attention_heads()) == 0:
        return 0
    return self.get_hidden_size() // heads
'''
BASE_METHODS = ("__init__", "get_total_num_attention_heads", "get_hidden_size", "get_total_num_kv_heads")


def convertor_class(source: str, utils_source: str, name: str):
    """The convertor class `name` of `source` (vllm/transformers_utils/model_arch_config_convertor.py),
    with `getattr_iter` from `utils_source` (vllm/config/utils.py) and the overlay's helper when present."""
    from transformers import PretrainedConfig

    ns: dict[str, Any] = {"PretrainedConfig": PretrainedConfig, "Any": Any, "Sequence": Sequence,
                          "Callable": Callable, "logger": None}
    run_extracted(extract_def(utils_source, "getattr_iter"), ns)
    methods = [extract_def(source, f"ModelArchConfigConvertorBase.{m}") for m in BASE_METHODS]
    base = "class ModelArchConfigConvertorBase:\n" + "".join(
        textwrap.indent(m, "    ") for m in [*methods, STAND_IN_HEAD_SIZE]
    )
    run_extracted(base, ns)
    if "def _overlay_gemma4_per_layer_compat(" in source:
        run_extracted(extract_def(source, "_overlay_gemma4_per_layer_compat"), ns)
    run_extracted(extract_def(source, name), ns)
    return ns[name]
