"""Plan, apply, diff and revert overlays transactionally.

An apply computes every new text in memory (one edit loop, `_run_edits`, serves apply and the
sentinel-block removal of revert), compile()s each, then writes the files through the one write
set (manager.overlays.writeset: staged, fsynced together, replaced in order) and the ledger last;
any failure before the replaces leaves the tree untouched, a failure part-way puts back the files
already replaced, byte-exact. A file lock serialises concurrent applies on one root.

Size: over 500 lines: apply and revert share the plan, the write/roll-back loop, the
journal and the litter clean-up; split apart they would share those through private names.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from ..errors import OverlayError
from ..fsutil import clean_temp_files, sha256_bytes
from ..state import APPLY_SKIPS, JOURNAL_FILE, SKIP_UNLESS_NAMED
from .conflicts import check_conflicts, earlier_overlays
from .writeset import WriteSet, drop_bytecode
from .files import Tree, decode_file, encode_file, nul_line, resolve_in_root
from ..state import ABSENT, ORIGINALS_DIR, STATE_DIR, journal_entry, ledger_file, overlay_record
from .ledger import Ledger, state_dir
from .loader import Overlay
from .model import ApplyResult, FileChange, RevertResult, StatusReport
from .root import package_version
from .statuses import edited_since_apply, ledger_fast_status, overlay_status

if TYPE_CHECKING:
    from ..state import JournalEntry
    from .edits import Edit
    from .excerpt import Excerpt

# Overlay statuses that `apply` skips (nothing to write) and those it refuses unless unnamed.
_SKIP = APPLY_SKIPS
_SKIP_UNLESS_NAMED = SKIP_UNLESS_NAMED

# A test seam (testing.faults): called before each target file is written.
BEFORE_WRITE: list[Callable[[], None]] = []


# --- planning ------------------------------------------------------------------------------


@dataclass
class _Plan:
    root: Path
    version: str | None
    report: StatusReport
    tree: Tree  # the files as read (and parsed) for this plan
    texts: dict[str, str | None] = field(default_factory=dict)  # new text per file
    modules: dict[str, Any] = field(default_factory=dict)  # the new text's libcst module, when built
    excerpts: dict[str, Excerpt | None] = field(default_factory=dict)  # the Excerpt that module is of, if any
    overlays_by_file: dict[str, list[str]] = field(default_factory=dict)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def _run_edits(edits: Sequence[Edit], rel: str, text: str | None, tree_module: Any = None, *,
               excerpt: Excerpt | None = None, remove: bool = False) -> tuple[str | None, Any, Excerpt | None]:
    """Apply (or, `remove`, take out) edits for `rel` on `text`, Python edits on one libcst module
    and text edits on the text; returns (new text, its libcst module or None, the excerpt that
    module is of or None). `tree_module`: the module of `text` already parsed, the `excerpt`'s
    when it is one (manager.overlays.excerpt: its code is rendered back into the whole text).
    Raises EditFailed."""
    import libcst as cst

    from .edits import EditFailed

    def render(mod: Any) -> str:
        return excerpt.render(mod) if excerpt is not None else str(mod.code)

    module = None
    for e in edits:
        if e.language == "python":  # edits.Edit: a libcst module in and out; else the text
            if module is None:
                if text is None:
                    raise EditFailed(f"{rel} does not exist")
                module = tree_module if tree_module is not None else cst.parse_module(text)
            module = e.remove(module) if remove else e.apply(module)
        else:
            if module is not None:
                text, module = render(module), None
            tree_module = excerpt = None  # the text changed: a later Python edit parses it again
            text = e.remove(text) if remove else e.apply(text)
    if module is not None:
        text = render(module)
    return text, module, (excerpt if module is not None else None)


def _apply_edits(overlay: Overlay, rel: str, text: str | None, tree_module: Any = None,
                 excerpt: Excerpt | None = None) -> tuple[str | None, Any, Excerpt | None]:
    """Apply one overlay's edits for `rel` on `text`; returns _run_edits' (text, module, excerpt)."""
    from .edits import EditFailed

    edits = overlay.make_edits(rel)
    try:
        return _run_edits(edits, rel, text, tree_module, excerpt=excerpt)
    except EditFailed as exc:
        raise OverlayError(f"overlay {overlay.id}: {rel}: {exc}") from None
    except RecursionError:
        raise OverlayError(f"overlay {overlay.id}: {rel}: {TOO_DEEP}") from None


# valid Python (CPython compiles it) that libcst's recursive visitors cannot walk: one line, nothing written
TOO_DEEP = ("code nested too deeply for the Python syntax tree library (libcst: RecursionError, e.g. a very "
            "long chained expression); refused, nothing written")


def _top_level_names(overlays: Sequence[Overlay]) -> dict[str, frozenset[str]]:
    """Per target, the top-level definitions every Python edit of `overlays` works inside; a
    target with an edit that may touch anything else (or none to name) is left out (whole module)."""
    from .edits import PythonEdit

    names: dict[str, set[str]] = {}
    whole: set[str] = set()
    for o in overlays:
        for t in o.manifest.targets:
            try:
                edits = o.make_edits(t)
            except Exception:  # noqa: BLE001 - the status reports it; this is only a parse hint
                whole.add(t)
                continue
            for e in edits:
                if isinstance(e, PythonEdit):
                    top = e.top_level()
                    if top is None:
                        whole.add(t)
                    else:
                        names.setdefault(t, set()).add(top)
    return {t: frozenset(n) for t, n in names.items() if t not in whole}


def _check_compiles(rel: str, text: str | None, who: list[str]) -> None:
    if text is None or not rel.endswith(".py"):
        return
    if "\0" in text:
        raise OverlayError(f"overlay {', '.join(who)}: {rel}: line {nul_line(text)}: patched code contains a NUL byte")
    try:
        compile(text, rel, "exec", dont_inherit=True)
    except RecursionError:
        raise OverlayError(
            f"overlay {', '.join(who)}: {rel}: patched code nested too deeply to compile; refused") from None
    except SyntaxError as exc:
        raise OverlayError(
            f"overlay {', '.join(who)}: {rel}: patched code does not compile: {exc.msg} (line {exc.lineno})"
        ) from None


def _plan(overlays: Sequence[Overlay], root: Path, explicit: bool, led: Ledger | None = None) -> _Plan:
    """What applying would write; `led`: the ledger already loaded under the root's lock (else read)."""
    tree = Tree(root, _top_level_names(overlays))
    version = package_version(root)
    edited = edited_since_apply(root, tree, version, led)
    report = StatusReport(str(root), version, tuple(overlay_status(o, tree, version, edited) for o in overlays))
    plan = _Plan(root, version, report, tree)
    for o, st in zip(overlays, report.overlays, strict=False):
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
            if t.path in edited:  # recording the edit as overlay bytes would let a revert drop it
                e = edited[t.path]
                raise OverlayError(
                    f"overlay {o.id}: {t.path}: changed since overlay apply of {', '.join(e['overlays'])} "
                    f"(sha256 {e['now'][:12]} != recorded {e['post'][:12]}; a hand edit?); refused so the edit "
                    "is not recorded as overlay bytes: revert those overlays or restore the file first")
            if t.path in plan.texts:
                current, module = plan.texts[t.path], plan.modules.get(t.path)
            else:
                current = tree.text(t.path)
                module = tree.module(t.path) if t.path.endswith(".py") and current is not None else None
                plan.excerpts[t.path] = tree.excerpt(t.path) if module is not None else None
            plan.texts[t.path], plan.modules[t.path], plan.excerpts[t.path] = _apply_edits(
                o, t.path, current, module, plan.excerpts[t.path])
            plan.overlays_by_file.setdefault(t.path, []).append(o.id)
    writing = {i for ids in plan.overlays_by_file.values() for i in ids}
    writers = [o for o in overlays if o.id in writing]
    earlier = earlier_overlays(root, overlays, writers, plan.overlays_by_file) if writers else []
    check_conflicts(writers, earlier, overlays)  # before anything is written; with the ledger's earlier overlays
    for rel, text in plan.texts.items():
        _check_compiles(rel, text, plan.overlays_by_file[rel])
    return plan


def _changes(plan: _Plan, tree_read: Callable[[str], bytes | None]) -> list[FileChange]:
    out = []
    for rel, text in sorted(plan.texts.items()):
        before = tree_read(rel)
        after = plan.tree.encode(rel, text)
        if before != after:
            out.append(FileChange(rel, before, after, tuple(plan.overlays_by_file[rel])))
    return out


def _lock(root: Path, wait: float = 600.0, on_wait: Callable[[str], None] | None = None) -> AbstractContextManager[Any]:
    """The root's lock (manager.overlays.lock): names its holder, waits visibly, at most `wait` s."""
    from .lock import root_lock

    resolve_in_root(root, STATE_DIR)  # a state directory symlinked out of the root is refused
    return root_lock(state_dir(root), wait, on_wait)


def _unchanged_since_read(root: Path, c: FileChange) -> None:
    """A lost update is refused: the target must still hold the bytes this run read and computed
    from (another process may have written it since), checked immediately before the replace."""
    from .files import read_regular

    now = read_regular(resolve_in_root(root, c.path), c.path)
    if now != c.before:
        raise OverlayError(f"{c.path}: changed on disk while this run computed its new bytes (another "
                           "process wrote it); refused, run the command again")


def _verb(data: bytes | None) -> str:
    return "delete" if data is None else "write"


def _stage(ws: WriteSet, root: Path, changes: Sequence[FileChange], paths: list[str]) -> None:
    """Stage every change (through a file symlink that stays inside the root; a symlink is never deleted);
    `paths` gets the real path of each, in order. Nothing is replaced yet."""
    for c in changes:
        path = str(resolve_in_root(root, c.path))
        if c.after is None and (Path(root) / c.path).is_symlink():
            raise OverlayError(f"{c.path}: is a symlink; refusing to delete it or its target")
        try:
            ws.stage(path, c.after, undo=True, before=c.before)
        except OSError as exc:
            raise OverlayError(f"{c.path}: cannot {_verb(c.after)}: {exc.strerror}") from None
        paths.append(path)
    try:
        ws.sync()
    except OSError as exc:
        raise OverlayError(f"cannot write the new bytes of {len(changes)} file(s): {exc.strerror}") from None


def _commit(ws: WriteSet, root: Path, changes: Sequence[FileChange], paths: Sequence[str]) -> None:
    """Replace each target in order (each checked unchanged just before), then fsync each directory once."""
    for c, path in zip(changes, paths, strict=True):
        for hook in BEFORE_WRITE:  # tests: also between the journal and the first write (the journal window)
            hook()
        _unchanged_since_read(root, c)
        try:
            ws.commit(path)
        except OSError as exc:
            raise OverlayError(f"{c.path}: cannot {_verb(c.after)}: {exc.strerror}") from None
        link = str(Path(root) / c.path)
        if link != path:  # written through an in-root symlink: the link's bytecode too
            drop_bytecode(link)
    try:
        ws.sync_dirs()
    except OSError as exc:
        raise OverlayError(f"cannot make the {len(changes)} written file(s) durable: {exc.strerror}") from None


def _write(root: Path, changes: Sequence[FileChange], led: Ledger, *, journaled: bool = False) -> None:
    """Write every change through the one write set (manager.overlays.writeset): all new bytes staged and
    fsynced together, then each target replaced, then each directory fsynced once; when one fails, the
    ones already replaced are put back byte-exact (all or nothing).

    `journaled` (apply): the journal written for these changes is removed after a clean roll-back;
    it stays on disk only if the roll-back itself failed (the next run then sorts it out)."""
    if not changes:
        return
    paths: list[str] = []
    with WriteSet() as ws:
        try:
            _stage(ws, root, changes, paths)
            _commit(ws, root, changes, paths)
        except OverlayError as exc:
            done = len(ws.committed)
            rels = {p: c.path for c, p in zip(changes, paths, strict=False)}
            stuck = [f"{rels.get(p, p)}: cannot write: {e.strerror}" for p, e in ws.rollback()]
            if stuck:
                raise OverlayError(
                    f"{exc}; rolling back the {done} file(s) already written failed ({'; '.join(stuck)}); "
                    f"{led.journal_path} records them"
                ) from None
            if journaled:
                led.clear_journal()
            raise OverlayError(f"{exc}; nothing changed (rolled back {done} file(s) already written)") from None


def _clean_litter(root: Path, rels: Iterable[str]) -> list[str]:
    """Delete the temp files a killed run left next to the targets and in the state directory."""
    dirs = {state_dir(root), state_dir(root) / ORIGINALS_DIR}
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


def _record(led: Ledger, overlays: Sequence[Overlay], root: Path, tree: Tree) -> StatusReport:
    """Recompute status after writing and store it (with every target's hash) in the ledger.

    `tree` holds the bytes (and parsed modules) just written, so nothing is parsed twice."""
    version = package_version(root)
    report = StatusReport(str(root), version, tuple(overlay_status(o, tree, version) for o in overlays))
    for o, st in zip(overlays, report.overlays, strict=False):
        led.overlays[o.id] = overlay_record(o.manifest.sentinel_version, o.manifest.requires, o.digest, st.status,
                                            [(t.path, t.status, t.detail) for t in st.targets])
        for t in o.manifest.targets:
            led.observed[t] = tree.sha(t)
    return report


def _writable(path: Path) -> bool:
    """False on a read-only mount (access(2) says EROFS even to root) or a directory we may not write."""
    import os

    return os.access(path, os.W_OK)


def _settle_journal(led: Ledger, version: str | None) -> None:
    """One journal owner: a journal another run left (killed, or a plan replay that failed) is
    folded into the ledger by `recover`; the ledger is saved and only then is that journal
    removed, before this run writes a journal of its own. A roll-back of this run then removes
    only its own journal, never the records of the earlier run."""
    if led.has_journal():
        led.save(version)
        led.clear_journal()


def apply(
    overlays: Sequence[Overlay], root: Path, *, dry_run: bool = False, explicit: bool = False,
    wait: float = 600.0, on_wait: Callable[[str], None] | None = None,
) -> ApplyResult:
    """Apply the overlays transactionally. `explicit`: the user named them (superseded is then an error).
    `wait`: seconds to wait for a lock another run holds (`on_wait(message)` is told once)."""
    version = package_version(root)
    if dry_run:
        plan = _plan(overlays, root, explicit)
        changes = _changes(plan, plan.tree.read)
        return ApplyResult(str(root), version, tuple(changes), plan.report, tuple(plan.skipped), dry_run=True)
    if not _writable(state_dir(root) if state_dir(root).is_dir() else Path(root)):
        # a read-only root (an image): no lock can be taken there, and none is needed when there is
        # nothing to write and no journal to recover; otherwise the lock below says why it cannot
        plan = _plan(overlays, root, explicit)
        if not _changes(plan, plan.tree.read) and not (state_dir(root) / JOURNAL_FILE).exists():
            return ApplyResult(str(root), version, (), plan.report, tuple(plan.skipped))
    with _lock(root, wait, on_wait):
        led = Ledger.load(root)
        notes = led.recover(lambda rel: Tree(root).sha(rel))
        _settle_journal(led, version)
        notes += _clean_litter(root, [t for o in overlays for t in o.manifest.targets] + list(led.files))
        if not notes:
            fast = ledger_fast_status(overlays, root, version, led)  # the ledger loaded once per apply
            quiet = _SKIP if explicit else _SKIP | _SKIP_UNLESS_NAMED
            if fast is not None and all(o.status in quiet for o in fast.overlays):
                skipped = tuple((o.id, f"{o.status}: {o.detail}") for o in fast.overlays if o.status not in _SKIP)
                return ApplyResult(str(root), version, (), fast, skipped, fast_path=True)
        plan = _plan(overlays, root, explicit, led)
        tree = plan.tree
        changes = _changes(plan, tree.read)
        if changes:
            journal: dict[str, JournalEntry] = {}
            for c in changes:
                rec = led.files.get(c.path)
                base = rec["base_sha256"] if rec else (ABSENT if c.before is None else led.store_original(c.before))
                prior = dict(rec["overlays"]) if rec else {}
                prior.update({i: next(o.manifest.sentinel_version for o in overlays if o.id == i) for i in c.overlays})
                journal[c.path] = journal_entry(base, ABSENT if c.before is None else sha256_bytes(c.before),
                                                ABSENT if c.after is None else sha256_bytes(c.after), prior)
            led.write_journal(journal)
            _write(root, changes, led, journaled=True)
            for rel, e in journal.items():
                led.files[rel] = ledger_file(e)
            for c in changes:  # the tree now holds what was written (no second read or parse)
                tree.replace(c.path, c.after, plan.modules.get(c.path))
        report = _record(led, overlays, root, tree)
        try:
            led.save(version)
        except OverlayError as exc:
            if not changes:
                raise
            raise OverlayError(
                f"{exc}; the {len(changes)} target(s) are written and {led.journal_path} (kept) records them: "
                "the next apply or revert completes from it") from None
        led.clear_journal()
        return ApplyResult(str(root), version, tuple(changes), report, tuple(plan.skipped), tuple(notes))


def diff(overlays: Sequence[Overlay], root: Path, explicit: bool = False) -> str:
    result = apply(overlays, root, dry_run=True, explicit=explicit)
    return unified_diff(result.changes)


def unified_diff(changes: Sequence[FileChange]) -> str:
    out: list[str] = []
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
    overlays: Sequence[Overlay], all_overlays: Sequence[Overlay], root: Path, *, wait: float = 600.0,
    on_wait: Callable[[str], None] | None = None,
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
        notes = led.recover(lambda rel: Tree(root).sha(rel))
        _settle_journal(led, version)
        notes += _clean_litter(root, [t for o in overlays for t in o.manifest.targets] + list(led.files))
        tree = Tree(root)
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
                text = _apply_edits(by_id[i], rel, text)[0]
            texts[rel] = text
            encodings[rel] = enc
            owners[rel] = mine
        # files not in the ledger that carry our sentinels
        ledgerless: set[str] = set()
        for o in reversed(list(overlays)):  # the last applied first: a later overlay's blocks come out first
            for t in o.manifest.targets:
                if t in led.files or (t in texts and t not in ledgerless):
                    continue
                # several overlays on one file: each one's blocks
                current = texts[t] if t in ledgerless else tree.text(t)
                if current is None or f"overlay:{o.id} v" not in current:
                    continue
                ledgerless.add(t)
                from .edits import EditFailed

                try:
                    text = _run_edits(o.make_edits(t), t, current, remove=True)[0]
                except EditFailed as exc:  # a block that is not intact is never removed by count
                    raise OverlayError(f"revert refused: {t}: {exc}; restore the file first") from None
                except RecursionError:
                    raise OverlayError(f"revert refused: {t}: {TOO_DEEP}") from None
                texts[t] = text
                owners.setdefault(t, []).append(o.id)
                notes.append(f"{t}: not in the ledger; removed sentinel-marked blocks of {o.id}")
        for rel, text in texts.items():
            _check_compiles(rel, text, owners[rel])
        changes = []
        for rel, text in sorted(texts.items()):
            before = tree.read(rel)
            after: bytes | None
            if rel in encodings and text is not None:
                after = encode_file(rel, text, encodings[rel])
            else:
                after = tree.encode(rel, text)
            if before != after:
                changes.append(FileChange(rel, before, after, tuple(owners[rel])))
        _write(root, changes, led)
        for rel in texts:
            kept = led.files.get(rel)
            if kept is None:
                continue
            remaining = {i: v for i, v in kept["overlays"].items() if i not in selected}
            if remaining:
                kept["overlays"] = remaining
                written = next((c.after for c in changes if c.path == rel), tree.read(rel))
                kept["post_sha256"] = sha256_bytes(written) if written is not None else ABSENT
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
