"""find_anchor renders only statements of the anchor's shape, and finds exactly what comparing every
statement's key finds: checked with each statement of real release files used as an anchor."""

from __future__ import annotations

import libcst as cst
import pytest

from manager.overlays.edits import pycst
from manager.overlays.edits.pycst import find_anchor, statement_key, statement_lists

FILES = ["vllm/model_executor/models/gemma4.py", "vllm/platforms/cuda.py",
         "vllm/transformers_utils/model_arch_config_convertor.py"]


def _scopes(module: cst.Module):
    """The module and every class and function in it, at any depth."""
    out = [module]
    stack = list(pycst.defs_in(module))
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(pycst.defs_in(node))
    return out


def _anchor_text(module: cst.Module, stmt: cst.CSTNode) -> str:
    """The statement as a manifest would name it: a simple line as written, a compound one by its
    first line (its header, ending in ':')."""
    code = module.code_for_node(stmt.with_changes(leading_lines=())).strip()
    if isinstance(stmt, pycst._COMPOUND):
        return code.splitlines()[0].split("#")[0].rstrip()
    return code


@pytest.mark.parametrize("rel", FILES)
def test_find_anchor_finds_what_every_statements_key_finds_on_a_real_release_file(pristine_release, rel):
    module = cst.parse_module((pristine_release("0.20.0") / rel).read_text())
    checked = 0
    for scope in _scopes(module)[:40]:
        stmts = [(b, i, s) for b in statement_lists(scope) for i, s in enumerate(b.body)]
        keys = [statement_key(module, s) for _, _, s in stmts]
        for block, i, stmt in stmts[:12]:
            anchor = _anchor_text(module, stmt)
            if "\n" in anchor or not anchor or anchor.endswith("\\"):
                continue  # a multi-line statement is not written as an anchor
            try:
                parsed = pycst._anchor(anchor, module.config_for_parsing)
            except Exception:  # noqa: BLE001 - a header that does not parse alone (e.g. `with a, \`)
                continue
            want_key = statement_key(parsed, parsed.body[0])
            expected = [(id(b), j) for (b, j, _), k in zip(stmts, keys) if k == want_key]
            found = [(id(site.owner), site.index) for site in find_anchor(module, scope, anchor)]
            assert found == expected, (rel, anchor)
            assert (id(block), i) in found, (rel, anchor)
            checked += 1
    assert checked > 50


def test_find_anchor_renders_only_statements_of_the_anchors_shape(monkeypatch):
    module = cst.parse_module(
        "def f(x):\n"
        "    y = x + 1\n"
        "    print(y)\n"
        "    if y > 2:\n"
        "        y = x + 1\n"
        "    for i in range(3):\n"
        "        z = [i]\n"
        "    return y\n"
    )
    rendered = []
    real = pycst.statement_key
    monkeypatch.setattr(pycst, "statement_key", lambda mod, stmt: rendered.append(stmt) or real(mod, stmt))
    sites = find_anchor(module, module.body[0], "y = (x + 1)")
    assert len(sites) == 2
    # the anchor itself, then the three assignments (y twice, z): never the call, the if, the for, the return
    assert [type(s).__name__ for s in rendered] == ["SimpleStatementLine"] * 4
    assert all(isinstance(s.body[0], cst.Assign) for s in rendered)
