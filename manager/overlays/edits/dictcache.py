"""The dict-cache edit: functools.cache / lru_cache decorators swapped for a plain-dict cache helper.

torch.compile / Dynamo cannot trace through the C-level `_lru_cache_wrapper` (it breaks CUDA-graph
capture); the helper (`dict_cache_helper.py`, inserted from its source after the target's
imports) memoises in Python with the same results. Each replaced decorator keeps what it was in
its sentinel's `was=` field, so revert restores it exactly.
"""

from __future__ import annotations

import ast
from pathlib import Path
from collections.abc import Sequence

import libcst as cst

from ..sentinel import Sentinel, decode_value, encode_value, parse_python, short_hash
from .base import EditFailed, EditState, Inspection
from .pycst import (
    ScopeProblem,
    all_defs,
    block_code,
    defs_in,
    find_marked_blocks,
    leading_lines,
    mark_block,
    parse_statements,
    remove_block,
    resolve_scope,
)
from . import matching as m  # libcst matchers, without building the generated package (matching.py)
from .python import PythonEdit, _built, block_mismatch


def _helper_source() -> str:
    """The helper function's source as inserted: a blank line, then the def, byte for byte."""
    path = Path(__file__).with_name("dict_cache_helper.py")
    text = path.read_text()
    fn = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == HELPER_NAME)
    lines = text.splitlines(keepends=True)
    return "\n" + "".join(lines[fn.lineno - 1 : fn.end_lineno])


HELPER_NAME = "_overlay_dict_cache"
HELPER_CODE = _helper_source()

_CACHE_NAMES = {"cache", "lru_cache"}


def _cache_decorator(dec: cst.Decorator) -> tuple[str, cst.Arg | None, bool] | None:
    """(kind, maxsize arg, called) when `dec` is functools.cache / lru_cache in any spelling."""
    expr = dec.decorator
    call = None
    if isinstance(expr, cst.Call):
        call, expr = expr, expr.func
    if m.matches(expr, m.Name()) and expr.value in _CACHE_NAMES:  # type: ignore[attr-defined]
        kind = expr.value  # type: ignore[attr-defined]
    elif m.matches(expr, m.Attribute(value=m.Name("functools"))) and expr.attr.value in _CACHE_NAMES:  # type: ignore[attr-defined]
        kind = expr.attr.value  # type: ignore[attr-defined]
    else:
        return None
    maxsize = None
    if call is not None:
        for i, arg in enumerate(call.args):
            if (arg.keyword is not None and arg.keyword.value == "maxsize") or (arg.keyword is None and i == 0):
                maxsize = arg
    return kind, maxsize, call is not None


def _qualnames(module: cst.Module, targets: Sequence[cst.FunctionDef]) -> list[str]:
    """`Class.method` of each target, from one walk of the module's definitions.

    (One walk per target made the status of a file with many cache decorators quadratic in its
    size: issue 10, item 11.)"""
    wanted = {id(t) for t in targets}
    found: dict[int, str] = {}
    stack: list[tuple[cst.CSTNode, str]] = [(module, "")]
    while stack and len(found) < len(wanted):
        node, prefix = stack.pop()
        for d in defs_in(node):
            name = prefix + d.name.value  # type: ignore[attr-defined]
            if id(d) in wanted:
                found[id(d)] = name
            stack.append((d, name + "."))
    return [found.get(id(t), "") for t in targets]


class DictCache(PythonEdit):
    """Replace functools.cache / lru_cache decorators with a plain dict cache helper."""

    @property
    def helper_edit(self) -> str:
        return f"{self.name}-helper"

    def _functions(self, module: cst.Module) -> tuple[list[cst.FunctionDef], list[str]]:
        if self.spec.functions == ["*"]:
            return [d for d in all_defs(module) if isinstance(d, cst.FunctionDef)], []
        funcs, missing = [], []
        for q in self.spec.functions:
            try:
                node = resolve_scope(module, q)
            except ScopeProblem:
                missing.append(q)
                continue
            if isinstance(node, cst.FunctionDef):
                funcs.append(node)
            else:
                missing.append(q)
        return funcs, missing

    def _dec_sentinel(self, f: cst.FunctionDef, i: int, dec: cst.Decorator) -> Sentinel | None:
        """Our sentinel for decorator i: in its leading_lines, or (first decorator) the def's."""
        lines = list(dec.leading_lines) + (list(f.leading_lines) if i == 0 else [])
        for line in lines:
            if line.comment is None:
                continue
            s = parse_python(line.comment.value)
            if s is not None and s.overlay == self.ctx.overlay_id and s.edit == self.name:
                return s
        return None

    def _scan(self, module: cst.Module):
        funcs, missing = self._functions(module)
        ours: list[tuple[cst.FunctionDef, cst.Decorator, Sentinel]] = []
        bad: list[tuple[cst.FunctionDef, cst.Decorator, Sentinel]] = []
        theirs: list[tuple[cst.FunctionDef, cst.Decorator]] = []
        for f in funcs:
            for i, dec in enumerate(f.decorators):
                s = self._dec_sentinel(f, i, dec)
                if s is not None:
                    expected = self._new_decorator_code(module, decode_value(s.get("was") or ""))
                    code = module.code_for_node(dec.decorator).strip()
                    (ours if code == expected else bad).append((f, dec, s))
                elif _cache_decorator(dec) is not None:
                    theirs.append((f, dec))
        return ours, theirs, bad, missing

    def _new_decorator_code(self, module: cst.Module, was: str) -> str:
        try:
            dec = _parse_decorator(was)
        except Exception:  # noqa: BLE001 - a broken was= is reported as modified
            return "<unparseable was=>"
        info = _cache_decorator(dec)
        if info is None:
            return "<not a cache decorator>"
        kind, maxsize, _ = info
        if maxsize is not None:
            return f"{HELPER_NAME}(maxsize={module.code_for_node(maxsize.value).strip()})"
        if kind == "lru_cache":  # a bare lru_cache / lru_cache() is bounded at 128 by functools
            return f"{HELPER_NAME}(maxsize=128)"
        return HELPER_NAME

    def inspect(self, module: cst.Module) -> Inspection:
        ours, theirs, bad, missing = self._scan(module)
        helpers = find_marked_blocks(module, self.ctx.overlay_id, self.helper_edit)
        tag = f"edit {self.name}"
        if missing and self.spec.functions != ["*"]:
            state = EditState.SUPERSEDED if len(missing) == len(self.spec.functions) else EditState.DRIFT
            return Inspection(state, f"{tag}: functions not found: {', '.join(missing)}")
        if bad:
            return Inspection(EditState.MODIFIED,
                              f"{tag}: decorator on {bad[0][0].name.value} was edited after it was written")
        if len(helpers) > 1 or (helpers and not helpers[0].intact):
            return Inspection(EditState.MODIFIED, f"{tag}: the {HELPER_NAME} helper was edited or duplicated")
        if ours and not helpers:
            return Inspection(EditState.MODIFIED, f"{tag}: decorators replaced but the {HELPER_NAME} helper is missing")
        versions = {s.version for _, _, s in ours} | {h.sentinel.version for h in helpers}
        if ours and theirs:
            return Inspection(EditState.PARTIAL, f"{tag}: {len(ours)} cache decorators replaced, {len(theirs)} not")
        if ours:
            if max(versions) > self.ctx.version:
                return Inspection(EditState.MODIFIED, f"{tag}: v{max(versions)} is newer than this catalog's")
            if min(versions) < self.ctx.version:
                return Inspection(EditState.OLD, f"{tag}: v{min(versions)} present, v{self.ctx.version} available")
            if helpers[0].sentinel.get("sha") != short_hash(block_code(module, self._helper_stmts(module))):
                return Inspection(EditState.MODIFIED, f"{tag}: helper differs from this catalog's v{self.ctx.version}")
            names = ", ".join(sorted(set(_qualnames(module, [f for f, _, _ in ours]))))
            return Inspection(EditState.APPLIED, f"{tag}: {len(ours)} dict caches ({names})")
        if helpers:
            return Inspection(EditState.MODIFIED, f"{tag}: helper present but no decorator replaced")
        if not theirs:
            return Inspection(EditState.NOT_APPLICABLE, f"{tag}: no functools cache decorators")
        names = ", ".join(sorted(set(_qualnames(module, [f for f, _ in theirs]))))
        return Inspection(EditState.PENDING, f"{tag}: {len(theirs)} cache decorators ({names})")

    def _helper_stmts(self, module: cst.Module) -> list[cst.BaseStatement]:
        return _built(("dict-cache-helper", HELPER_CODE), module, lambda: parse_statements(HELPER_CODE, module))

    def apply(self, module: cst.Module) -> cst.Module:
        state = self.inspect(module)
        if state.state == EditState.APPLIED:
            return module
        if state.state in (EditState.OLD, EditState.PARTIAL):
            module = self.remove(module)
            state = self.inspect(module)
        if state.state != EditState.PENDING:
            raise EditFailed(state.detail)
        return self.insert(module)

    def insert(self, module: cst.Module) -> cst.Module:
        _, theirs, _, _ = self._scan(module)
        targets = {id(dec) for _, dec in theirs}

        name = self.name
        ctx = self.ctx
        outer = self

        class _Swap(cst.CSTTransformer):
            # The sentinel of a first decorator goes on the def's leading_lines: that is
            # where the parser puts comments above a decorated definition.
            def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
                if not any(id(d) in targets for d in original.decorators):
                    return updated
                decorators = list(updated.decorators)
                leading = list(updated.leading_lines)
                for i, d in enumerate(original.decorators):
                    if id(d) not in targets:
                        continue
                    was = module.code_for_node(d.with_changes(leading_lines=())).strip()
                    new_code = outer._new_decorator_code(module, was)
                    s = Sentinel(ctx.overlay_id, ctx.version, name, (("was", encode_value(was)),))
                    line = cst.EmptyLine(comment=cst.Comment(s.python()))
                    new_dec = decorators[i].with_changes(decorator=cst.parse_expression(new_code))
                    if i == 0:
                        leading.append(line)
                    else:
                        new_dec = new_dec.with_changes(leading_lines=(line, *new_dec.leading_lines))
                    decorators[i] = new_dec
                return updated.with_changes(decorators=decorators, leading_lines=leading)

        module = module.visit(_Swap())
        helper = mark_block(
            module,
            self._helper_stmts(module),
            Sentinel(ctx.overlay_id, ctx.version, self.helper_edit),
        )
        body: list[cst.BaseStatement] = list(module.body)
        at = _after_imports(body)
        helper[0] = helper[0].with_changes(
            leading_lines=(cst.EmptyLine(), cst.EmptyLine(), *leading_lines(helper[0]))
        )
        body[at:at] = helper
        return module.with_changes(body=body)

    def remove(self, module: cst.Module) -> cst.Module:
        name = self.name
        oid = self.ctx.overlay_id
        _, _, bad, _ = self._scan(module)
        if bad:
            raise EditFailed(
                f"edit {name}: the decorator on {bad[0][0].name.value} was edited after it was written "
                f"(found @{module.code_for_node(bad[0][1].decorator).strip()}); not reverting it by its was= field"
            )
        for mb in find_marked_blocks(module, oid, self.helper_edit):
            if not mb.intact:
                raise EditFailed(block_mismatch(module, mb, None, f"edit {self.helper_edit}"))

        def ours(line: cst.EmptyLine) -> Sentinel | None:
            sen = parse_python(line.comment.value) if line.comment is not None else None
            return sen if sen is not None and sen.overlay == oid and sen.edit == name else None

        def restore(was: str, dec: cst.Decorator) -> cst.Decorator:
            new = _parse_decorator(was)
            return new.with_changes(leading_lines=tuple(ln for ln in dec.leading_lines if ours(ln) is None))

        class _Restore(cst.CSTTransformer):
            def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
                decorators = list(updated.decorators)
                leading = list(updated.leading_lines)
                changed = False
                for i, d in enumerate(decorators):
                    lines = list(d.leading_lines) + (leading if i == 0 else [])
                    found = [(ln, sen) for ln in lines if (sen := ours(ln)) is not None]
                    if not found:
                        continue
                    line, sen = found[0]
                    decorators[i] = restore(decode_value(sen.get("was") or ""), d)
                    leading = [ln for ln in leading if ln is not line]
                    changed = True
                if not changed:
                    return updated
                return updated.with_changes(decorators=decorators, leading_lines=leading)

        module = module.visit(_Restore())
        for mb in reversed(find_marked_blocks(module, oid, self.helper_edit)):
            module = remove_block(module, mb)
        return module


def _parse_decorator(was: str) -> cst.Decorator:
    """The decorator `was` reads as (parsed above a placeholder def); ValueError if it is not one."""
    stmt = cst.parse_module(was + "\ndef _f(): pass\n").body[0]
    if not isinstance(stmt, cst.FunctionDef) or not stmt.decorators:
        raise ValueError(f"not a decorator: {was!r}")
    return stmt.decorators[0]


def _after_imports(body: list[cst.BaseStatement]) -> int:
    """Index just after the module's leading docstring/imports block."""
    at = 0
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.SimpleStatementLine) and all(
            isinstance(s, (cst.Import, cst.ImportFrom)) or (i == 0 and m.matches(s, m.Expr(m.SimpleString())))
            for s in stmt.body
        ):
            at = i + 1
        elif isinstance(stmt, (cst.SimpleStatementLine, cst.If)):
            # `if TYPE_CHECKING:` import blocks and simple constants may interleave; stop at defs
            if isinstance(stmt, cst.If):
                continue
            if any(isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body):
                at = i + 1
            continue
        else:
            break
    return at
