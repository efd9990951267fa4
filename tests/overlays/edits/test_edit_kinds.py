"""Each edit kind on its own, on small synthetic modules (no release tree needed)."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import libcst as cst
import pytest

from manager.overlays.edits import (
    DictCache,
    DictEntry,
    EditContext,
    EditFailed,
    EditState,
    InsertStatements,
    NewFile,
    SetValue,
    TextInsert,
)
from manager.overlays.manifest import (
    DictCacheEdit,
    DictEntryEdit,
    InsertEdit,
    NewFileEdit,
    SetValueEdit,
    TextInsertEdit,
)
from tests.helpers import REPO_ROOT

S = EditState


def _src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def _ctx(tmp_path: Path, version: int = 1, overlay: str = "ov") -> EditContext:
    return EditContext(overlay, version, tmp_path)


def _snippet(tmp_path: Path, text: str, name: str = "snip.py") -> str:
    (tmp_path / name).write_text(_src(text))
    return name


def _insert(tmp_path: Path, scope: str, anchor: str, code: str, position: str = "before", version: int = 1):
    spec = InsertEdit(
        kind="insert", name="ins", scope=scope, anchor=anchor, position=position,
        code=_snippet(tmp_path, code),
    )
    return InsertStatements(spec, _ctx(tmp_path, version))


NESTED = _src(
    '''
    class Model:
        def load_weights(self, weights):
            def _iter(ws):
                for name, w in ws:
                    if name.endswith(".bias"):
                        continue
                    if "gate_up" in name and w.dim() == 3:
                        yield name + ".split", w
                        continue
                    yield name, w

            return list(_iter(weights))

    def _iter(ws):
        for name, w in ws:
            if "gate_up" in name and w.dim() == 3:
                yield name, w
    '''
)

BRANCH = '''
# packed experts first: "gate_up" also matches "gate_up_packed"
if name.endswith("_packed"):
    yield name + ".packed", w
    continue
'''

ANCHOR = 'if "gate_up" in name and w.dim() == 3:'


def _mod(text: str) -> cst.Module:
    return cst.parse_module(text)


# --- insert ------------------------------------------------------------------------------


def test_insert_before_anchor_inside_nested_scope_path(tmp_path):
    e = _insert(tmp_path, "Model.load_weights._iter", ANCHOR, BRANCH)
    mod = _mod(NESTED)
    assert e.inspect(mod).state == S.PENDING
    out = e.apply(mod).code
    compile(out, "m.py", "exec")
    lines = out.splitlines()
    anchor_rows = [i for i, l in enumerate(lines) if l.strip() == ANCHOR]
    # the module-level _iter (a different scope) is untouched: its anchor keeps no block above it
    inner, outer = anchor_rows
    assert lines[inner - 3].strip() == 'if name.endswith("_packed"):'
    assert lines[outer - 1].strip() == "for name, w in ws:"
    assert out.count("overlay:ov v1 ins") == 1
    assert e.inspect(_mod(out)).state == S.APPLIED


def test_insert_after_anchor_puts_block_after_the_whole_statement(tmp_path):
    e = _insert(tmp_path, "Model.load_weights._iter", 'if name.endswith(".bias"):', "seen.add(name)\n", "after")
    out = e.apply(_mod(NESTED)).code
    lines = out.splitlines()
    i = next(i for i, l in enumerate(lines) if l.strip() == 'if name.endswith(".bias"):')
    assert lines[i + 1].strip() == "continue"
    assert lines[i + 2].strip().startswith("# overlay:ov v1 ins")
    assert lines[i + 3] == " " * 16 + "seen.add(name)"


def test_insert_indentation_follows_the_scope(tmp_path):
    src = "class A:\n  def f(self):\n      x = 1\n      return x\n"  # 2- and 4-space mixed widths
    e = _insert(tmp_path, "A.f", "return x", "if x:\n    x += 1\n")
    out = e.apply(_mod(src)).code
    lines = out.splitlines()
    i = lines.index("      if x:")  # the block sits at the scope's own indent (6), not the snippet's (0)
    assert lines[i - 1] == "      # overlay:ov v1 ins n=1 sha=" + lines[i - 1].rsplit("sha=", 1)[1]
    assert lines[i + 1].strip() == "x += 1" and len(lines[i + 1]) - 6 > 6
    assert lines[i + 2] == "      return x"
    ns: dict = {}
    exec(compile(out, "m.py", "exec"), ns)
    assert ns["A"]().f() == 2


def test_insert_keeps_comments_of_the_snippet(tmp_path):
    e = _insert(tmp_path, "Model.load_weights._iter", ANCHOR, BRANCH)
    out = e.apply(_mod(NESTED)).code
    assert '# packed experts first: "gate_up" also matches "gate_up_packed"' in out


def test_insert_is_idempotent_and_remove_restores_exact_bytes(tmp_path):
    e = _insert(tmp_path, "Model.load_weights._iter", ANCHOR, BRANCH)
    once = e.apply(_mod(NESTED))
    assert e.apply(once).code == once.code
    assert e.remove(once).code == NESTED


def test_insert_anchor_with_zero_matches_is_drift(tmp_path):
    e = _insert(tmp_path, "Model.load_weights._iter", "if name.endswith('.weight'):", BRANCH)
    res = e.inspect(_mod(NESTED))
    assert res.state == S.DRIFT
    assert "anchor not found" in res.detail
    with pytest.raises(EditFailed, match="anchor not found"):
        e.apply(_mod(NESTED))


def test_insert_anchor_with_two_matches_is_drift(tmp_path):
    src = NESTED.replace(
        '                if name.endswith(".bias"):\n',
        '                if "gate_up" in name and w.dim() == 3:\n                    pass\n'
        '                if name.endswith(".bias"):\n',
        1,
    )
    e = _insert(tmp_path, "Model.load_weights._iter", ANCHOR, BRANCH)
    res = e.inspect(_mod(src))
    assert res.state == S.DRIFT
    assert "2 times" in res.detail


def test_insert_anchor_matches_by_shape_not_layout(tmp_path):
    src = NESTED.replace(ANCHOR, "if ('gate_up' in name) and w.dim() == 3:  # float experts")
    e = _insert(tmp_path, "Model.load_weights._iter", ANCHOR, BRANCH)
    assert e.inspect(_mod(src)).state == S.PENDING


def test_insert_missing_scope_is_superseded(tmp_path):
    src = NESTED.replace("def _iter(ws):\n            for", "def _iterate(ws):\n            for").replace(
        "list(_iter(weights))", "list(_iterate(weights))"
    )
    e = _insert(tmp_path, "Model.load_weights._iter", ANCHOR, BRANCH)
    res = e.inspect(_mod(src))
    assert res.state == S.SUPERSEDED
    assert "Model.load_weights._iter not found" in res.detail


def test_insert_ambiguous_scope_is_drift(tmp_path):
    src = NESTED + _src(
        """
        class Model:
            def load_weights(self, weights):
                pass
        """
    )
    e = _insert(tmp_path, "Model.load_weights._iter", ANCHOR, BRANCH)
    res = e.inspect(_mod(src))
    assert res.state == S.DRIFT
    assert "ambiguous" in res.detail


@pytest.mark.parametrize(
    "anchor, header",
    [
        ("for name, w in ws:", "for name, w in ws:"),
        ("with open(p) as fh:", "with open(p) as fh:"),
        ("while True:", "while True:"),
        ("def helper(x):", "def helper(x):"),
        ("class Inner:", "class Inner:"),
    ],
)
def test_insert_compound_statement_header_anchor(tmp_path, anchor, header):
    src = _src(
        """
        def f(ws, p):
            for name, w in ws:
                print(name)
            with open(p) as fh:
                fh.read()
            while True:
                break
            try:
                pass
            except OSError:
                pass
            def helper(x):
                return x
            class Inner:
                pass
        """
    )
    e = _insert(tmp_path, "f", anchor, "marker = 1\n")
    mod = _mod(src)
    assert e.inspect(mod).state == S.PENDING
    out = e.apply(mod).code
    lines = out.splitlines()
    i = next(i for i, l in enumerate(lines) if l.strip() == header)
    assert lines[i - 1] == "    marker = 1"
    compile(out, "m.py", "exec")


def test_insert_try_header_anchor(tmp_path):
    src = "def f():\n    x = 1\n    try:\n        pass\n    except OSError:\n        pass\n"
    e = _insert(tmp_path, "f", "try:", "marker = 1\n")
    assert e.inspect(_mod(src)).state == S.PENDING
    out = e.apply(_mod(src)).code
    assert "    marker = 1\n    try:\n" in out
    assert e.remove(_mod(out)).code == src


def test_insert_header_anchor_does_not_match_a_different_header(tmp_path):
    src = "def f(ws):\n    for name, w in ws:\n        pass\n"
    e = _insert(tmp_path, "f", "for name in ws:", "x = 1\n")
    assert e.inspect(_mod(src)).state == S.DRIFT


def test_insert_hand_edited_block_is_modified(tmp_path):
    e = _insert(tmp_path, "Model.load_weights._iter", ANCHOR, BRANCH)
    out = e.apply(_mod(NESTED)).code.replace('yield name + ".packed", w', 'yield name + ".PACKED", w')
    res = e.inspect(_mod(out))
    assert res.state == S.MODIFIED
    with pytest.raises(EditFailed):
        e.apply(_mod(out))


def test_insert_sentinel_upgrade_v1_to_v2_replaces_block(tmp_path):
    v1 = _insert(tmp_path, "Model.load_weights._iter", ANCHOR, BRANCH, version=1)
    applied_v1 = v1.apply(_mod(NESTED))
    (tmp_path / "snip.py").write_text(_src(BRANCH).replace('".packed"', '".packed_v2"'))
    v2 = InsertStatements(v1.spec, _ctx(tmp_path, 2))
    assert v2.inspect(applied_v1).state == S.OLD
    up = v2.apply(applied_v1).code
    assert "overlay:ov v1" not in up and up.count("overlay:ov v2 ins") == 1
    assert '".packed_v2"' in up and '".packed"' not in up
    assert v2.inspect(_mod(up)).state == S.APPLIED
    assert v2.remove(_mod(up)).code == NESTED


def test_insert_newer_sentinel_than_catalog_is_modified(tmp_path):
    v2 = _insert(tmp_path, "Model.load_weights._iter", ANCHOR, BRANCH, version=2)
    applied = v2.apply(_mod(NESTED))
    v1 = InsertStatements(v2.spec, _ctx(tmp_path, 1))
    assert v1.inspect(applied).state == S.MODIFIED


def test_insert_at_module_level(tmp_path):
    src = "import os\n\nclass A:\n    pass\n"
    e = _insert(tmp_path, "", "class A:", "def helper():\n    return 1\n")
    out = e.apply(_mod(src)).code
    assert out.index("def helper") < out.index("class A")
    assert e.remove(_mod(out)).code == src


# --- dict-entry ----------------------------------------------------------------------------

DICT_SRC = _src(
    """
    class Registry:
        def build(self):
            MAPPING = {
                "a": 1,  # first
                "b": 2,
            }
            return MAPPING
    """
)


def _dict_entry(tmp_path, key='"c"', value="3", scope="Registry.build", name="MAPPING", version=1):
    spec = DictEntryEdit(kind="dict-entry", name="entry", scope=scope, dict_name=name, key=key, value=value)
    return DictEntry(spec, _ctx(tmp_path, version))


def test_dict_entry_adds_key_after_assignment_and_removes_cleanly(tmp_path):
    e = _dict_entry(tmp_path)
    mod = _mod(DICT_SRC)
    assert e.inspect(mod).state == S.PENDING
    out = e.apply(mod).code
    ns: dict = {}
    exec(out + "\nresult = Registry().build()\n", ns)
    assert ns["result"] == {"a": 1, "b": 2, "c": 3}
    assert e.inspect(_mod(out)).state == S.APPLIED
    assert e.apply(_mod(out)).code == out
    assert e.remove(_mod(out)).code == DICT_SRC


def test_dict_entry_key_already_present_is_native(tmp_path):
    e = _dict_entry(tmp_path, key="'b'")  # other quote style: same key
    res = e.inspect(_mod(DICT_SRC))
    assert res.state == S.NATIVE
    assert "already" in res.detail


def test_dict_entry_missing_dict_is_drift_and_missing_scope_superseded(tmp_path):
    assert _dict_entry(tmp_path, name="OTHER").inspect(_mod(DICT_SRC)).state == S.DRIFT
    assert _dict_entry(tmp_path, scope="Registry.gone").inspect(_mod(DICT_SRC)).state == S.SUPERSEDED


def test_dict_entry_non_literal_is_drift(tmp_path):
    src = DICT_SRC.replace('MAPPING = {\n            "a": 1,  # first\n            "b": 2,\n        }', "MAPPING = dict(a=1)")
    res = _dict_entry(tmp_path).inspect(_mod(src))
    assert res.state == S.DRIFT and "not a dict literal" in res.detail


def test_dict_entry_sentinel_upgrade(tmp_path):
    v1 = _dict_entry(tmp_path, value="3")
    applied = v1.apply(_mod(DICT_SRC))
    v2 = DictEntry(v1.spec.model_copy(update={"value": "33"}), _ctx(tmp_path, 2))
    assert v2.inspect(applied).state == S.OLD
    out = v2.apply(applied).code
    assert 'MAPPING["c"] = 33' in out and "overlay:ov v1" not in out
    assert v2.remove(_mod(out)).code == DICT_SRC


# --- set-value -----------------------------------------------------------------------------

SET_SRC = _src(
    """
    class Cfg:
        def __init__(self):
            self.allow = False  # the flag
            self.other = 1
    """
)
SET_SRC_COMMENT_ABOVE = SET_SRC.replace("        self.allow = False  # the flag", "        # the flag\n        self.allow = False")


def _set_value(tmp_path, value="True", assign="self.allow", scope="Cfg.__init__", version=1):
    spec = SetValueEdit(kind="set-value", name="flag", scope=scope, assign=assign, value=value)
    return SetValue(spec, _ctx(tmp_path, version))


def test_set_value_replaces_and_revert_restores_bytes(tmp_path):
    e = _set_value(tmp_path)
    mod = _mod(SET_SRC)
    assert e.inspect(mod).state == S.PENDING
    out = e.apply(mod).code
    assert "self.allow = True" in out and "self.allow = False" not in out
    ns: dict = {}
    exec(out, ns)
    assert ns["Cfg"]().allow is True
    assert e.inspect(_mod(out)).state == S.APPLIED
    assert e.apply(_mod(out)).code == out
    assert e.remove(_mod(out)).code == SET_SRC


def test_set_value_with_comment_above_reads_back_applied(tmp_path):
    e = _set_value(tmp_path)
    out = e.apply(_mod(SET_SRC_COMMENT_ABOVE))
    assert "# the flag" in out.code
    assert e.inspect(out).state == S.APPLIED


def test_set_value_already_that_value_is_native(tmp_path):
    assert _set_value(tmp_path, value="False").inspect(_mod(SET_SRC)).state == S.NATIVE


def test_set_value_missing_or_ambiguous_assignment_is_drift(tmp_path):
    assert _set_value(tmp_path, assign="self.nothing").inspect(_mod(SET_SRC)).state == S.DRIFT
    twice = SET_SRC.replace("self.other = 1", "self.allow = None")
    res = _set_value(tmp_path).inspect(_mod(twice))
    assert res.state == S.DRIFT and "2 times" in res.detail


def test_set_value_sentinel_upgrade(tmp_path):
    applied = _set_value(tmp_path, value="True").apply(_mod(SET_SRC))
    v2 = _set_value(tmp_path, value="'yes'", version=2)
    assert v2.inspect(applied).state == S.OLD
    out = v2.apply(applied).code
    assert "self.allow = 'yes'" in out and "overlay:ov v1" not in out
    assert v2.remove(_mod(out)).code == SET_SRC


# --- dict-cache ----------------------------------------------------------------------------

CACHE_SRC = _src(
    '''
    """Platform helpers."""
    import functools
    from functools import cache, lru_cache

    CALLS = []


    @functools.cache
    def a(x):
        CALLS.append(("a", x))
        return x * 2


    @lru_cache(maxsize=8)
    def b(x, y=1):
        CALLS.append(("b", x, y))
        return x + y


    @functools.lru_cache()
    def c():
        CALLS.append(("c",))
        return 3


    @cache
    def d(x):
        CALLS.append(("d", x))
        return -x


    class P:
        # comment above the stack
        @classmethod
        @functools.lru_cache(maxsize=None)
        def cm(cls, n):
            CALLS.append(("cm", n))
            return n + 100

        @staticmethod
        @lru_cache
        def sm(n):
            CALLS.append(("sm", n))
            return n - 100

        def plain(self):
            return 0
    '''
)


def _dict_cache(tmp_path, functions=("*",), version=1):
    spec = DictCacheEdit(kind="dict-cache", name="dc", functions=list(functions))
    return DictCache(spec, _ctx(tmp_path, version))


def _run(code: str) -> dict:
    ns: dict = {"__name__": "m"}
    exec(compile(code, "m.py", "exec"), ns)
    return ns


def test_dict_cache_replaces_every_spelling_and_keeps_results(tmp_path):
    e = _dict_cache(tmp_path)
    mod = _mod(CACHE_SRC)
    res = e.inspect(mod)
    assert res.state == S.PENDING and "6 cache decorators" in res.detail
    out = e.apply(mod).code
    decorator_lines = [l.strip() for l in out.splitlines() if l.strip().startswith("@")]
    assert not [l for l in decorator_lines if "cache" in l and "_overlay_dict_cache" not in l]
    assert "@_overlay_dict_cache(maxsize=8)" in out
    assert "@_overlay_dict_cache(maxsize=None)" in out
    assert out.count("@_overlay_dict_cache\n") == 2  # functools.cache, cache: unbounded like functools
    assert out.count("@_overlay_dict_cache(maxsize=128)\n") == 2  # lru_cache(), lru_cache: functools' default bound
    ns = _run(out)
    for _ in range(3):
        assert ns["a"](2) == 4 and ns["b"](1, y=5) == 6 and ns["c"]() == 3 and ns["d"](4) == -4
        assert ns["P"].cm(1) == 101 and ns["P"].sm(1) == -99 and ns["P"]().cm(1) == 101
    assert sorted(ns["CALLS"]) == sorted([("a", 2), ("b", 1, 5), ("c",), ("d", 4), ("cm", 1), ("sm", 1)])
    assert ns["a"].__name__ == "a"


def test_dict_cache_keeps_classmethod_and_staticmethod_outermost(tmp_path):
    out = _dict_cache(tmp_path).apply(_mod(CACHE_SRC)).code
    ns = _run(out)
    assert isinstance(ns["P"].__dict__["cm"], classmethod)
    assert isinstance(ns["P"].__dict__["sm"], staticmethod)
    i = out.index("def cm")
    block = out[out.rindex("# comment above the stack", 0, i) : i]
    assert block.index("@classmethod") < block.index("@_overlay_dict_cache(maxsize=None)")


def test_dict_cache_first_decorator_sentinel_sits_above_the_stack(tmp_path):
    out = _dict_cache(tmp_path).apply(_mod(CACHE_SRC)).code
    lines = out.splitlines()
    i = lines.index("@_overlay_dict_cache(maxsize=8)")
    assert lines[i - 1].startswith("# overlay:ov v1 dc was=")
    assert "lru_cache(maxsize=8)" in lines[i - 1]
    assert lines[i + 1] == "def b(x, y=1):"
    # a second decorator in a stack carries its sentinel directly above it
    j = next(k for k, l in enumerate(lines) if l.strip() == "@_overlay_dict_cache(maxsize=None)")
    assert lines[j - 1].strip().startswith("# overlay:ov v1 dc was=")
    assert lines[j - 2].strip() == "@classmethod"


def test_dict_cache_maxsize_bound_is_kept(tmp_path):
    ns = _run(_dict_cache(tmp_path).apply(_mod(CACHE_SRC)).code)
    for i in range(20):
        ns["b"](i)
    assert ns["b"].cache_size() == 8


def test_dict_cache_helper_placed_after_imports(tmp_path):
    out = _dict_cache(tmp_path).apply(_mod(CACHE_SRC)).code
    assert out.index("from functools import cache") < out.index("def _overlay_dict_cache") < out.index("CALLS = []")


def test_dict_cache_idempotent_and_remove_restores_exact_bytes(tmp_path):
    e = _dict_cache(tmp_path)
    out = e.apply(_mod(CACHE_SRC))
    assert e.inspect(out).state == S.APPLIED
    assert e.apply(out).code == out.code
    assert e.remove(out).code == CACHE_SRC


def test_dict_cache_named_functions_only(tmp_path):
    e = _dict_cache(tmp_path, functions=["P.cm", "a"])
    out = e.apply(_mod(CACHE_SRC)).code
    assert "@lru_cache(maxsize=8)" in out and "@cache\n" in out
    assert out.count("overlay:ov v1 dc was=") == 2
    assert e.remove(_mod(out)).code == CACHE_SRC


def test_dict_cache_named_function_missing(tmp_path):
    assert _dict_cache(tmp_path, functions=["gone"]).inspect(_mod(CACHE_SRC)).state == S.SUPERSEDED
    assert _dict_cache(tmp_path, functions=["gone", "a"]).inspect(_mod(CACHE_SRC)).state == S.DRIFT


def test_dict_cache_without_cache_decorators_is_not_applicable(tmp_path):
    assert _dict_cache(tmp_path).inspect(_mod("def f():\n    return 1\n")).state == S.NOT_APPLICABLE


def test_dict_cache_edited_decorator_is_modified(tmp_path):
    out = _dict_cache(tmp_path).apply(_mod(CACHE_SRC)).code
    out = out.replace("@_overlay_dict_cache(maxsize=8)", "@_overlay_dict_cache(maxsize=9)")
    assert _dict_cache(tmp_path).inspect(_mod(out)).state == S.MODIFIED


def test_dict_cache_new_cache_decorator_after_apply_is_partial(tmp_path):
    out = _dict_cache(tmp_path).apply(_mod(CACHE_SRC)).code + "\n\n@functools.cache\ndef e():\n    return 5\n"
    e = _dict_cache(tmp_path)
    assert e.inspect(_mod(out)).state == S.PARTIAL
    fixed = e.apply(_mod(out))
    assert e.inspect(fixed).state == S.APPLIED
    assert "@functools.cache\ndef e" not in fixed.code


def test_dict_cache_sentinel_upgrade(tmp_path):
    applied = _dict_cache(tmp_path, version=1).apply(_mod(CACHE_SRC))
    v2 = _dict_cache(tmp_path, version=2)
    assert v2.inspect(applied).state == S.OLD
    out = v2.apply(applied).code
    assert "overlay:ov v1" not in out and "overlay:ov v2 dc was=" in out
    assert v2.inspect(_mod(out)).state == S.APPLIED
    assert v2.remove(_mod(out)).code == CACHE_SRC


# --- new-file ------------------------------------------------------------------------------


def _new_file(tmp_path, target="vllm/extra/kern.cu", body="__global__ void k() {}\n", version=1):
    (tmp_path / "src.cu").write_text(body)
    spec = NewFileEdit(kind="new-file", name="nf", source="src.cu")
    return NewFile(spec, _ctx(tmp_path, version), target)


def test_new_file_created_with_c_sentinel_and_removed(tmp_path):
    e = _new_file(tmp_path)
    assert e.inspect(None).state == S.PENDING
    out = e.apply(None)
    first, _, rest = out.partition("\n")
    assert first.startswith("// overlay:ov v1 nf sha=")
    assert rest == "__global__ void k() {}\n"
    assert e.inspect(out).state == S.APPLIED
    assert e.apply(out) == out
    assert e.remove(out) is None


def test_new_file_python_target_uses_hash_sentinel(tmp_path):
    (tmp_path / "mod.py").write_text("X = 1\n")
    e = NewFile(NewFileEdit(kind="new-file", name="nf", source="mod.py"), _ctx(tmp_path), "vllm/x.py")
    assert e.apply(None).startswith("# overlay:ov v1 nf sha=")


def test_new_file_existing_foreign_file_is_drift_and_never_removed(tmp_path):
    e = _new_file(tmp_path)
    foreign = "// someone else's\nint x;\n"
    assert e.inspect(foreign).state == S.DRIFT
    with pytest.raises(EditFailed):
        e.apply(foreign)
    assert e.remove(foreign) == foreign


def test_new_file_edited_is_modified(tmp_path):
    e = _new_file(tmp_path)
    assert e.inspect(e.apply(None) + "// more\n").state == S.MODIFIED


def test_new_file_sentinel_upgrade(tmp_path):
    old = _new_file(tmp_path, version=1).apply(None)
    v2 = _new_file(tmp_path, body="__global__ void k2() {}\n", version=2)
    assert v2.inspect(old).state == S.OLD
    new = v2.apply(old)
    assert new.startswith("// overlay:ov v2 nf") and "k2" in new


# --- text-insert (C/C++/CUDA) --------------------------------------------------------------

CU_SRC = _src(
    """
    #include <cuda.h>

    __device__ float helper(float x) {
      return x;
    }

    __global__ void attn(float* out, int d) {
      int i = threadIdx.x;
      if (d == 256) {
        out[i] = 0.f;
      }
      return;
    }

    __global__ void other(float* out) {
      return;
    }
    """
)


def _text_insert(tmp_path, anchor="return;", within=r"__global__ void attn\(", position="before",
                 code="if (d == 512) {\n  out[i] = 1.f;\n}\n", version=1):
    (tmp_path / "snip.cu").write_text(code)
    spec = TextInsertEdit(kind="text-insert", name="d512", anchor=anchor, within=within, position=position,
                          code="snip.cu")
    return TextInsert(spec, _ctx(tmp_path, version), "csrc/attn.cu")


def test_text_insert_within_brace_scope_uses_anchor_indent_and_c_sentinels(tmp_path):
    e = _text_insert(tmp_path)
    assert e.inspect(CU_SRC).state == S.PENDING
    out = e.apply(CU_SRC)
    lines = out.split("\n")
    b = next(i for i, l in enumerate(lines) if "overlay:ov v1 d512 begin" in l)
    assert lines[b].startswith("  // overlay:ov v1 d512 begin")
    assert lines[b + 1 : b + 4] == ["  if (d == 512) {", "    out[i] = 1.f;", "  }"]
    assert lines[b + 4].startswith("  // overlay:ov v1 d512 end")
    assert lines[b + 5] == "  return;"
    # the `return;` of other() is outside the `within` block and untouched
    assert out.count("overlay:ov") == 2
    assert out.index("d512 end") < out.index("__global__ void other")
    assert e.inspect(out).state == S.APPLIED
    assert e.apply(out) == out
    assert e.remove(out) == CU_SRC


def test_text_insert_after_position(tmp_path):
    e = _text_insert(tmp_path, anchor="int i = threadIdx.x;", position="after", code="int j = i;\n")
    lines = e.apply(CU_SRC).split("\n")
    i = lines.index("  int i = threadIdx.x;")
    assert lines[i + 2] == "  int j = i;"


def test_text_insert_ambiguous_anchor_without_within_is_drift(tmp_path):
    res = _text_insert(tmp_path, within=None).inspect(CU_SRC)
    assert res.state == S.DRIFT and "2 times" in res.detail


def test_text_insert_anchor_absent_is_drift(tmp_path):
    res = _text_insert(tmp_path, anchor="return 0;").inspect(CU_SRC)
    assert res.state == S.DRIFT


def test_text_insert_within_missing_is_superseded_and_ambiguous_is_drift(tmp_path):
    assert _text_insert(tmp_path, within=r"void gone\(").inspect(CU_SRC).state == S.SUPERSEDED
    assert _text_insert(tmp_path, within=r"__global__ void").inspect(CU_SRC).state == S.DRIFT


def test_text_insert_edited_block_is_modified_and_remove_leaves_foreign_text(tmp_path):
    e = _text_insert(tmp_path)
    out = e.apply(CU_SRC).replace("out[i] = 1.f;", "out[i] = 2.f;")
    assert e.inspect(out).state == S.MODIFIED
    assert e.remove(CU_SRC) == CU_SRC  # no sentinel: nothing touched


def test_text_insert_sentinel_upgrade(tmp_path):
    old = _text_insert(tmp_path, version=1).apply(CU_SRC)
    v2 = _text_insert(tmp_path, code="if (d == 512) {\n  out[i] = 5.f;\n}\n", version=2)
    assert v2.inspect(old).state == S.OLD
    new = v2.apply(old)
    assert "v1" not in new and "out[i] = 5.f;" in new and "out[i] = 1.f;" not in new
    assert v2.inspect(new).state == S.APPLIED
    assert v2.remove(new) == CU_SRC


# --------------------------------------------------------------------------- the matchers import


_MATCHERS_PROBE = """
import dataclasses, inspect
src = inspect.getsource(dataclasses._process_class)
from manager.overlays.edits import matching
m = matching.full()
assert m.Comment.__doc__ == 'Comment()', m.Comment.__doc__
assert str(inspect.signature(m.Comment)).startswith('(')          # put back after the import
print('catches' if 'except (TypeError, ValueError)' in src else 'propagates')
"""


@pytest.mark.parametrize("python", [sys.executable, "/usr/bin/python3"])
def test_the_lean_matchers_import_works_whether_or_not_dataclasses_catches_signature_errors(python):
    """matching.full() imports libcst.matchers with inspect.signature stubbed out (no per-class signature
    docstrings). The stub must not raise: Python 3.11.2's dataclasses (Debian 12's python3, the compose
    images' python) lets the error out, 3.11.7's catches it; the compose e2e crashed on the first."""
    if not Path(python).is_file():
        pytest.skip(f"{python} is not installed")
    proc = _run_under(python, _MATCHERS_PROBE)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() in ("catches", "propagates")


def _run_under(python, code):
    import subprocess
    import sysconfig

    site = sysconfig.get_paths()["purelib"]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), site]),
           "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_every_generated_matcher_class_is_its_node_s_public_fields_plus_metadata():
    """The rule matching.derived() follows, checked against every class libcst generates: so a derived
    matcher has exactly the generated one's fields, defaults DoNotCare."""
    import dataclasses

    import libcst.matchers as gen
    from libcst.matchers._matcher_base import BaseMatcherNode, DoNotCareSentinel

    from manager.overlays.edits import matching

    checked = 0
    for name in dir(gen):
        cls = getattr(gen, name)
        if not (isinstance(cls, type) and issubclass(cls, BaseMatcherNode) and hasattr(cst, name)):
            continue
        want = [(f.name, type(f.default)) for f in dataclasses.fields(cls)]
        mine = matching.derived(name, matching._base())
        assert [(f.name, type(f.default)) for f in dataclasses.fields(mine)] == want, name
        assert all(t is DoNotCareSentinel for _, t in want), name
        checked += 1
    assert checked > 150


_MATCH_CORPUS = '''"""doc"""
import functools
# overlay:dynamo-dict-caches v1 cache-a n=2 sha=0123456789abcdef
x = 1  # overlay: not a sentinel
# overlay:BAD v1 e n=1 sha=00
#overlay:ok-id v12 e2 n=1 sha=ff
@functools.lru_cache(maxsize=None)
def f(): ...
@lru_cache
def g(): ...
@functools.cache
def h(): ...
@other.lru_cache
def i(): ...
"text"
'''


def test_derived_matchers_decide_like_the_generated_ones():
    """The engine's six matcher shapes give the same answer with libcst's generated classes and with
    matching's derived ones, on sentinel-like comments, decorators and docstring statements."""
    import libcst.matchers as gen

    from manager.overlays.edits import matching
    from manager.overlays.edits.pycst import SENTINEL_RE

    base = matching._base()
    lean = {c: matching.derived(c, base) for c in matching._CLASSES}
    mod = cst.parse_module(_MATCH_CORPUS)
    nodes = [n for s in mod.body for n in (*getattr(s, "leading_lines", ()), *getattr(s, "decorators", ()))]
    nodes += [d.decorator for s in mod.body for d in getattr(s, "decorators", ())] + list(mod.body)
    nodes += [s.body[0] for s in mod.body if isinstance(s, cst.SimpleStatementLine)]

    def shapes(m, classes):
        return [classes["EmptyLine"](comment=classes["Comment"](m.MatchRegex(SENTINEL_RE))),
                classes["Name"](), classes["Attribute"](value=classes["Name"]("functools")),
                classes["Expr"](classes["SimpleString"]())]

    gen_classes = {c: getattr(gen, c) for c in matching._CLASSES}
    answers = [[gen.matches(n, s) for s in shapes(gen, gen_classes)] for n in nodes]
    assert answers == [[base.matches(n, s) for s in shapes(base, lean)] for n in nodes]
    flat = [a for row in answers for a in row]
    assert flat.count(True) >= 6 and flat.count(False) > 20   # both answers occur: the corpus discriminates


_NO_GENERATED = """
import sys
import libcst as cst
from manager.overlays.edits import pycst
from manager.overlays.edits import dictcache
mod = cst.parse_module("y = 0\\n# overlay:ov v1 e n=1 sha=0000000000000000\\nx = 1\\n")
s = pycst.sentinel_of(mod.body[1])
assert s is not None and s.overlay == "ov" and s.edit == "e", s
assert pycst.sentinel_of(cst.parse_module("y = 0\\n# overlay: prose\\nx = 1\\n").body[1]) is None
print("generated" if "libcst.matchers" in sys.modules else "lean")
import libcst.matchers as gen       # imported later: the same machinery, one BaseMatcherNode
from manager.overlays.edits import matching
assert gen.BaseMatcherNode is matching._base().BaseMatcherNode
assert gen.matches(mod.body[1].leading_lines[0], pycst.sentinel_line_matcher())
"""


@pytest.mark.parametrize("python", [sys.executable, "/usr/bin/python3"])
def test_sentinels_are_found_without_building_the_generated_matchers_package(python):
    """A first apply never pays for libcst.matchers' ~175 generated classes; importing it afterwards
    reuses the machinery already loaded. Under both Pythons (the compose images run Debian's)."""
    if not Path(python).is_file():
        pytest.skip(f"{python} is not installed")
    proc = _run_under(python, _NO_GENERATED)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "lean"
