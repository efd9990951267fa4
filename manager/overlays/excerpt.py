"""Parse only the top-level definitions a plan's edits work in, and splice their new code back.

A first apply of #40886 edits one class of gemma4.py's 1,700 lines, yet parsing and generating the
whole module with libcst was most of its work. When it is safe to look at the named top-level
definitions on their own, `excerpt()` parses each alone (from its first decorator to the next
top-level statement) and returns an `Excerpt`: a libcst Module whose body is just those statements,
laid out as the whole file is (indent, newline, trailing newline), and `render(module)`, which puts
each statement's new code in place of its old code in the file's text and leaves every other byte
as read. The edits see the nodes the whole module would give them, so they make the same decisions
and write the same bytes (tests/overlays/test_excerpt.py checks that on every release of the test
matrix against the whole-module engine).

It is not safe, and `excerpt()` returns None so that the caller parses the whole module, when
- the text contains "overlay:" anywhere: a sentinel could sit outside the named statements, and
  the walks for marked blocks (status, upgrade, removal) must see all of them;
- the text contains a carriage return, or does not end with a newline (the whole module's newline
  and trailing newline would then need the whole parse to be told exactly);
- a name is not defined exactly once among the module's definitions (seen through if/try/with/for/
  while/match blocks, as scope resolution sees them), or its one definition is nested in such a
  block rather than a top-level statement of its own;
- the file has no indented block before its end (no INDENT token: libcst's default indent then),
  or a statement parsed alone lays out differently from the whole file (another first indent), or
  does not give back its own text.

`ENABLED` is a test seam: False makes every apply parse whole modules (the reference).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass
from collections.abc import Iterable

import libcst as cst

ENABLED = True

_NEWLINE = re.compile("\n")
_BLOCKS = ("body", "orelse", "finalbody")
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


@dataclass(frozen=True)
class Excerpt:
    """Some top-level statements of a file, parsed alone; `module.body[i]` was `source[spans[i]]`."""

    source: str
    spans: tuple[tuple[int, int], ...]
    module: cst.Module

    def render(self, module: cst.Module) -> str:
        """The whole file's text with each statement of `module` (this excerpt's module after
        edits) in place of the one it was parsed from."""
        if len(module.body) != len(self.spans) or module.header or module.footer:
            raise ValueError("an edit changed the excerpt's top-level statements")  # a bug: edits work inside them
        out, at = [], 0
        for (start, end), old, new in zip(self.spans, self.module.body, module.body, strict=False):
            out.append(self.source[at:start])
            out.append(self.source[start:end] if new is old else module.code_for_node(new))
            at = end
        out.append(self.source[at:])
        return "".join(out)


def _first_indent(text: str) -> str | None:
    """The whitespace of the file's first INDENT token (libcst's default indent), or None."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.INDENT:
                return tok.string
    except (tokenize.TokenError, SyntaxError):
        return None
    return None


def _definitions(mod: ast.Module) -> dict[str, list[ast.AST]]:
    """name -> its definitions among the module's statements, through compound blocks but not
    into other definitions (what pycst.defs_in(module) walks)."""
    found: dict[str, list[ast.AST]] = {}
    stack: list[ast.AST] = list(reversed(mod.body))
    while stack:
        node = stack.pop()
        if isinstance(node, _DEFS):
            found.setdefault(node.name, []).append(node)
            continue
        for field in _BLOCKS:
            stack.extend(v for v in getattr(node, field, ()) or () if isinstance(v, ast.stmt))
        for holder in (*getattr(node, "handlers", ()), *getattr(node, "cases", ())):
            stack.extend(holder.body)
    return found


def _first_line(node: ast.AST) -> int:
    decorators = getattr(node, "decorator_list", None) or ()
    return min([node.lineno, *(d.lineno for d in decorators)])  # type: ignore[attr-defined]


def excerpt(text: str, syntax: ast.Module | None, names: Iterable[str]) -> Excerpt | None:
    """The top-level definitions `names` of `text` (parsed by `ast` as `syntax`), parsed alone;
    None whenever that could differ from parsing the whole module (see the module's docstring)."""
    names = sorted(set(names))
    if not ENABLED or not names or syntax is None or "overlay:" in text or "\r" in text or not text.endswith("\n"):
        return None
    defs = _definitions(syntax)
    top = syntax.body
    position = {id(s): i for i, s in enumerate(top)}
    picked = []
    for name in names:
        found = defs.get(name, [])
        if len(found) != 1 or id(found[0]) not in position:  # ambiguous, or nested in a block
            return None
        picked.append(position[id(found[0])])
    indent = _first_indent(text)
    if indent is None:
        return None
    line_starts = [0, *(m.end() for m in _NEWLINE.finditer(text))]
    spans, stmts = [], []
    for i in sorted(picked):
        start = line_starts[_first_line(top[i]) - 1]
        end = line_starts[_first_line(top[i + 1]) - 1] if i + 1 < len(top) else len(text)
        chunk = text[start:end]
        try:
            alone = cst.parse_module(chunk)
        except cst.ParserSyntaxError:
            return None
        if len(alone.body) != 1 or alone.header or alone.default_indent != indent or alone.default_newline != "\n":
            return None
        code = alone.code_for_node(alone.body[0])
        if not chunk.startswith(code):
            return None
        spans.append((start, start + len(code)))
        stmts.append(alone.body[0])
    module = cst.Module(body=tuple(stmts), header=(), footer=(), encoding="utf-8", default_indent=indent,
                        default_newline="\n", has_trailing_newline=True)
    return Excerpt(text, tuple(spans), module)
