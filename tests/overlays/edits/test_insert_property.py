"""Property test (hypothesis) of the insert edit on generated modules (issue 2, point 10).

Modules: a scope function with nested blocks (if/for/while/with/try, nested defs), random
other statements, comments (some quoting the anchor's text), blank lines and indent widths,
holding the anchor statement 0, 1 or more times. Properties: anchor absent or ambiguous ->
drift, scope gone -> superseded; present once -> apply compiles, reads back `applied`, is
idempotent, puts the block next to the anchor, and remove restores the bytes exactly.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from manager.overlays.edits import EditContext, EditState, InsertStatements
from manager.overlays.manifest import InsertEdit

ANCHORS = {
    # anchor as written in the manifest -> layouts that have the same shape
    "total = total + 1": ["total = total + 1", "total=total+1", "total = (total + 1)", "total = total + 1  # count"],
    "if x > limit:": ["if x > limit:", "if (x > limit):", "if x>limit:  # over"],
}
OTHER = [
    "total = total + 2",
    "total += 1",
    "y = x",
    "print(x, limit)",
    "x = [i for i in range(3)]",
    "s = 'total = total + 1'",  # the anchor's text in a string is not the anchor
    "pass",
    "x = (\n    1,\n    2,\n)",
]
COMMENTS = ["# a comment", "# total = total + 1", "# if x > limit:", "#"]
HEADERS = ["if x:", "for i in range(3):", "while x:", "with ctx():", "if x > 0:"]
SNIPPETS = [
    "total = max(total, 0)\n",
    "# clamp first\nif total < 0:\n    total = 0\n",
    "for j in range(2):\n    # inner note\n    total = total - j\nelse:\n    pass\n",
]


@dataclass
class Node:
    kind: str  # stmt | comment | blank | block | try | def
    text: str = ""
    children: list = field(default_factory=list)
    handler: list = field(default_factory=list)
    indent: int = 4
    anchor: bool = False


_leaf = st.one_of(
    st.sampled_from(OTHER).map(lambda t: Node("stmt", t)),
    st.sampled_from(COMMENTS).map(lambda t: Node("comment", t)),
    st.just(Node("blank")),
)
_indents = st.sampled_from([1, 2, 3, 4, 8])


def _body(depth: int):
    if depth == 0:
        return st.lists(_leaf, min_size=1, max_size=4)
    sub = _body(depth - 1)
    block = st.builds(lambda h, ch, ind: Node("block", h, ch, indent=ind), st.sampled_from(HEADERS), sub, _indents)
    trynode = st.builds(lambda ch, hd, ind: Node("try", "try:", ch, hd, indent=ind), sub, sub, _indents)
    nested_def = st.builds(lambda ch, ind: Node("def", "def inner():", ch, indent=ind), sub, _indents)
    return st.lists(st.one_of(_leaf, _leaf, block, trynode, nested_def), min_size=1, max_size=5)


def _suites(nodes: list, in_scope: bool, out: list) -> None:
    """(suite, in_scope) for every statement list; a nested def's body is out of scope."""
    out.append((nodes, in_scope))
    for n in nodes:
        if n.kind in ("block", "try"):
            _suites(n.children, in_scope, out)
        if n.kind == "try":
            _suites(n.handler, in_scope, out)
        if n.kind == "def":
            _suites(n.children, False, out)


def _render(nodes, indent: str, out: list[str]) -> None:
    if not any(n.kind in ("stmt", "block", "try", "def") for n in nodes):
        out.append(indent + "pass")  # a suite needs a statement
    for n in nodes:
        if n.kind == "blank":
            out.append("")
        elif n.kind in ("stmt", "comment"):
            out.extend(indent + line for line in n.text.split("\n"))
        elif n.kind in ("block", "def"):
            out.append(indent + n.text)
            _render(n.children, indent + " " * n.indent, out)
        elif n.kind == "try":
            out.append(indent + "try:")
            _render(n.children, indent + " " * n.indent, out)
            out.append(indent + "except Exception:")
            _render(n.handler, indent + " " * n.indent, out)


@st.composite
def modules(draw):
    anchor = draw(st.sampled_from(sorted(ANCHORS)))
    body = draw(_body(depth=2))
    suites: list = []
    _suites(body, True, suites)
    count = draw(st.sampled_from([1, 0, 1, 2, 0, 1, 3]))  # hypothesis favours early items
    decoys = draw(st.integers(0, 1))  # an anchor inside a nested def: another scope, never counted
    in_scope = [s for s, ok in suites if ok]
    out_scope = [s for s, ok in suites if not ok]
    placements = [(draw(st.sampled_from(in_scope)), True) for _ in range(count)]
    if out_scope:
        placements += [(draw(st.sampled_from(out_scope)), False) for _ in range(decoys)]
    for suite, counted in placements:
        layout = draw(st.sampled_from(ANCHORS[anchor]))
        if anchor.endswith(":"):
            node = Node("block", layout, [Node("stmt", draw(st.sampled_from(OTHER)))], indent=draw(_indents), anchor=counted)
        else:
            node = Node("stmt", layout, anchor=counted)
        suite.insert(draw(st.integers(0, len(suite))), node)
    step = draw(st.sampled_from([1, 2, 4, 8]))
    scope_present = draw(st.integers(0, 7)) != 7
    lines = ["import os", "", ""]
    lines.append(f"def {'scope' if scope_present else 'scope_v2'}(x, limit, total, ctx):")
    _render(body, " " * step, lines)
    lines.append(" " * step + "return total")
    lines += ["", "", "def decoy(x, limit, total):"]  # the anchor in another function never counts
    lines += ["    total = total + 1", "    if x > limit:", "        pass", "    return total"]
    src = "\n".join(lines) + "\n"
    snippet = draw(st.sampled_from(SNIPPETS))
    position = draw(st.sampled_from(["before", "after"]))
    return src, anchor, count, scope_present, snippet, position


_TMP = Path(tempfile.mkdtemp(prefix="overlay-property-"))


def _edit(anchor: str, snippet: str, position: str) -> InsertStatements:
    name = f"snip{SNIPPETS.index(snippet)}.py"
    path = _TMP / name
    if not path.exists():
        path.write_text(snippet)
    spec = InsertEdit(kind="insert", name="prop", scope="scope", anchor=anchor, position=position, code=name)
    return InsertStatements(spec, EditContext("prop-overlay", 1, _TMP))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(modules())
def test_insert_on_generated_modules(case):
    src, anchor, count, scope_present, snippet, position = case
    compile(src, "gen.py", "exec")  # the generator itself only makes valid Python
    module = cst.parse_module(src)
    e = _edit(anchor, snippet, position)
    res = e.inspect(module)
    event(f"scope {'present' if scope_present else 'gone'}, anchor x{min(count, 2)}, {position}")
    if not scope_present:
        assert res.state == EditState.SUPERSEDED, (res, src)
        return
    if count != 1:
        assert res.state == EditState.DRIFT, (res, count, src)
        assert ("not found" in res.detail) if count == 0 else (f"{count} times" in res.detail)
        return
    assert res.state == EditState.PENDING, (res, src)
    applied = e.apply(module)
    out = applied.code
    compile(out, "gen.py", "exec")
    again = cst.parse_module(out)
    assert e.inspect(again).state == EditState.APPLIED
    assert e.apply(again).code == out
    assert out.count("overlay:prop-overlay v1 prop") == 1
    assert e.remove(again).code == src
    # the block sits right next to the anchor, at the anchor's indent
    lines = out.split("\n")
    sentinel_row = next(i for i, l in enumerate(lines) if "overlay:prop-overlay v1 prop" in l)
    indent = lines[sentinel_row][: len(lines[sentinel_row]) - len(lines[sentinel_row].lstrip())]
    first_snippet_line = next(l for l in snippet.split("\n") if l.strip())
    assert lines[sentinel_row + 1] == indent + first_snippet_line
    if position == "before":
        block_len = len(snippet.rstrip("\n").split("\n"))
        following = lines[sentinel_row + 1 + block_len :]
        anchor_row = next(l for l in following if l.strip() and not l.strip().startswith("#"))
        assert anchor_row.startswith(indent) and not anchor_row[len(indent)].isspace()
        assert any(anchor_row.strip() == layout for layout in ANCHORS[anchor])


# --- dict-cache on generated decorator stacks ---------------------------------------------------

from manager.overlays.edits import DictCache
from manager.overlays.manifest import DictCacheEdit

CACHE_SPELLINGS = [
    "@functools.cache", "@cache", "@lru_cache", "@lru_cache()", "@lru_cache(maxsize=None)",
    "@functools.lru_cache(maxsize=8)", "@lru_cache(8)", "@functools.lru_cache(maxsize=8, typed=False)",
]


@st.composite
def cached_modules(draw):
    """A module of functions/methods with random decorator stacks; returns (source, calls)."""
    lines = ['"""generated"""', "import functools", "from functools import cache, lru_cache", "",
             "CALLS = []", "", "", "def ident(f):", "    return f", ""]
    calls = []
    n_funcs = draw(st.integers(1, 4))
    for i in range(n_funcs):
        stack = []
        if draw(st.booleans()):
            stack.append("@ident")
        if draw(st.integers(0, 4)):
            stack.append(draw(st.sampled_from(CACHE_SPELLINGS)))
        if draw(st.booleans()):
            stack.insert(draw(st.integers(0, len(stack))), "@ident")
        if draw(st.booleans()):
            lines.append(draw(st.sampled_from(["# note", "# overlay-like comment: not ours"])))
        lines += [*stack, f"def f{i}(x, y=1):", f"    CALLS.append(('f{i}', x, y))", f"    return x * {i + 2} + y", "", ""]
        calls += [f"f{i}({k})" for k in draw(st.lists(st.sampled_from(["1", "2", "3", "1, y=2"]), max_size=5))]
    lines.append("class K:")
    indent = " " * draw(st.sampled_from([2, 4]))
    for j in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["classmethod", "staticmethod", "plain"]))
        cache_line = draw(st.sampled_from(CACHE_SPELLINGS + [None]))
        stack = [] if kind == "plain" else [f"@{kind}"]
        if cache_line:
            stack.append(cache_line)
        first = {"classmethod": "cls, ", "staticmethod": "", "plain": "self, "}[kind]
        lines += [indent + d for d in stack]
        lines += [f"{indent}def m{j}({first}n):", f"{indent}{indent}CALLS.append(('m{j}', n))",
                  f"{indent}{indent}return n - {j}", ""]
        owner = "K()" if kind == "plain" else draw(st.sampled_from(["K", "K()"]))
        calls += [f"{owner}.m{j}({k})" for k in draw(st.lists(st.sampled_from(["0", "5"]), max_size=4))]
    return "\n".join(lines) + "\n", calls


def _observe(code: str, calls: list[str]):
    ns: dict = {"__name__": "gen"}
    exec(compile(code, "gen.py", "exec"), ns)
    results = [eval(c, ns) for c in calls]  # noqa: S307 - generated test calls
    return results, ns["CALLS"]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cached_modules())
def test_dict_cache_on_generated_decorator_stacks(case):
    src, calls = case
    e = DictCache(DictCacheEdit(kind="dict-cache", name="dc", functions=["*"]), EditContext("prop-overlay", 1, _TMP))
    module = cst.parse_module(src)
    state = e.inspect(module).state
    has_cache = any(line.strip() in CACHE_SPELLINGS for line in src.splitlines())
    event("has cache decorators" if has_cache else "no cache decorator")
    if not has_cache:
        assert state == EditState.NOT_APPLICABLE
        return
    assert state == EditState.PENDING
    out = e.apply(module).code
    again = cst.parse_module(out)
    assert e.inspect(again).state == EditState.APPLIED
    assert e.apply(again).code == out
    assert e.remove(again).code == src
    assert not [l for l in out.splitlines() if l.strip() in CACHE_SPELLINGS]
    # same results and the same calls of the wrapped bodies (computed once per key) as functools
    assert _observe(out, calls) == _observe(src, calls)


_SEGMENT_LINES = ["x = 1", "y = 'é\f'", "def f(a,\n      b):", "    return  'ü' + \\", "        'z'", "\fclass A:",
                  "  pass", "if x:", "    z = [i for i in (1, 2)]  # ü", "w = f(1,\n 2)"]


@given(st.lists(st.sampled_from(_SEGMENT_LINES), min_size=1, max_size=12), st.sampled_from(["\n", "\r\n", "\r"]),
       st.booleans())
@settings(max_examples=200, deadline=None)
def test_source_segment_equals_ast_get_source_segment(lines, newline, trailing):
    """engine.source_segment (the probes' `contains` scope text) is ast.get_source_segment, for
    every node, whatever the line endings, form feeds and non-ASCII columns."""
    import ast

    from manager.overlays.statuses import source_segment

    text = newline.join(line.replace("\n", newline) for line in lines) + (newline if trailing else "")
    try:
        mod = ast.parse(text)
    except SyntaxError:
        event("not valid python")
        return
    for node in ast.walk(mod):
        if hasattr(node, "lineno"):
            assert source_segment(text, node) == (ast.get_source_segment(text, node) or ""), ast.dump(node)


@pytest.mark.network
def test_probe_scope_walk_finds_the_defs_ast_walk_finds_on_a_real_release():
    """The probes' scope lookup walks statements only (engine._statements): on every model and
    transformers_utils module of vLLM 0.20.0 (where the probes look) it finds exactly the defs and
    classes `ast.walk` finds, from the module and from each class."""
    import ast

    from manager.overlays.statuses import _AST_DEFS, _statements
    from manager.releases import pristine_tree

    base = pristine_tree("0.20.0") / "vllm"
    files = sorted([*(base / "model_executor" / "models").glob("*.py"), *(base / "transformers_utils").rglob("*.py")])
    assert len(files) > 200
    for f in files:
        try:
            mod = ast.parse(f.read_bytes())
        except SyntaxError:
            continue
        for node in [mod, *(n for n in ast.walk(mod) if isinstance(n, ast.ClassDef))]:
            want = sorted(id(n) for n in ast.walk(node) if isinstance(n, _AST_DEFS))
            assert sorted(id(n) for n in _statements(node) if isinstance(n, _AST_DEFS)) == want, f
