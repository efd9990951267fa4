"""libcst helpers: scope paths, statement shapes, sentinel-marked blocks."""

from __future__ import annotations

import ast
import dataclasses
import functools
import textwrap
from dataclasses import dataclass
from collections.abc import Iterator, Sequence

import libcst as cst

from ..sentinel import Sentinel, parse_python, short_hash
from . import matching as m  # the house rule: sentinels and decorator shapes are detected with libcst matchers
from .base import EditFailed

SENTINEL_RE = r"#\s?overlay:[a-z0-9][a-z0-9._-]* v\d+ .*"  # fullmatch


@functools.cache
def sentinel_line_matcher():
    """m.EmptyLine(comment=m.Comment(m.MatchRegex(SENTINEL_RE))), built on first use."""
    return m.EmptyLine(comment=m.Comment(m.MatchRegex(SENTINEL_RE)))


_COMPOUND = (cst.If, cst.For, cst.While, cst.With, cst.Try, cst.TryStar, cst.Match, cst.FunctionDef, cst.ClassDef)


class ScopeProblem(Exception):
    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind  # "superseded" | "drift"
        self.detail = detail


# --- statement lists -------------------------------------------------------------------


def _child_blocks(stmt: cst.CSTNode) -> Iterator[cst.BaseSuite]:
    """The suites directly owned by a compound statement (not nested defs' bodies)."""
    if isinstance(stmt, (cst.If,)):
        yield stmt.body
        if stmt.orelse is not None:
            if isinstance(stmt.orelse, cst.If):
                yield from _child_blocks(stmt.orelse)
            else:
                yield stmt.orelse.body
    elif isinstance(stmt, (cst.For, cst.While)):
        yield stmt.body
        if stmt.orelse is not None:
            yield stmt.orelse.body
    elif isinstance(stmt, cst.With):
        yield stmt.body
    elif isinstance(stmt, (cst.Try, cst.TryStar)):
        yield stmt.body
        for h in stmt.handlers:
            yield h.body
        if stmt.orelse is not None:
            yield stmt.orelse.body
        if stmt.finalbody is not None:
            yield stmt.finalbody.body
    elif isinstance(stmt, cst.Match):
        for case in stmt.cases:
            yield case.body


def statement_lists(owner: cst.CSTNode) -> Iterator[cst.Module | cst.IndentedBlock]:
    """Every statement-list owner (Module or IndentedBlock) inside `owner`'s body,
    without entering nested function or class definitions."""
    if isinstance(owner, cst.Module):
        root: cst.CSTNode = owner
    elif isinstance(owner, (cst.FunctionDef, cst.ClassDef)):
        root = owner.body
    else:
        root = owner
    stack = [root]
    while stack:
        block = stack.pop()
        if not isinstance(block, (cst.Module, cst.IndentedBlock)):
            continue
        yield block
        for stmt in block.body:
            if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
                continue
            stack.extend(_child_blocks(stmt))


def defs_in(owner: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Function/class definitions declared directly in `owner` (through if/try/with blocks)."""
    for block in statement_lists(owner):
        for stmt in block.body:
            if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
                yield stmt


def resolve_scope(module: cst.Module, path: str) -> cst.CSTNode:
    """`Class.method._nested` -> that node. Raises ScopeProblem (superseded / drift)."""
    node: cst.CSTNode = module
    walked: list[str] = []
    for part in [p for p in path.split(".") if p]:
        found = [d for d in defs_in(node) if d.name.value == part]  # type: ignore[attr-defined]
        walked.append(part)
        if not found:
            raise ScopeProblem("superseded", f"scope {'.'.join(walked)} not found")
        if len(found) > 1:
            raise ScopeProblem("drift", f"scope {'.'.join(walked)} is ambiguous ({len(found)} definitions)")
        node = found[0]
    return node


# --- statement shapes -------------------------------------------------------------------


def _ast_key(code: str) -> str:
    return ast.dump(ast.parse(textwrap.dedent(code)))


def _header_only(stmt: cst.CSTNode) -> cst.CSTNode:
    """A compound statement reduced to its header (body `pass`, no else branches)."""
    body = cst.IndentedBlock(body=[cst.SimpleStatementLine(body=[cst.Pass()])])
    changes: dict[str, object] = {"body": body, "leading_lines": ()}
    if hasattr(stmt, "orelse"):
        changes["orelse"] = None
    if isinstance(stmt, cst.Try):
        changes["handlers"] = (cst.ExceptHandler(body=body),)
        changes["finalbody"] = None
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
        changes["decorators"] = ()
    return stmt.with_changes(**changes)


def statement_key(module: cst.Module, stmt: cst.CSTNode) -> str:
    """The structural identity of a statement: its AST, ignoring layout and comments."""
    if isinstance(stmt, _COMPOUND):
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            return f"{type(stmt).__name__}:{stmt.name.value}"
        code = module.code_for_node(_header_only(stmt))
    else:
        code = module.code_for_node(stmt.with_changes(leading_lines=()))
    try:
        return _ast_key(code)
    except SyntaxError:
        return code.strip()


def _shape(stmt: cst.CSTNode) -> object:
    """What two statements with one `statement_key` always share, read without rendering them: the
    node type (for a simple line, the types of its small statements). An ast key names its node
    type and each small statement's, and libcst has one node type per ast statement type (async
    forms share theirs), so `find_anchor` renders and parses only statements of the anchor's shape."""
    if isinstance(stmt, cst.SimpleStatementLine):
        return tuple(type(small) for small in stmt.body)
    return type(stmt)


def _anchor(anchor: str, config: cst.PartialParserConfig) -> cst.Module:
    """The anchor parsed as a module of exactly one statement (EditFailed otherwise)."""
    text = anchor.strip()
    if text.endswith(":"):
        text = text + "\n    pass\n"
        if text.startswith("try"):  # a bare `try:` header needs a handler to parse
            text += "except Exception:\n    pass\n"
    try:
        mod = cst.parse_module(text + ("\n" if not text.endswith("\n") else ""), config=config)
    except cst.ParserSyntaxError as exc:
        raise EditFailed(f"anchor {anchor!r} is not a Python statement: {exc.message}") from None
    if len(mod.body) != 1:
        raise EditFailed(f"anchor {anchor!r} must be exactly one statement")
    return mod


@dataclass(frozen=True)
class Site:
    owner: cst.CSTNode  # Module or IndentedBlock
    index: int


def find_anchor(module: cst.Module, scope: cst.CSTNode, anchor: str) -> list[Site]:
    want = _anchor(anchor, module.config_for_parsing)
    shape, key = _shape(want.body[0]), statement_key(want, want.body[0])
    sites = []
    for block in statement_lists(scope):
        for i, stmt in enumerate(block.body):
            if _shape(stmt) == shape and statement_key(module, stmt) == key:
                sites.append(Site(block, i))
    return sites


# --- code building ----------------------------------------------------------------------


def parse_statements(code: str, module: cst.Module) -> list[cst.BaseStatement]:
    code = textwrap.dedent(code.replace("\r\n", "\n")).strip("\n") + "\n"
    if module.default_newline != "\n":  # a CRLF file gets CRLF lines, never a mix
        code = code.replace("\n", module.default_newline)
    try:
        mod = cst.parse_module(code, config=module.config_for_parsing)
    except cst.ParserSyntaxError as exc:
        raise EditFailed(f"snippet does not parse: {exc.message} (line {exc.raw_line})") from None
    if not mod.body:
        raise EditFailed("snippet has no statements")
    body: list[cst.BaseStatement] = list(mod.body)
    if mod.header:  # comments above the first statement parse as the module header
        first = mod.body[0]
        body[0] = first.with_changes(leading_lines=(*mod.header, *first.leading_lines))
    return body


def leading_lines(stmt: cst.BaseStatement) -> Sequence[cst.EmptyLine]:
    """The comment/blank lines above a statement. Both kinds of BaseStatement (a simple statement line, a compound
    statement) have them; BaseStatement itself declares none."""
    if isinstance(stmt, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
        return stmt.leading_lines
    return ()


def block_code(module: cst.Module, stmts: Sequence[cst.BaseStatement]) -> str:
    """Code of a block for hashing: the first statement's leading lines (the sentinel and any
    comments above it) dropped, the rest as written."""
    body = [stmts[0].with_changes(leading_lines=()), *stmts[1:]]
    return module.with_changes(body=body, header=(), footer=()).code


def mark_block(
    module: cst.Module, stmts: list[cst.BaseStatement], sentinel: Sentinel
) -> list[cst.BaseStatement]:
    """Put the sentinel (with n= and sha= of the block) in the first statement's leading_lines."""
    digest = short_hash(block_code(module, stmts))
    fields = (("n", str(len(stmts))), ("sha", digest), *sentinel.fields)
    full = Sentinel(sentinel.overlay, sentinel.version, sentinel.edit, fields)
    first = stmts[0]
    line = cst.EmptyLine(comment=cst.Comment(full.python()))
    return [first.with_changes(leading_lines=(line, *leading_lines(first))), *stmts[1:]]


def sentinel_of(stmt: cst.CSTNode) -> Sentinel | None:
    for line in getattr(stmt, "leading_lines", ()):
        # the matcher decides; a line without a comment (most of them), or whose comment lacks the
        # "overlay:" its pattern requires, cannot match it: the generic matcher machinery (and its
        # import, on a file no overlay has touched) is the largest cost of walking for sentinels
        if line.comment is not None and "overlay:" in line.comment.value and m.matches(line, sentinel_line_matcher()):
            return parse_python(line.comment.value)
    return None


@dataclass(frozen=True)
class MarkedBlock:
    owner: cst.CSTNode
    index: int
    sentinel: Sentinel
    count: int
    intact: bool  # the block's hash equals the sha in its sentinel


def find_marked_blocks(module: cst.Module, overlay: str, edit: str) -> list[MarkedBlock]:
    found: list[MarkedBlock] = []
    for block in statement_lists(module):
        _collect(module, block, overlay, edit, found)
    # nested defs are not walked by statement_lists(module); walk every def too
    for node in all_defs(module):
        for block in statement_lists(node):
            _collect(module, block, overlay, edit, found)
    return found


def all_defs(module: cst.Module) -> Iterator[cst.CSTNode]:
    stack: list[cst.CSTNode] = [module]
    while stack:
        node = stack.pop()
        for d in defs_in(node):
            yield d
            stack.append(d)


def _collect(module: cst.Module, block: cst.CSTNode, overlay: str, edit: str, out: list[MarkedBlock]) -> None:
    body = block.body  # type: ignore[attr-defined]
    for i, stmt in enumerate(body):
        s = sentinel_of(stmt)
        if s is None or s.overlay != overlay or s.edit != edit:
            continue
        try:
            n = int(s.get("n", "1") or "1")
        except ValueError:
            n = 1
        stmts = list(body[i : i + n])
        intact = len(stmts) == n and short_hash(block_code(module, stmts)) == s.get("sha")
        out.append(MarkedBlock(block, i, s, n, intact))


_SUITE_HOLDERS: tuple[type[cst.CSTNode], ...] = (
    cst.BaseSuite, cst.BaseCompoundStatement, cst.Else, cst.Finally, cst.ExceptHandler
)
if hasattr(cst, "MatchCase"):
    _SUITE_HOLDERS = (*_SUITE_HOLDERS, cst.MatchCase, cst.ExceptStarHandler)


def _path_to(node: cst.CSTNode, target: cst.CSTNode) -> list[tuple[cst.CSTNode, str, int | None]] | None:
    """(parent, field, index) steps from `node` down to `target`, walking statement structure only."""
    if node is target:
        return []
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if isinstance(value, _SUITE_HOLDERS):
            sub = _path_to(value, target)
            if sub is not None:
                return [(node, f.name, None), *sub]
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                if isinstance(item, _SUITE_HOLDERS):
                    sub = _path_to(item, target)
                    if sub is not None:
                        return [(node, f.name, i), *sub]
    return None


def replace_body(module: cst.Module, owner: cst.CSTNode, new_body: Sequence[cst.BaseStatement]) -> cst.Module:
    """Give `owner` (the Module or an IndentedBlock in it) a new body, rebuilding only the
    nodes on the path from the module down to it (not the whole tree, as deep_replace does)."""
    if owner is module:
        return module.with_changes(body=tuple(new_body))
    path = _path_to(module, owner)
    if path is None:  # not reachable through statements: fall back to the general replace
        replaced = module.deep_replace(owner, owner.with_changes(body=tuple(new_body)))
        assert isinstance(replaced, cst.Module)  # only the root itself (owner is not it) would come back replaced
        return replaced
    node: cst.CSTNode = owner.with_changes(body=tuple(new_body))
    for parent, name, index in reversed(path):
        if index is None:
            node = parent.with_changes(**{name: node})
        else:
            items = list(getattr(parent, name))
            items[index] = node
            node = parent.with_changes(**{name: tuple(items)})
    return node  # type: ignore[return-value]


def remove_block(module: cst.Module, mb: MarkedBlock) -> cst.Module:
    body = list(mb.owner.body)  # type: ignore[attr-defined]
    del body[mb.index : mb.index + mb.count]
    if not body:
        raise EditFailed("removing the block would leave an empty suite")
    return replace_body(module, mb.owner, body)
