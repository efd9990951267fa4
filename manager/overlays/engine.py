"""The overlay engine: load overlays, compute status, and apply/revert transactionally.

Status is computed from the files alone (no import of the target package). An
apply computes every new text in memory, compile()s each, then writes each file
atomically and the ledger last; any failure before the writes leaves the tree
untouched. A file lock serialises concurrent applies on one root.
"""

from __future__ import annotations

import ast
import difflib
import io
import os
import re
import stat
import time
import tokenize
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Iterable, Sequence

from ..catalog import Catalog
from ..errors import OverlayError
from ..fsutil import atomic_write, clean_temp_files, sha256_bytes
from .ledger import ABSENT, STATE_DIR, Ledger, check_rel_path, state_dir
from .manifest import Manifest, load_manifest, manifest_digest
from .model import (
    ApplyResult,
    FileChange,
    OverlayStatus,
    RevertResult,
    StatusReport,
    TargetStatus,
    worst,
)
from .root import package_version

# Overlay statuses that `apply` skips (nothing to write) and those it refuses.
_SKIP = {"applied", "upstream", "not-applicable"}
_SKIP_UNLESS_NAMED = {"superseded", "missing-target"}
_WRITE_DELAY_ENV = "OVERLAY_TEST_WRITE_DELAY"  # tests: seconds to sleep before each file write


@dataclass(frozen=True)
class Overlay:
    manifest: Manifest
    dir: Path

    @property
    def id(self) -> str:
        return self.manifest.id

    @cached_property
    def digest(self) -> str:
        return manifest_digest(self.dir)

    def edit_specs(self, target: str) -> list:
        """The manifest edits for one target (an edit without `target` serves every target)."""
        return [e for e in self.manifest.edits if e.target in (None, target)]

    def make_edits(self, target: str) -> list:
        from .edits import EditContext, make_edit

        ctx = EditContext(self.id, self.manifest.sentinel_version, self.dir)
        return [make_edit(spec, ctx, target) for spec in self.edit_specs(target)]


def load_overlays(catalog: Catalog) -> list[Overlay]:
    """Every overlay of the catalog, sorted by id; all manifest errors reported together."""
    base = catalog.overlays_dir
    if not base.is_dir():
        return []
    overlays, errors = [], []
    for d in sorted(p for p in base.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
        mf = d / "overlay.yaml"
        if not mf.exists():
            continue
        try:
            overlays.append(Overlay(load_manifest(mf), d))
        except OverlayError as exc:
            errors.append(str(exc))
    if errors:
        raise OverlayError("; ".join(errors))
    known = {o.id for o in overlays}
    for o in overlays:
        for r in o.manifest.requires:
            if r not in known:
                raise OverlayError(f"{o.dir / 'overlay.yaml'}: requires: unknown overlay {r!r}")
    return _ordered(overlays)


def _ordered(overlays: list[Overlay]) -> list[Overlay]:
    """Dependencies (`requires`) first, otherwise by id."""
    by_id = {o.id: o for o in overlays}
    out: list[Overlay] = []
    seen: set[str] = set()

    def visit(o: Overlay, stack: tuple[str, ...]) -> None:
        if o.id in seen:
            return
        if o.id in stack:
            raise OverlayError(f"overlay requires cycle: {' -> '.join(stack + (o.id,))}")
        for r in o.manifest.requires:
            visit(by_id[r], stack + (o.id,))
        seen.add(o.id)
        out.append(o)

    for o in sorted(overlays, key=lambda x: x.id):
        visit(o, ())
    return out


def select(overlays: Sequence[Overlay], ids: Iterable[str] | None) -> list[Overlay]:
    ids = list(ids or [])
    if not ids:
        return list(overlays)
    by_id = {o.id: o for o in overlays}
    unknown = [i for i in ids if i not in by_id]
    if unknown:
        raise OverlayError(f"unknown overlay {unknown[0]!r} (known: {', '.join(sorted(by_id)) or 'none'})")
    wanted = set(ids)
    # a selected overlay brings the ones it requires
    changed = True
    while changed:
        changed = False
        for i in list(wanted):
            for r in by_id[i].manifest.requires:
                if r not in wanted:
                    wanted.add(r)
                    changed = True
    return [o for o in overlays if o.id in wanted]


# --- files ---------------------------------------------------------------------------------


def read_regular(path: Path, rel: str) -> bytes | None:
    """The bytes of a regular file; None when it does not exist. Anything else (a directory, a
    FIFO, a device, a socket) is refused before a read can block: opened non-blocking, fstat()ed."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise OverlayError(f"{rel}: cannot read: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise OverlayError(f"{rel}: is a directory, not a regular file")
        if not stat.S_ISREG(st.st_mode):
            raise OverlayError(f"{rel}: not a regular file ({_KINDS.get(stat.S_IFMT(st.st_mode), 'special file')}); refused")
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise OverlayError(f"{rel}: cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)


_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket"}



def nul_line(text: str) -> int:
    return text.count("\n", 0, text.index("\0")) + 1


def resolve_in_root(root: Path, rel: str) -> Path:
    """The real path of `root/rel` (symlinks followed); refused unless it stays inside the root.

    Every target the engine reads or writes goes through here: a target behind a directory or
    file symlink that leaves the root, or a `..`/absolute path (a hand-edited ledger), is refused
    with one line naming it. A file symlink that stays inside the root resolves to its target,
    so writes land there and the link is kept."""
    why = check_rel_path(rel)
    if why:
        raise OverlayError(f"{rel!r}: {why}; refused: only paths inside the root {root} are read or written")
    base = Path(root).resolve()
    real = (base / rel).resolve()
    if real != base and base not in real.parents:
        raise OverlayError(f"{Path(root) / rel}: resolves to {real}, outside the root {base}; refused")
    return real


def file_encoding(rel: str, data: bytes) -> str:
    """The codec that gives `data` back byte for byte: utf-8-sig for a BOM, a Python file's
    coding declaration, else utf-8. Line endings are never translated."""
    if rel.endswith(".py"):
        try:
            enc, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        except SyntaxError as exc:
            raise OverlayError(f"{rel}: {exc}") from None
        return enc
    return "utf-8-sig" if data.startswith(b"\xef\xbb\xbf") else "utf-8"


def decode_file(rel: str, data: bytes) -> tuple[str, str]:
    """(text, codec) of a source file, or one line naming the file, the line and the problem
    (bytes its codec cannot read, a NUL byte)."""
    enc = file_encoding(rel, data)
    try:
        text = data.decode(enc)
    except LookupError as exc:
        raise OverlayError(f"{rel}: cannot be read as {enc}: {exc}") from None
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        label = "UTF-8" if enc.startswith("utf-8") else enc
        raise OverlayError(
            f"{rel}: line {line}: not {label} (byte 0x{data[exc.start]:02x}); a file in another encoding "
            f"needs a coding declaration naming it"
        ) from None
    if "\0" in text:
        raise OverlayError(f"{rel}: line {nul_line(text)}: contains a NUL byte; not a source file")
    return text, enc


def encode_file(rel: str, text: str, enc: str) -> bytes:
    try:
        return text.encode(enc)
    except (UnicodeEncodeError, LookupError) as exc:
        raise OverlayError(f"{rel}: the patched text cannot be written back as {enc}: {exc}") from None


class _Tree:
    """Reads target files once per operation and keeps their parsed modules."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._bytes: dict[str, bytes | None] = {}
        self._modules: dict[str, object] = {}
        self._enc: dict[str, str] = {}

    def read(self, rel: str) -> bytes | None:
        if rel not in self._bytes:
            self._bytes[rel] = read_regular(resolve_in_root(self.root, rel), rel)
        return self._bytes[rel]

    def text(self, rel: str) -> str | None:
        data = self.read(rel)
        if data is None:
            return None
        text, self._enc[rel] = decode_file(rel, data)
        return text

    def encode(self, rel: str, text: str | None) -> bytes | None:
        """`text` as bytes in the file's own encoding (BOM and coding declaration kept)."""
        if text is None:
            return None
        if rel not in self._enc and self.read(rel) is not None:
            self.text(rel)
        return encode_file(rel, text, self._enc.get(rel, "utf-8"))

    def module(self, rel: str):
        if rel not in self._modules:
            import libcst as cst

            text = self.text(rel)
            try:
                self._modules[rel] = cst.parse_module(text) if text is not None else None
            except cst.ParserSyntaxError as exc:
                raise OverlayError(f"{rel}: does not parse as Python: {exc.message}") from None
        return self._modules[rel]

    def sha(self, rel: str) -> str:
        data = self.read(rel)
        return ABSENT if data is None else sha256_bytes(data)

    def replace(self, rel: str, data: bytes | None, module: object | None) -> None:
        """Record bytes just written (and their module, when the plan built it)."""
        self._bytes[rel] = data
        if module is not None:
            self._modules[rel] = module
        else:
            self._modules.pop(rel, None)


# --- status --------------------------------------------------------------------------------


_AST_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _statements(node: ast.AST) -> list[ast.AST]:
    """`node` and every statement below it, at any depth (what `ast.walk` yields that can be a
    def or a class: those are statements only, so expressions, most of a module's nodes, are
    not walked)."""
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        out.append(n)
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            value = getattr(n, name, None)
            if isinstance(value, list):
                stack.extend(v for v in value if isinstance(v, ast.AST))
    return out


def _probe_matches(tree: _Tree, probe) -> str | None:
    text = tree.text(probe.target)
    if text is None:
        return None
    try:
        mod = ast.parse(text)
    except SyntaxError:
        return None
    node: ast.AST = mod
    for part in [p for p in (probe.scope or "").split(".") if p]:
        found = [n for n in _statements(node) if isinstance(n, _AST_DEFS) and n.name == part]
        if len(found) != 1:
            return None
        node = found[0]
    if probe.defines:
        names = set()
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                names.add(n.id)
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(n.name)
            elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
                names.add(n.attr)
        if probe.defines not in names:
            return None
    if probe.contains:
        segment = text if node is mod else source_segment(text, node)
        from .bounded import search

        if not search(probe.contains, segment, probe.target):
            return None
    where = f"{probe.target}:{probe.scope}" if probe.scope else probe.target
    what = probe.description or (f"defines {probe.defines}" if probe.defines else f"matches /{probe.contains}/")
    return f"native fix found ({what}) in {where}"


_LINE_RE = re.compile(r"(.*?(?:\r\n|\n|\r|$))")  # a source line as the parser counts them (not at \f)


def source_segment(text: str, node: ast.AST) -> str:
    """`ast.get_source_segment(text, node) or ""`, splitting only the lines up to the node's end.

    Before Python 3.12 get_source_segment splits the whole file into lines one character at a
    time in Python (~15-40 ms for gemma4.py, on every status of a probe with `contains`); this is
    3.12's split (a regex, stopping at end_lineno) with the same slicing (offsets in UTF-8 bytes)."""
    end, last_col = getattr(node, "end_lineno", None), getattr(node, "end_col_offset", None)
    if end is None or last_col is None:
        return ""
    first, col = node.lineno - 1, node.col_offset  # type: ignore[attr-defined]
    lines = []
    for m in _LINE_RE.finditer(text):
        if len(lines) == end:
            break
        lines.append(m[0])
    if end - 1 == first:
        return lines[first].encode()[col:last_col].decode()
    return "".join([lines[first].encode()[col:].decode(), *lines[first + 1:end - 1],
                    lines[end - 1].encode()[:last_col].decode()])


def _target_status(states: list, details: list[str]) -> tuple[str, str]:
    from .edits import EditState as S

    vals = [s for s in states if s != S.NOT_APPLICABLE]
    detail = "; ".join(details)
    if not states:
        return "not-applicable", "no edits for this target"
    if not vals:
        return "not-applicable", detail
    if S.MODIFIED in vals:
        return "modified", detail
    if S.PARTIAL in vals or (S.APPLIED in vals and (S.PENDING in vals or S.NATIVE in vals and S.PENDING in vals)):
        return "partial", detail
    if S.DRIFT in vals:
        return "drift", detail
    if S.SUPERSEDED in vals:
        return ("superseded" if all(v == S.SUPERSEDED for v in vals) else "drift"), detail
    if all(v == S.NATIVE for v in vals):
        return "upstream", detail
    if all(v in (S.APPLIED, S.NATIVE) for v in vals):
        return "applied", detail
    return "pending", detail


def _edited_since_apply(root: Path, tree: _Tree, version: str | None) -> dict[str, dict]:
    """Files the ledger recorded for this package version whose bytes are now neither the
    original nor what we wrote: somebody edited them after `overlay apply`."""
    try:
        led = Ledger.load(root)
    except OverlayError:
        return {}
    if not led.data or led.data.get("package_version") != version:
        return {}
    out = {}
    for rel, rec in led.files.items():
        try:
            now = tree.sha(rel)
        except OverlayError:
            continue  # unreadable: the target's own status says why
        if now not in (rec["post_sha256"], rec["base_sha256"]):
            out[rel] = {"overlays": rec["overlays"], "now": now, "post": rec["post_sha256"]}
    return out


def _text_or_empty(tree: _Tree, rel: str) -> str:
    """For a quick look (is our sentinel there?): a file that cannot be read is reported by the
    edit inspection that follows, with its reason."""
    try:
        return tree.text(rel) or ""
    except OverlayError:
        return ""


def _overlay_status(
    overlay: Overlay, tree: _Tree, version: str | None, edited: dict[str, dict] | None = None
) -> OverlayStatus:
    """`edited`: files changed by hand since apply (from the ledger). Where the ledger says this
    overlay was applied and its blocks are now incomplete, the target is `modified`: applying
    again could insert a second copy next to code whose sentinel was removed."""
    m = overlay.manifest
    marker = f"overlay:{overlay.id} v"
    targets: list[TargetStatus] = []
    ours_present = any(marker in _text_or_empty(tree, t) for t in m.targets)
    if not ours_present and not m.applies_to_version(version):
        targets = [
            TargetStatus(t, "not-applicable", f"vllm {version} is outside versions {m.versions!r}") for t in m.targets
        ]
        return OverlayStatus(overlay.id, "not-applicable", tuple(targets), m.title, m.sentinel_version)
    if not ours_present:
        for probe in m.probes:
            try:
                hit = _probe_matches(tree, probe)
            except OverlayError as exc:  # unreadable probe target, a probe pattern over its budget
                targets = [TargetStatus(t, "error", f"probe: {exc}") for t in m.targets]
                return OverlayStatus(overlay.id, "error", tuple(targets), m.title, m.sentinel_version)
            if hit:
                targets = [TargetStatus(t, "upstream", hit) for t in m.targets]
                return OverlayStatus(overlay.id, "upstream", tuple(targets), m.title, m.sentinel_version)
    from .edits import EditFailed, PythonEdit

    for t in m.targets:
        try:
            edits = overlay.make_edits(t)
            exists = tree.read(t) is not None
            if not exists and not any(e.spec.kind in ("new-file", "release-file") for e in edits):
                targets.append(TargetStatus(t, "missing-target", f"{t} does not exist under the root"))
                continue
            states, details = [], []
            for e in edits:
                res = e.inspect(tree.module(t)) if isinstance(e, PythonEdit) else e.inspect(tree.text(t))
                states.append(res.state)
                details.append(res.detail)
            status, detail = _target_status(states, details)
            hand = (edited or {}).get(t)
            if hand and overlay.id in hand["overlays"] and status in ("pending", "partial"):
                status, detail = "modified", (
                    f"the ledger records {overlay.id} applied to {t}, which changed since (sha256 "
                    f"{hand['now'][:12]}, wrote {hand['post'][:12]}) and lost some of its blocks; reinstall "
                    f"the file before applying again ({detail})"
                )
        except (EditFailed, OverlayError, UnicodeDecodeError) as exc:
            status, detail = "error", str(exc)
        targets.append(TargetStatus(t, status, detail))
    statuses = [x.status for x in targets]
    overall = worst(statuses)
    if "applied" in statuses and "pending" in statuses and overall == "pending":
        overall = "partial"
    return OverlayStatus(overlay.id, overall, tuple(targets), m.title, m.sentinel_version)


def _ledger_fast_status(overlays: Sequence[Overlay], root: Path, version: str | None) -> StatusReport | None:
    """Statuses straight from the ledger when every target's hash and every manifest digest match."""
    try:
        led = Ledger.load(root)
    except OverlayError:
        return None
    if not led.data or led.data.get("package_version") != version or led.journal_path.exists():
        return None
    out = []
    for o in overlays:
        rec = led.overlays.get(o.id)
        if not rec or rec.get("digest") != o.digest:
            return None
        for t in o.manifest.targets:
            want = led.observed.get(t)
            if want is None:
                return None
            try:
                data = read_regular(resolve_in_root(root, t), t)
            except OverlayError:
                return None  # the full status says what is wrong with it
            now = ABSENT if data is None else sha256_bytes(data)
            if now != want:
                return None
        targets = tuple(TargetStatus(**t) for t in rec["targets"])
        out.append(OverlayStatus(o.id, rec["status"], targets, o.manifest.title, o.manifest.sentinel_version))
    return StatusReport(str(root), version, tuple(out), source="ledger")


def status(overlays: Sequence[Overlay], root: Path, *, use_ledger: bool = True) -> StatusReport:
    version = package_version(root)
    if use_ledger:
        fast = _ledger_fast_status(overlays, root, version)
        if fast is not None:
            return fast
    tree = _Tree(root)
    edited = _edited_since_apply(root, tree, version) if use_ledger else {}
    interrupted = ""
    if use_ledger and Ledger(root).has_journal():
        interrupted = (
            f"{Ledger(root).journal_path}: an apply was interrupted; `overlay apply` completes it, "
            "`overlay revert` undoes it"
        )
    return StatusReport(
        str(root), version, tuple(_overlay_status(o, tree, version, edited) for o in overlays), interrupted=interrupted
    )


def status_on_release(version: str, catalog: Catalog, ids: Iterable[str] | None = None) -> StatusReport:
    """Read-only status of the catalog's overlays on a real release's pristine sources."""
    from ..releases import pristine_tree

    root = pristine_tree(version)
    return status(select(load_overlays(catalog), ids), root, use_ledger=False)


# --- planning ------------------------------------------------------------------------------


@dataclass
class _Plan:
    root: Path
    version: str | None
    report: StatusReport
    tree: "_Tree | None" = None  # the files as read (and parsed) for this plan
    texts: dict[str, str | None] = field(default_factory=dict)  # new text per file
    modules: dict[str, object] = field(default_factory=dict)  # the new text's libcst module, when built
    overlays_by_file: dict[str, list[str]] = field(default_factory=dict)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def _apply_edits(overlay: Overlay, rel: str, text: str | None, tree_module=None):
    """Apply one overlay's edits for `rel` on `text`; returns (new text, its libcst module or None)."""
    import libcst as cst

    from .edits import EditFailed, PythonEdit

    edits = overlay.make_edits(rel)
    module = None
    for e in edits:
        try:
            if isinstance(e, PythonEdit):
                if module is None:
                    if text is None:
                        raise EditFailed(f"{rel} does not exist")
                    module = tree_module if tree_module is not None else cst.parse_module(text)
                module = e.apply(module)
            else:
                if module is not None:
                    text, module = module.code, None
                text = e.apply(text)
        except EditFailed as exc:
            raise OverlayError(f"overlay {overlay.id}: {rel}: {exc}") from None
    if module is not None:
        text = module.code
    return text, module


def _check_compiles(rel: str, text: str | None, who: list[str]) -> None:
    if text is None or not rel.endswith(".py"):
        return
    if "\0" in text:
        raise OverlayError(f"overlay {', '.join(who)}: {rel}: line {nul_line(text)}: patched code contains a NUL byte")
    try:
        compile(text, rel, "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise OverlayError(
            f"overlay {', '.join(who)}: {rel}: patched code does not compile: {exc.msg} (line {exc.lineno})"
        ) from None


def _plan(overlays: Sequence[Overlay], root: Path, explicit: bool) -> _Plan:
    tree = _Tree(root)
    version = package_version(root)
    edited = _edited_since_apply(root, tree, version)
    report = StatusReport(str(root), version, tuple(_overlay_status(o, tree, version, edited) for o in overlays))
    plan = _Plan(root, version, report, tree)
    for o, st in zip(overlays, report.overlays):
        if st.status in _SKIP:
            continue
        if st.status in _SKIP_UNLESS_NAMED and not explicit:
            plan.skipped.append((o.id, f"{st.status}: {st.detail}"))
            continue
        if st.status not in ("pending", "partial"):
            bad = next((t for t in st.targets if t.status == st.status), None)
            where = bad.path if bad else "?"
            raise OverlayError(f"overlay {o.id}: {where}: {st.status}: {bad.detail if bad else ''}".rstrip(": "))
        for t in st.targets:
            if t.status not in ("pending", "partial"):
                continue
            if t.path in plan.texts:
                current, module = plan.texts[t.path], plan.modules.get(t.path)
            else:
                current = tree.text(t.path)
                module = tree.module(t.path) if t.path.endswith(".py") and current is not None else None
            plan.texts[t.path], plan.modules[t.path] = _apply_edits(o, t.path, current, module)
            plan.overlays_by_file.setdefault(t.path, []).append(o.id)
    for rel, text in plan.texts.items():
        _check_compiles(rel, text, plan.overlays_by_file[rel])
    return plan


def _changes(plan: _Plan, tree_read) -> list[FileChange]:
    out = []
    for rel, text in sorted(plan.texts.items()):
        before = tree_read(rel)
        after = plan.tree.encode(rel, text)
        if before != after:
            out.append(FileChange(rel, before, after, tuple(plan.overlays_by_file[rel])))
    return out


def _drop_bytecode(root: Path, rel: str) -> None:
    p = root / rel
    if p.suffix != ".py":
        return
    cache = p.parent / "__pycache__"
    if cache.is_dir():
        for pyc in cache.glob(f"{p.stem}.*.pyc"):
            try:
                pyc.unlink()
            except FileNotFoundError:
                pass


def _lock(root: Path, wait: float = 600.0, on_wait=None):
    """The root's lock (manager.overlays.lock): names its holder, waits visibly, at most `wait` s."""
    from .lock import root_lock

    resolve_in_root(root, STATE_DIR)  # a state directory symlinked out of the root is refused
    return root_lock(state_dir(root), wait, on_wait)


def _put(root: Path, rel: str, data: bytes | None) -> None:
    """Write (or delete, for None) one target, through a file symlink that stays inside the root."""
    p = resolve_in_root(root, rel)
    if data is None:
        if (Path(root) / rel).is_symlink():
            raise OverlayError(f"{rel}: is a symlink; refusing to delete it or its target")
        try:
            p.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise OverlayError(f"{rel}: cannot delete: {exc.strerror}") from None
    else:
        try:
            atomic_write(p, data)
        except OSError as exc:
            raise OverlayError(f"{rel}: cannot write: {exc.strerror}") from None
    _drop_bytecode(root, rel)


def _write(root: Path, changes: Sequence[FileChange], led: Ledger, *, journaled: bool = False) -> None:
    """Write every change; when one fails, put back the ones already written (all or nothing).

    `journaled` (apply): the journal written for these changes is removed after a clean roll-back;
    it stays on disk only if the roll-back itself failed (the next run then sorts it out)."""
    delay = float(os.environ.get(_WRITE_DELAY_ENV, "0") or 0)
    done: list[FileChange] = []
    try:
        for c in changes:
            if delay:  # tests: also between the journal and the first write (the journal window)
                time.sleep(delay)
            _put(root, c.path, c.after)
            done.append(c)
    except OverlayError as exc:
        stuck = []
        for c in reversed(done):
            try:
                _put(root, c.path, c.before)
            except OverlayError as back:
                stuck.append(str(back))
        if stuck:
            raise OverlayError(
                f"{exc}; rolling back the {len(done)} file(s) already written failed ({'; '.join(stuck)}); "
                f"{led.journal_path} records them"
            ) from None
        if journaled:
            led.clear_journal()
        raise OverlayError(f"{exc}; nothing changed (rolled back {len(done)} file(s) already written)") from None


def _clean_litter(root: Path, rels: Iterable[str]) -> list[str]:
    """Delete the temp files a killed run left next to the targets and in the state directory."""
    dirs = {state_dir(root), state_dir(root) / "originals"}
    legacy: dict[Path, set[str]] = {}
    for rel in rels:
        try:
            parent = resolve_in_root(root, rel).parent
        except OverlayError:
            continue  # refused later, where it is read
        dirs.add(parent)
        legacy.setdefault(parent, set()).add(Path(rel).name)
    removed = [p for d in sorted(dirs) for p in clean_temp_files(d)]
    # overlay-manager 0.1.0 named them `.<target>.<8 random>.tmp`: only those of our targets go
    for d, names in legacy.items():
        for name in names:
            for p in d.glob(f".{glob_escape(name)}.*.tmp"):
                mid = p.name[len(name) + 2 : -4]
                if re.fullmatch(r"[a-z0-9_]{8}", mid) and p.is_file() and not p.is_symlink():
                    p.unlink()
                    removed.append(p)
    base = Path(root).resolve()
    return [f"removed {p.relative_to(base) if base in p.parents else p}, left by an interrupted run" for p in removed]


def glob_escape(name: str) -> str:
    import glob

    return glob.escape(name)


def _record(led: Ledger, overlays: Sequence[Overlay], root: Path, tree: "_Tree") -> StatusReport:
    """Recompute status after writing and store it (with every target's hash) in the ledger.

    `tree` holds the bytes (and parsed modules) just written, so nothing is parsed twice."""
    version = package_version(root)
    report = StatusReport(str(root), version, tuple(_overlay_status(o, tree, version) for o in overlays))
    for o, st in zip(overlays, report.overlays):
        led.overlays[o.id] = {
            "version": o.manifest.sentinel_version,
            "requires": list(o.manifest.requires),
            "digest": o.digest,
            "status": st.status,
            "targets": [{"path": t.path, "status": t.status, "detail": t.detail} for t in st.targets],
        }
        for t in o.manifest.targets:
            led.observed[t] = tree.sha(t)
    return report


def apply(
    overlays: Sequence[Overlay], root: Path, *, dry_run: bool = False, explicit: bool = False,
    wait: float = 600.0, on_wait=None,
) -> ApplyResult:
    """Apply the overlays transactionally. `explicit`: the user named them (superseded is then an error).
    `wait`: seconds to wait for a lock another run holds (`on_wait(message)` is told once)."""
    version = package_version(root)
    if dry_run:
        plan = _plan(overlays, root, explicit)
        changes = _changes(plan, plan.tree.read)
        return ApplyResult(str(root), version, tuple(changes), plan.report, tuple(plan.skipped), dry_run=True)
    with _lock(root, wait, on_wait):
        led = Ledger.load(root)
        notes = led.recover(lambda rel: _Tree(root).sha(rel))
        notes += _clean_litter(root, [t for o in overlays for t in o.manifest.targets] + list(led.files))
        if not notes:
            fast = _ledger_fast_status(overlays, root, version)
            quiet = _SKIP if explicit else _SKIP | _SKIP_UNLESS_NAMED
            if fast is not None and all(o.status in quiet for o in fast.overlays):
                skipped = tuple((o.id, f"{o.status}: {o.detail}") for o in fast.overlays if o.status not in _SKIP)
                return ApplyResult(str(root), version, (), fast, skipped, fast_path=True)
        plan = _plan(overlays, root, explicit)
        tree = plan.tree
        changes = _changes(plan, tree.read)
        if changes:
            journal = {}
            for c in changes:
                rec = led.files.get(c.path)
                base = rec["base_sha256"] if rec else (ABSENT if c.before is None else led.store_original(c.before))
                prior = dict(rec["overlays"]) if rec else {}
                prior.update({i: next(o.manifest.sentinel_version for o in overlays if o.id == i) for i in c.overlays})
                journal[c.path] = {
                    "base_sha256": base,
                    "pre_sha256": ABSENT if c.before is None else sha256_bytes(c.before),
                    "post_sha256": ABSENT if c.after is None else sha256_bytes(c.after),
                    "overlays": prior,
                }
            led.write_journal(journal)
            _write(root, changes, led, journaled=True)
            for rel, e in journal.items():
                led.files[rel] = {k: e[k] for k in ("base_sha256", "post_sha256", "overlays")}
            for c in changes:  # the tree now holds what was written (no second read or parse)
                tree.replace(c.path, c.after, plan.modules.get(c.path))
        report = _record(led, overlays, root, tree)
        led.save(version)
        led.clear_journal()
        return ApplyResult(str(root), version, tuple(changes), report, tuple(plan.skipped), tuple(notes))


def diff(overlays: Sequence[Overlay], root: Path, explicit: bool = False) -> str:
    result = apply(overlays, root, dry_run=True, explicit=explicit)
    return unified_diff(result.changes)


def unified_diff(changes: Sequence[FileChange]) -> str:
    out = []
    for c in changes:
        a = (c.before or b"").decode("utf-8", "replace").splitlines(keepends=True)
        b = (c.after or b"").decode("utf-8", "replace").splitlines(keepends=True)
        out.extend(
            difflib.unified_diff(
                a, b, fromfile="a/" + c.path if c.before is not None else "/dev/null",
                tofile="b/" + c.path if c.after is not None else "/dev/null",
            )
        )
    return "".join(out)


# --- revert --------------------------------------------------------------------------------


def revert(
    overlays: Sequence[Overlay], all_overlays: Sequence[Overlay], root: Path, *, wait: float = 600.0, on_wait=None
) -> RevertResult:
    """Restore original bytes for the selected overlays' files.

    A file recorded in the ledger is restored only while it still has its recorded
    post hash (otherwise: refused, with why); overlays that stay applied on that file
    are re-applied on the original bytes. A file not in the ledger is touched only
    where it carries our sentinels (the blocks are removed); never otherwise.
    """
    selected = {o.id for o in overlays}
    by_id = {o.id: o for o in all_overlays}
    version = package_version(root)
    with _lock(root, wait, on_wait):
        led = Ledger.load(root)
        notes = led.recover(lambda rel: _Tree(root).sha(rel))
        notes += _clean_litter(root, [t for o in overlays for t in o.manifest.targets] + list(led.files))
        tree = _Tree(root)
        texts: dict[str, str | None] = {}
        encodings: dict[str, str] = {}  # files restored from the originals store: their codec
        owners: dict[str, list[str]] = {}
        for rel, rec in sorted(led.files.items()):
            mine = [i for i in rec["overlays"] if i in selected]
            if not mine:
                continue
            now = tree.sha(rel)
            if now == rec["base_sha256"] and now != rec["post_sha256"]:
                notes.append(f"{rel}: already has its original bytes (reinstalled?)")
            elif now != rec["post_sha256"]:
                raise OverlayError(
                    f"revert refused: {rel} changed since overlay apply (sha256 {now[:12]} != recorded "
                    f"{rec['post_sha256'][:12]}); reinstall the package or restore the file first"
                )
            base = led.original(rec["base_sha256"])
            text, enc = (None, "utf-8") if base is None else decode_file(rel, base)
            for i in rec["overlays"]:
                if i in selected:
                    continue
                if i not in by_id:
                    raise OverlayError(f"revert refused: {rel} also carries overlay {i!r}, which is not in the catalog")
                text, _ = _apply_edits(by_id[i], rel, text)
            texts[rel] = text
            encodings[rel] = enc
            owners[rel] = mine
        # files not in the ledger that carry our sentinels
        for o in overlays:
            for t in o.manifest.targets:
                if t in led.files or t in texts:
                    continue
                current = tree.text(t)
                if current is None or f"overlay:{o.id} v" not in current:
                    continue
                text = current
                module = None
                from .edits import EditFailed, PythonEdit

                try:
                    for e in o.make_edits(t):
                        if isinstance(e, PythonEdit):
                            import libcst as cst

                            module = module or cst.parse_module(text)
                            module = e.remove(module)
                        else:
                            if module is not None:
                                text, module = module.code, None
                            text = e.remove(text)
                except EditFailed as exc:  # a block that is not intact is never removed by count
                    raise OverlayError(f"revert refused: {t}: {exc}; restore the file first") from None
                if module is not None:
                    text = module.code
                texts[t] = text
                owners.setdefault(t, []).append(o.id)
                notes.append(f"{t}: not in the ledger; removed sentinel-marked blocks of {o.id}")
        for rel, text in texts.items():
            _check_compiles(rel, text, owners[rel])
        changes = []
        for rel, text in sorted(texts.items()):
            before = tree.read(rel)
            after = encode_file(rel, text, encodings[rel]) if rel in encodings and text is not None else tree.encode(rel, text)
            if before != after:
                changes.append(FileChange(rel, before, after, tuple(owners[rel])))
        _write(root, changes, led)
        for rel in texts:
            rec = led.files.get(rel)
            if rec is None:
                continue
            remaining = {i: v for i, v in rec["overlays"].items() if i not in selected}
            if remaining:
                rec["overlays"] = remaining
                written = next((c.after for c in changes if c.path == rel), tree.read(rel))
                rec["post_sha256"] = sha256_bytes(written) if written is not None else ABSENT
            else:
                del led.files[rel]
        for i in selected:
            led.overlays.pop(i, None)
        for o in overlays:
            for t in o.manifest.targets:
                led.observed.pop(t, None)
        led.save(version)
        led.clear_journal()  # recover() folded it into the ledger just saved
        return RevertResult(str(root), tuple(changes), tuple(notes))
