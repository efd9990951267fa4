"""Python edit kinds on a libcst Module: insert, dict-entry, set-value (dict-cache: dictcache.py).

Each kind inspects a module (-> Inspection), applies itself (-> new Module) and
removes its own sentinel-marked blocks (-> Module). Anchors are statement shapes
inside a scope path and must match exactly once.
"""

from __future__ import annotations

import ast

import libcst as cst

from ..trace import add_guards
from ..sentinel import Sentinel, decode_value, encode_value, parse_python, short_hash
from .base import EditContext, EditFailed, EditState, Inspection
from .pycst import (
    MarkedBlock,
    ScopeProblem,
    block_code,
    find_anchor,
    find_marked_blocks,
    leading_lines,
    mark_block,
    parse_statements,
    remove_block,
    replace_body,
    resolve_scope,
    sentinel_of,
    statement_lists,
)


# Blocks already built in this process. A block is a pure function of what its edit reads (the
# snippet text, the overlay id and sentinel version, the edit's name and options) and of the
# target module's layout (the fields its parser config and its code generation read); one apply
# builds the same block up to four times (inspect, insert, the status after writing), each a few
# libcst parses and code generations. libcst nodes are immutable, so the statements are shared.
_BUILT: dict[tuple, tuple] = {}


def _layout(module: cst.Module) -> tuple:
    return (module.encoding, module.default_indent, module.default_newline, module.has_trailing_newline)


def _built(key: tuple, module: cst.Module, make) -> list[cst.BaseStatement]:
    key = (*key, _layout(module))
    hit = _BUILT.get(key)
    if hit is None:
        if len(_BUILT) >= 256:  # a long-lived process (tests) does not grow it without bound
            _BUILT.clear()
        hit = _BUILT[key] = tuple(make())
    return list(hit)


class PythonEdit:
    """Base for edits whose unit is a sentinel-marked block of statements."""

    language = "python"

    def __init__(self, spec, ctx: EditContext) -> None:  # spec: a manifest edit model
        self.spec = spec
        self.ctx = ctx

    @property
    def name(self) -> str:
        return self.spec.name

    def top_level(self) -> str | None:
        """The top-level definition this edit works inside (the first part of its scope), or None
        when it may read or change anything in the module (manager.overlays.excerpt)."""
        return None

    def sentinel(self, *fields: tuple[str, str]) -> Sentinel:
        return Sentinel(self.ctx.overlay_id, self.ctx.version, self.spec.name, tuple(fields))

    # -- the block this edit writes (subclasses build it) --
    def build(self, module: cst.Module) -> list[cst.BaseStatement]:
        raise NotImplementedError

    def _expected_sha(self, module: cst.Module) -> str:
        return short_hash(block_code(module, self.build(module)))

    def _inspect_marked(self, module: cst.Module, blocks: list[MarkedBlock]) -> Inspection:
        if len(blocks) > 1:
            return Inspection(EditState.MODIFIED, f"edit {self.name}: sentinel present {len(blocks)} times")
        mb = blocks[0]
        v = mb.sentinel.version
        if not mb.intact:
            return Inspection(EditState.MODIFIED, f"edit {self.name}: v{v} block was edited after it was written")
        if v < self.ctx.version:
            return Inspection(EditState.OLD, f"edit {self.name}: v{v} present, v{self.ctx.version} available")
        if v > self.ctx.version:
            return Inspection(EditState.MODIFIED,
                              f"edit {self.name}: v{v} is newer than this catalog's v{self.ctx.version}")
        if mb.sentinel.get("sha") != self._expected_sha(module):
            return Inspection(
                EditState.MODIFIED,
                f"edit {self.name}: v{v} block differs from this catalog's v{v} (bump sentinel_version)",
            )
        return Inspection(EditState.APPLIED, f"edit {self.name}: v{v} applied")

    def inspect(self, module: cst.Module) -> Inspection:
        blocks = find_marked_blocks(module, self.ctx.overlay_id, self.name)
        if blocks:
            return self._inspect_marked(module, blocks)
        return self.inspect_unapplied(module)

    def inspect_unapplied(self, module: cst.Module) -> Inspection:
        raise NotImplementedError

    def apply(self, module: cst.Module) -> cst.Module:
        state = self.inspect(module).state
        if state == EditState.APPLIED:
            return module
        if state == EditState.OLD:
            module = self.remove(module)
            state = self.inspect(module).state
        if state != EditState.PENDING:
            raise EditFailed(self.inspect(module).detail)
        return self.insert(module)

    def insert(self, module: cst.Module) -> cst.Module:
        raise NotImplementedError

    def remove(self, module: cst.Module) -> cst.Module:
        blocks = find_marked_blocks(module, self.ctx.overlay_id, self.name)
        for mb in blocks:
            self._check_intact(module, mb)
        for mb in reversed(blocks):
            module = remove_block(module, mb)
        return module

    def expected_block(self, module: cst.Module) -> list[cst.BaseStatement]:
        """The statements the sentinel's sha= covers, as this catalog would write them."""
        return self.build(module)

    def _check_intact(self, module: cst.Module, mb: MarkedBlock) -> None:
        """Refuse (EditFailed naming the line and what differs) to remove a block whose bytes
        no longer match its sentinel: removing `n` statements by count would delete code that
        is not ours."""
        if mb.intact:
            return
        raise EditFailed(block_mismatch(module, mb, self, f"edit {self.name}"))


def block_mismatch(module: cst.Module, mb: MarkedBlock, edit, tag: str) -> str:
    """`line N: <tag>: the block under the sentinel does not match it (…what differs…)`."""
    found = list(mb.owner.body[mb.index : mb.index + mb.count])  # type: ignore[attr-defined]
    got = block_code(module, found).splitlines() if found else []
    want: list[str] = []
    try:
        stmts = edit.expected_block(module) if edit is not None else []
        want = block_code(module, stmts).splitlines() if stmts else []
    except Exception:  # noqa: BLE001 - the catalog's snippet is unreadable: say what we can
        want = []
    found_sha = short_hash(block_code(module, found)) if found else "-"
    what = f"sentinel n={mb.count} sha={mb.sentinel.get('sha')}, found sha={found_sha}"
    if len(found) < mb.count:
        what += f"; only {len(found)} of its {mb.count} statements follow it"
    if want:
        for i in range(max(len(want), len(got))):
            a = want[i] if i < len(want) else "<end of block>"
            b = got[i] if i < len(got) else "<end of block>"
            if a != b:
                what += f"; block line {i + 1}: expected {a.strip()!r}, found {b.strip()!r}"
                break
    return f"line {sentinel_line(module, mb)}: {tag}: the block under the sentinel does not match it ({what})"


def sentinel_line(module: cst.Module, mb: MarkedBlock) -> int | str:
    """1-based line of the block's sentinel comment in the module's code ('?' if not found)."""
    stmt = mb.owner.body[mb.index]  # type: ignore[attr-defined]
    comments = [ln.comment.value.strip() for ln in stmt.leading_lines if ln.comment is not None]
    mine = [c for c in comments if (parse_python(c) or None) == mb.sentinel]
    if not mine:
        return "?"
    for n, line in enumerate(module.code.splitlines(), 1):
        if line.strip() == mine[0]:
            return n
    return "?"


class _ScopedEdit(PythonEdit):
    """An edit confined to its `scope` path (its anchor, assignment and blocks are all inside it)."""

    def top_level(self) -> str | None:
        return self.spec.scope.split(".")[0] or None


class InsertStatements(_ScopedEdit):
    """Insert a snippet before/after an anchor statement inside a scope path."""

    def build(self, module: cst.Module) -> list[cst.BaseStatement]:
        snippet = self.ctx.read(self.spec.code)

        def make() -> list[cst.BaseStatement]:
            code = snippet
            if self.spec.trace:
                # OVERLAY_TRACE=1 runtime marker (manager/overlays/trace.py): fixed text, the block stays deterministic
                code = add_guards(code, self.ctx.overlay_id, self.ctx.version, self.spec.name)
            try:
                stmts = parse_statements(code, module)
            except EditFailed as exc:
                msg = str(exc)
                raise EditFailed(
                    msg if self.spec.code in msg else f"{self.ctx.overlay_dir / self.spec.code}: {msg}"
                ) from None
            return mark_block(module, stmts, self.sentinel())

        key = ("insert", self.ctx.overlay_id, self.ctx.version, self.spec.name, bool(self.spec.trace), snippet)
        return _built(key, module, make)

    def _sites(self, module: cst.Module):
        scope = resolve_scope(module, self.spec.scope)
        return find_anchor(module, scope, self.spec.anchor)

    def inspect_unapplied(self, module: cst.Module) -> Inspection:
        where = self.spec.scope or "<module>"
        try:
            sites = self._sites(module)
        except ScopeProblem as exc:
            return Inspection(EditState(exc.kind), f"edit {self.name}: {exc.detail}")
        if len(sites) == 1:
            self.build(module)  # a snippet that does not parse is an error now, not at apply time
            return Inspection(EditState.PENDING, f"edit {self.name}: anchor found once in {where}")
        if not sites:
            return Inspection(EditState.DRIFT,
                              f"edit {self.name}: anchor not found in {where}: {self.spec.anchor.strip()!r}")
        return Inspection(EditState.DRIFT,
                          f"edit {self.name}: anchor matches {len(sites)} times in {where} (ambiguous)")

    def insert(self, module: cst.Module) -> cst.Module:
        sites = self._sites(module)
        if len(sites) != 1:
            raise EditFailed(self.inspect_unapplied(module).detail)
        site = sites[0]
        body = list(site.owner.body)  # type: ignore[attr-defined]
        at = site.index if self.spec.position == "before" else site.index + 1
        body[at:at] = self.build(module)
        return replace_body(module, site.owner, body)


def _target_code(module: cst.Module, stmt: cst.CSTNode) -> list[str]:
    """Assignment target(s) of a simple statement line, as code."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return []
    small = stmt.body[0]
    if isinstance(small, cst.Assign):
        return [module.code_for_node(t.target).strip() for t in small.targets]
    if isinstance(small, cst.AnnAssign):
        return [module.code_for_node(small.target).strip()]
    return []


def _assignments(module: cst.Module, scope: cst.CSTNode, name: str):
    out = []
    for block in statement_lists(scope):
        for i, stmt in enumerate(block.body):
            if sentinel_of(stmt) is None and name in _target_code(module, stmt):
                out.append((block, i, stmt))
    return out


class _AssignmentEdit(_ScopedEdit):
    """Edits anchored on the unique assignment of one name inside a scope."""

    def _name(self) -> str:
        raise NotImplementedError

    def _find(self, module: cst.Module):
        """(block, index, statement) of the unique assignment, or the Inspection saying why not."""
        try:
            scope = resolve_scope(module, self.spec.scope)
        except ScopeProblem as exc:
            return Inspection(EditState(exc.kind), f"edit {self.name}: {exc.detail}")
        found = _assignments(module, scope, self._name())
        if len(found) != 1:
            how = "not found" if not found else f"assigned {len(found)} times (ambiguous)"
            return Inspection(EditState.DRIFT, f"edit {self.name}: {self._name()} {how}")
        return found[0]

    def _found_or_fail(self, module: cst.Module):
        found = self._find(module)
        if isinstance(found, Inspection):
            raise EditFailed(found.detail)
        return found


class DictEntry(_AssignmentEdit):
    """Add an entry to a dict literal: `NAME[KEY] = VALUE` right after its assignment."""

    def _name(self) -> str:
        return self.spec.dict_name

    def build(self, module: cst.Module) -> list[cst.BaseStatement]:
        code = f"{self.spec.dict_name}[{self.spec.key}] = {self.spec.value}\n"
        return mark_block(module, parse_statements(code, module), self.sentinel())

    def inspect_unapplied(self, module: cst.Module) -> Inspection:
        found = self._find(module)
        if isinstance(found, Inspection):
            return found
        value = found[2].body[0].value  # type: ignore[attr-defined]
        if not isinstance(value, cst.Dict):
            return Inspection(EditState.DRIFT, f"edit {self.name}: {self.spec.dict_name} is not a dict literal")
        want = ast.dump(ast.parse(self.spec.key, mode="eval"))
        for el in value.elements:
            if isinstance(el, cst.DictElement) and (
                    ast.dump(ast.parse(module.code_for_node(el.key).strip(), mode="eval")) == want):
                return Inspection(EditState.NATIVE,
                                  f"edit {self.name}: key {self.spec.key} already in {self.spec.dict_name}")
        return Inspection(EditState.PENDING, f"edit {self.name}: dict {self.spec.dict_name} found once")

    def insert(self, module: cst.Module) -> cst.Module:
        block, i, _ = self._found_or_fail(module)
        body = list(block.body)
        body[i + 1 : i + 1] = self.build(module)
        return replace_body(module, block, body)


class SetValue(_AssignmentEdit):
    """Replace the value of a unique assignment inside a scope; the original rides in `was=`."""

    def _name(self) -> str:
        return self.spec.assign

    def _new_stmt(self, module: cst.Module) -> list[cst.BaseStatement]:
        return parse_statements(f"{self.spec.assign} = {self.spec.value}\n", module)

    def build(self, module: cst.Module) -> list[cst.BaseStatement]:
        return mark_block(module, self._new_stmt(module), self.sentinel())

    def expected_block(self, module: cst.Module) -> list[cst.BaseStatement]:
        return self._new_stmt(module)

    def _expected_sha(self, module: cst.Module) -> str:
        return short_hash(block_code(module, self._new_stmt(module)))

    def inspect_unapplied(self, module: cst.Module) -> Inspection:
        found = self._find(module)
        if isinstance(found, Inspection):
            return found
        current = module.code_for_node(found[2].body[0].value).strip()  # type: ignore[attr-defined]
        if ast.dump(ast.parse(current, mode="eval")) == ast.dump(ast.parse(self.spec.value, mode="eval")):
            return Inspection(EditState.NATIVE, f"edit {self.name}: {self.spec.assign} is already {self.spec.value}")
        return Inspection(EditState.PENDING, f"edit {self.name}: {self.spec.assign} = {current}")

    def insert(self, module: cst.Module) -> cst.Module:
        block, i, stmt = self._found_or_fail(module)
        original = module.code_for_node(stmt.with_changes(leading_lines=())).rstrip("\n")
        if "\n" in original:
            raise EditFailed(f"edit {self.name}: the original assignment spans several lines; set-value needs one line")
        new = mark_block(module, self._new_stmt(module), self.sentinel(("was", encode_value(original))))
        new[0] = new[0].with_changes(leading_lines=(*leading_lines(new[0]), *stmt.leading_lines))
        body = list(block.body)
        body[i] = new[0]
        return replace_body(module, block, body)

    def remove(self, module: cst.Module) -> cst.Module:
        blocks = find_marked_blocks(module, self.ctx.overlay_id, self.name)
        for mb in blocks:
            self._check_intact(module, mb)
        for mb in reversed(blocks):
            was = mb.sentinel.get("was")
            if was is None:
                raise EditFailed(f"edit {self.name}: sentinel without was= cannot be reverted")
            stmt = mb.owner.body[mb.index]  # type: ignore[attr-defined]
            restored = parse_statements(decode_value(was) + "\n", module)[0]
            keep = tuple(ln for ln in stmt.leading_lines if sentinel_of(stmt.with_changes(leading_lines=(ln,))) is None)
            body = list(mb.owner.body)  # type: ignore[attr-defined]
            body[mb.index] = restored.with_changes(leading_lines=keep)
            module = replace_body(module, mb.owner, body)
        return module
