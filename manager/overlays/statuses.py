"""Overlay status from the files alone (no import of the target package): native-fix probes,
the per-target status rules over the edits' states, and the ledger's fast answer when every
recorded hash still matches."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from collections.abc import Iterable, Sequence

from ..catalog import Catalog
from ..errors import OverlayError
from ..fsutil import sha256_bytes
from ..state import ABSENT, warm_records
from .files import Tree, read_regular, resolve_in_root
from .ledger import Ledger
from .loader import Overlay, load_overlays, select
from .model import OverlayStatus, Status, StatusReport, TargetStatus, worst
from .root import package_version


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


def _probe_matches(tree: Tree, probe) -> str | None:
    text = tree.text(probe.target)
    mod = tree.syntax(probe.target)
    if text is None or mod is None:
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
    lines: list[str] = []
    for m in _LINE_RE.finditer(text):
        if len(lines) == end:
            break
        lines.append(m[0])
    if end - 1 == first:
        return lines[first].encode()[col:last_col].decode()
    return "".join([lines[first].encode()[col:].decode(), *lines[first + 1:end - 1],
                    lines[end - 1].encode()[:last_col].decode()])


def _target_status(states: list, details: list[str]) -> tuple[Status, str]:
    from .edits import EditState as S

    vals = [s for s in states if s != S.NOT_APPLICABLE]
    detail = "; ".join(details)
    if not states:
        return "not-applicable", "no edits for this target"
    if not vals:
        return "not-applicable", detail
    if S.MODIFIED in vals:
        return "modified", detail
    if S.PARTIAL in vals or (S.APPLIED in vals and S.PENDING in vals):
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


def edited_since_apply(root: Path, tree: Tree, version: str | None, led: Ledger | None = None) -> dict[str, dict]:
    """Files the ledger recorded for this package version whose bytes are now neither the
    original nor what we wrote: somebody edited them after `overlay apply`. `led`: the ledger
    the caller already loaded (an apply under its lock), else read here."""
    if led is None:
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


def _text_or_empty(tree: Tree, rel: str) -> str:
    """For a quick look (is our sentinel there?): a file that cannot be read is reported by the
    edit inspection that follows, with its reason."""
    try:
        return tree.text(rel) or ""
    except OverlayError:
        return ""


def overlay_status(
    overlay: Overlay, tree: Tree, version: str | None, edited: dict[str, dict] | None = None
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
    from .edits import EditFailed

    for t in m.targets:
        try:
            edits = overlay.make_edits(t)
            exists = tree.read(t) is not None
            if not exists and not any(e.spec.kind in ("new-file", "release-file") for e in edits):
                targets.append(TargetStatus(t, "missing-target", f"{t} does not exist under the root"))
                continue
            states, details = [], []
            for e in edits:
                res = e.inspect(tree.module(t) if e.language == "python" else tree.text(t))
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
        except RecursionError:  # valid Python libcst cannot walk (a 600-term sum): an error, not a crash
            status, detail = "error", f"{t}: code nested too deeply for libcst (RecursionError); cannot be edited"
        targets.append(TargetStatus(t, status, detail))
    statuses = [x.status for x in targets]
    overall = worst(statuses)
    if "applied" in statuses and "pending" in statuses and overall == "pending":
        overall = "partial"
    return OverlayStatus(overlay.id, overall, tuple(targets), m.title, m.sentinel_version)


def ledger_fast_status(overlays: Sequence[Overlay], root: Path, version: str | None,
                       led: Ledger | None = None) -> StatusReport | None:
    """Statuses straight from the ledger when every target's hash and every manifest digest match.
    `led`: the ledger the caller already loaded (an apply under its lock), else read here."""
    if led is None:
        try:
            led = Ledger.load(root)
        except OverlayError:
            return None
    digests = {o.id: o.digest for o in overlays}
    targets = {o.id: o.manifest.targets for o in overlays}

    def sha_of(rel: str) -> str | None:
        try:
            data = read_regular(resolve_in_root(root, rel), rel)
        except OverlayError:
            return None  # the full status says what is wrong with it
        return ABSENT if data is None else sha256_bytes(data)

    found = warm_records(led.data, version, led.journal_path.exists(), [o.id for o in overlays], digests.get,
                         sha_of, targets_of=targets.__getitem__)
    if found is None:
        return None
    out = [OverlayStatus(o.id, rec["status"], tuple(TargetStatus(**t) for t in rec["targets"]),  # type: ignore[arg-type]
                         o.manifest.title, o.manifest.sentinel_version)
           for o, (_, rec) in zip(overlays, found, strict=True)]
    return StatusReport(str(root), version, tuple(out), source="ledger")


def status(overlays: Sequence[Overlay], root: Path, *, use_ledger: bool = True) -> StatusReport:
    version = package_version(root)
    if use_ledger:
        fast = ledger_fast_status(overlays, root, version)
        if fast is not None:
            return fast
    tree = Tree(root)
    edited = edited_since_apply(root, tree, version) if use_ledger else {}
    interrupted = ""
    if use_ledger and Ledger(root).has_journal():
        interrupted = (
            f"{Ledger(root).journal_path}: an apply was interrupted; `overlay apply` completes it, "
            "`overlay revert` undoes it"
        )
    return StatusReport(
        str(root), version, tuple(overlay_status(o, tree, version, edited) for o in overlays), interrupted=interrupted
    )


def status_on_release(version: str, catalog: Catalog, ids: Iterable[str] | None = None) -> StatusReport:
    """Read-only status of the catalog's overlays on a real release's pristine sources."""
    from ..releases import pristine_tree

    root = pristine_tree(version)
    return status(select(load_overlays(catalog), ids), root, use_ledger=False)
