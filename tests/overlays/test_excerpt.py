"""manager.overlays.excerpt: a plan parses only the top-level definitions its edits work in,
and that never changes a byte or a status (checked against the whole-module engine)."""

from __future__ import annotations

import ast
import hashlib
import textwrap
from pathlib import Path

import libcst as cst
import pytest

from manager.overlays import excerpt as excerpt_mod
from manager.overlays import load_overlays
from manager.overlays.edits import EditContext, InsertStatements
from manager.overlays.excerpt import _first_indent, excerpt
from manager.overlays.manifest import InsertEdit
from manager.overlays.transaction import apply
from manager.catalog import Catalog
from manager.errors import OverlayError
from tests.helpers import REPO_ROOT
from tests.helpers.catalogs import RELEASES, slim_root, targets_of


def _src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def _insert(tmp_path: Path, scope: str, anchor: str, code: str) -> InsertStatements:
    (tmp_path / "snip.py").write_text(_src(code))
    spec = InsertEdit(kind="insert", name="ins", scope=scope, anchor=anchor, position="after", code="snip.py")
    return InsertStatements(spec, EditContext("ov", 1, tmp_path))


def _of(text: str, *names: str):
    return excerpt(text, ast.parse(text), names)


LAYOUT = _src(
    '''
    """Module docstring."""
    import os


    # a comment above the decorated class: the whole module gives it to the class
    @decorator(
        "arg",
    )
    # a comment between the decorator and the class
    class Target(Base):
        """Doc."""

        def method(self, x):
            y = x + 1
            return y
        # an indented comment after the last method: the class body's footer


    # the next statement's comment
    def after():
        if True:
            pass
    '''
)


def test_edit_on_an_excerpt_renders_the_same_bytes_as_on_the_whole_module(tmp_path):
    edit = _insert(tmp_path, "Target.method", "y = x + 1", "z = y * 2\nif z:\n    y = z\n")
    whole = edit.apply(cst.parse_module(LAYOUT)).code
    part = _of(LAYOUT, "Target")
    assert part is not None and len(part.module.body) == 1
    assert part.render(edit.apply(part.module)) == whole
    assert whole != LAYOUT and "z = y * 2" in whole
    assert part.render(part.module) == LAYOUT  # nothing edited: every byte as read


def test_two_named_definitions_are_both_excerpted_in_file_order(tmp_path):
    part = _of(LAYOUT, "after", "Target")
    assert part is not None
    assert [s.name.value for s in part.module.body] == ["Target", "after"]
    edit = _insert(tmp_path, "after", "if True:\n    pass", "print('x')\n")
    assert part.render(edit.apply(part.module)) == edit.apply(cst.parse_module(LAYOUT)).code


@pytest.mark.parametrize(
    "text, names, why",
    [
        (LAYOUT + "# overlay:other v1 n=1\n", ["Target"], "a sentinel could be outside the excerpt"),
        (LAYOUT.replace("\n", "\r\n"), ["Target"], "CRLF: the newline needs the whole parse"),
        (LAYOUT.rstrip("\n"), ["Target"], "no trailing newline"),
        (LAYOUT, ["Missing"], "the name is not defined"),
        (LAYOUT + "class Target:\n    pass\n", ["Target"], "defined twice (ambiguous)"),
        ("import x\nif x:\n    class T:\n        pass\n", ["T"], "defined inside a top-level if block"),
        ("try:\n    import y\nexcept ImportError:\n    def after():\n        pass\n" + LAYOUT, ["after"],
         "a second definition in an except block"),
        ("def first():\n  return 1\n\nclass T:\n    x = 1\n", ["T"], "the file's first indent (2) is not the class's (4)"),
        ("X = 1\n", ["X"], "not a definition"),
        (LAYOUT, [], "no names"),
    ],
)
def test_no_excerpt_when_it_could_differ_from_the_whole_module(text, names, why):
    assert excerpt(text, ast.parse(text.replace("\r\n", "\n")), names) is None, why


def test_no_excerpt_when_disabled(monkeypatch):
    monkeypatch.setattr(excerpt_mod, "ENABLED", False)
    assert _of(LAYOUT, "Target") is None


def test_render_refuses_a_module_whose_top_level_statements_changed():
    part = _of(LAYOUT, "Target")
    assert part is not None
    grown = part.module.with_changes(body=(*part.module.body, cst.parse_statement("x = 1\n")))
    with pytest.raises(ValueError, match="top-level statements"):
        part.render(grown)


def _python_targets(version: str) -> list[tuple[str, str]]:
    from manager.releases import pristine_tree

    root = pristine_tree(version)
    rels = sorted(set(targets_of(load_overlays(Catalog(REPO_ROOT)))))
    return [(rel, (root / rel).read_text(encoding="utf-8")) for rel in rels if rel.endswith(".py") and (root / rel).is_file()]


@pytest.mark.network
@pytest.mark.parametrize("version", RELEASES)
def test_every_top_level_definition_of_every_target_excerpts_as_the_whole_module_parses_it(version):
    """On the real files: the predicted layout is libcst's, and each definition parsed alone is the
    whole module's node (its leading comments aside) and renders back to the file byte for byte."""
    checked = 0
    for rel, text in _python_targets(version):
        whole = cst.parse_module(text)
        syntax = ast.parse(text)
        assert _first_indent(text) == whole.default_indent, rel
        by_name = {s.name.value: s for s in whole.body if isinstance(s, (cst.ClassDef, cst.FunctionDef))}
        for node in syntax.body:
            if not isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            part = excerpt(text, syntax, [node.name])
            if part is None:
                continue
            assert part.render(part.module) == text, (rel, node.name)
            alone = part.module.body[0]
            assert alone.deep_equals(by_name[node.name].with_changes(leading_lines=())), (rel, node.name)
            assert part.module.code_for_node(alone) in text
            checked += 1
    assert checked > 10  # the test looked at real definitions, not nothing


def _apply_bytes(overlays, root: Path):
    try:
        result = apply(overlays, root)
    except OverlayError as exc:  # the same refusal either way
        return str(exc).replace(str(root), "<root>")
    return (
        {c.path: hashlib.sha256(c.after or b"").hexdigest() for c in result.changes},
        [(o.id, o.status, [(t.path, t.status, t.detail) for t in o.targets]) for o in result.statuses.overlays],
    )


@pytest.mark.network
@pytest.mark.parametrize("version", RELEASES)
def test_apply_with_excerpts_is_byte_identical_to_the_whole_module_engine(tmp_path, monkeypatch, version):
    """Every shipped overlay alone and the whole catalog, on every release of the matrix: the same
    written bytes and the same statuses with excerpts as with whole modules."""
    overlays = load_overlays(Catalog(REPO_ROOT))  # every shipped overlay (read only)
    used: list[bool] = []
    real = excerpt_mod.excerpt

    def spy(text, syntax, names):
        got = real(text, syntax, names)
        used.append(got is not None)
        return got

    monkeypatch.setattr(excerpt_mod, "excerpt", spy)
    targets = targets_of(overlays)
    for n, selection in enumerate([[o] for o in overlays] + [overlays]):
        got = {}
        for enabled in (True, False):
            monkeypatch.setattr(excerpt_mod, "ENABLED", enabled)
            root = slim_root(version, tmp_path / f"root-{n}-{enabled}", [t for t in targets if _exists(version, t)])
            got[enabled] = _apply_bytes(selection, root)
        assert got[True] == got[False], (version, [o.id for o in selection])
    assert any(used), "no apply of this release took the excerpt path"


def _exists(version: str, rel: str) -> bool:
    from manager.releases import pristine_tree

    return (pristine_tree(version) / rel).is_file()


def test_a_python_edit_after_a_text_edit_edits_the_new_text_not_the_parse_of_the_old(tmp_path):
    """_run_edits hands the tree's parsed module (or excerpt) to the first Python edit only: once
    a text edit changed the text, the next Python edit parses the new text (it used to edit the
    stale parse and drop the text edit's lines)."""
    from manager.overlays.edits import TextInsert
    from manager.overlays.manifest import TextInsertEdit
    from manager.overlays.transaction import _run_edits

    (tmp_path / "t.txt").write_text("X_TEXT = 1\n")
    (tmp_path / "s.py").write_text("y = 2\n")
    ctx = EditContext("ov", 1, tmp_path)
    text_edit = TextInsert(TextInsertEdit(kind="text-insert", name="t", anchor="import os", position="after",
                                          code="t.txt"), ctx, "m.py")
    py_edit = InsertStatements(InsertEdit(kind="insert", name="i", scope="f", anchor="x = 1", position="after",
                                          code="s.py"), ctx)
    src = "import os\n\n\ndef f():\n    x = 1\n"
    out, module, part = _run_edits([text_edit, py_edit], "m.py", src, cst.parse_module(src))
    assert "X_TEXT = 1" in out and "    y = 2" in out
    assert module is not None and module.code == out and part is None
