"""Python edit kinds on a libcst Module: insert, dict-entry, set-value, dict-cache.

Each kind inspects a module (-> Inspection), applies itself (-> new Module) and
removes its own sentinel-marked blocks (-> Module). Anchors are statement shapes
inside a scope path and must match exactly once.
"""

from __future__ import annotations

import ast
from typing import Sequence

import libcst as cst

from ..trace import add_guards
from ..sentinel import Sentinel, decode_value, encode_value, parse_python, short_hash
from .base import EditContext, EditFailed, EditState, Inspection
from .pycst import m  # libcst.matchers (imported there, without its signature docstrings)
from .pycst import (
    MarkedBlock,
    ScopeProblem,
    _all_defs,
    block_code,
    find_anchor,
    find_marked_blocks,
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
            return Inspection(EditState.MODIFIED, f"edit {self.name}: v{v} is newer than this catalog's v{self.ctx.version}")
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
    what = f"sentinel n={mb.count} sha={mb.sentinel.get('sha')}, found sha={short_hash(block_code(module, found)) if found else '-'}"
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
    comments = [l.comment.value.strip() for l in stmt.leading_lines if l.comment is not None]
    mine = [c for c in comments if (parse_python(c) or None) == mb.sentinel]
    if not mine:
        return "?"
    for n, line in enumerate(module.code.splitlines(), 1):
        if line.strip() == mine[0]:
            return n
    return "?"


class InsertStatements(PythonEdit):
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
                raise EditFailed(msg if self.spec.code in msg else f"{self.ctx.overlay_dir / self.spec.code}: {msg}") from None
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
            return Inspection(EditState.DRIFT, f"edit {self.name}: anchor not found in {where}: {self.spec.anchor.strip()!r}")
        return Inspection(EditState.DRIFT, f"edit {self.name}: anchor matches {len(sites)} times in {where} (ambiguous)")

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


class _AssignmentEdit(PythonEdit):
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
            if isinstance(el, cst.DictElement):
                if ast.dump(ast.parse(module.code_for_node(el.key).strip(), mode="eval")) == want:
                    return Inspection(EditState.NATIVE, f"edit {self.name}: key {self.spec.key} already in {self.spec.dict_name}")
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
        new[0] = new[0].with_changes(leading_lines=(*new[0].leading_lines, *stmt.leading_lines))
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
            keep = tuple(l for l in stmt.leading_lines if sentinel_of(stmt.with_changes(leading_lines=(l,))) is None)
            body = list(mb.owner.body)  # type: ignore[attr-defined]
            body[mb.index] = restored.with_changes(leading_lines=keep)
            module = replace_body(module, mb.owner, body)
        return module


# --- dict-cache --------------------------------------------------------------------------

HELPER_NAME = "_overlay_dict_cache"
HELPER_CODE = '''
def _overlay_dict_cache(fn=None, *, maxsize=None):
    """Plain-dict memoisation in place of functools.cache / lru_cache.

    Same results, computed once per key (positional and keyword arguments), but
    written in Python so torch.compile / Dynamo can trace through it (the C-level
    _lru_cache_wrapper breaks CUDA-graph capture). With maxsize the oldest entry
    is evicted first (FIFO, not LRU): the bound is kept, the recency order is not.
    """
    if fn is None:
        return lambda f: _overlay_dict_cache(f, maxsize=maxsize)
    import functools as _functools

    _cache = {}
    _kwargs_mark = object()  # keeps f(x=1) apart from f((), (("x", 1),)), as functools does

    @_functools.wraps(fn)
    def _wrapper(*args, **kwargs):
        key = args + (_kwargs_mark, *sorted(kwargs.items())) if kwargs else args
        if key in _cache:
            return _cache[key]
        value = fn(*args, **kwargs)
        if maxsize is not None:
            if maxsize <= 0:  # lru_cache(maxsize=0) caches nothing
                return value
            if len(_cache) >= maxsize:
                _cache.pop(next(iter(_cache)))
        _cache[key] = value
        return value

    _wrapper.cache_clear = _cache.clear
    _wrapper.cache_size = lambda: len(_cache)
    return _wrapper
'''

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
    from .pycst import _defs_in

    wanted = {id(t) for t in targets}
    found: dict[int, str] = {}
    stack: list[tuple[cst.CSTNode, str]] = [(module, "")]
    while stack and len(found) < len(wanted):
        node, prefix = stack.pop()
        for d in _defs_in(node):
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
            return [d for d in _all_defs(module) if isinstance(d, cst.FunctionDef)], []
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
        ours, theirs, bad = [], [], []
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
            dec = cst.parse_module(was + "\ndef _f(): pass\n").body[0].decorators[0]  # type: ignore[attr-defined]
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
            return Inspection(EditState.MODIFIED, f"{tag}: decorator on {bad[0][0].name.value} was edited after it was written")
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
        body = list(module.body)
        at = _after_imports(body)
        helper[0] = helper[0].with_changes(
            leading_lines=(cst.EmptyLine(), cst.EmptyLine(), *helper[0].leading_lines)
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
            new = cst.parse_module(was + "\ndef _f(): pass\n").body[0].decorators[0]  # type: ignore[attr-defined]
            return new.with_changes(leading_lines=tuple(l for l in dec.leading_lines if ours(l) is None))

        class _Restore(cst.CSTTransformer):
            def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
                decorators = list(updated.decorators)
                leading = list(updated.leading_lines)
                changed = False
                for i, d in enumerate(decorators):
                    lines = list(d.leading_lines) + (leading if i == 0 else [])
                    found = [(l, ours(l)) for l in lines if ours(l) is not None]
                    if not found:
                        continue
                    line, sen = found[0]
                    decorators[i] = restore(decode_value(sen.get("was") or ""), d)
                    leading = [l for l in leading if l is not line]
                    changed = True
                if not changed:
                    return updated
                return updated.with_changes(decorators=decorators, leading_lines=leading)

        module = module.visit(_Restore())
        for mb in reversed(find_marked_blocks(module, oid, self.helper_edit)):
            module = remove_block(module, mb)
        return module


def _after_imports(body: list[cst.BaseStatement]) -> int:
    """Index just after the module's leading docstring/imports block."""
    at = 0
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.SimpleStatementLine) and all(
            isinstance(s, (cst.Import, cst.ImportFrom)) or (i == 0 and m.matches(s, m.Expr(m.SimpleString())))
            for s in stmt.body
        ):
            at = i + 1
        elif isinstance(stmt, cst.SimpleStatementLine) or isinstance(stmt, cst.If):
            # `if TYPE_CHECKING:` import blocks and simple constants may interleave; stop at defs
            if isinstance(stmt, cst.If):
                continue
            if any(isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body):
                at = i + 1
            continue
        else:
            break
    return at
