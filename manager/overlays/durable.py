"""The plan path's write transaction, standard library only: every byte staged in a temp file
beside its destination, three group-committed fsync barriers, originals and journal before any
target, ledger last (the engine's transaction, made durable at a third of its fsync cost).

`manager.overlays.plans` replays a verified plan through `transaction`; nothing here imports
beyond the standard library, since it runs in `manager.fastpath` before click, rich, pydantic,
yaml or libcst load.
"""

from __future__ import annotations

import os

from ..state import JOURNAL_FILE, LEDGER_FILE, ORIGINALS_DIR, journal_bytes, ledger_bytes
from .writeset import WriteSet, fsync_dirs

TYPE_CHECKING = False  # not typing's: `typing` imports `re`, which the warm plan replay never loads
if TYPE_CHECKING:
    from typing import Any

# Crash safety is the engine's: originals stored, journal, atomic replace of each target, ledger
# last, journal removed; the writes go through the one write set (manager.overlays.writeset), as
# the engine's do. What follows is where the data is made durable, i.e. survives a power loss or
# a kernel crash (a kill -9 never needs an fsync: the page cache outlives the process). The
# engine stores originals, journal and ledger with `atomic_write`, two fsyncs each, one after the
# other (the file, then its directory), and its targets as one write set (one barrier for their
# bytes, one for their directories). Here every fsync that one ordering step needs is issued at
# once (a thread each, see writeset.fsync_all), so the filesystem commits them together (ext4/xfs
# group commit), and there are three such barriers for everything the plan writes:
#
#  1. every byte this run will write (originals, journal, each target's new bytes, the ledger)
#     is written to a temp file next to its destination and fsynced; nothing is renamed yet, so
#     a crash here leaves only temp files (named with TMP_MARK: the next engine run removes them).
#  2. originals and the journal are renamed into place, then the state directory and originals/
#     (and the root, when this run made the state directory) are fsynced. From here the journal
#     (every target's pre and post hash) and the original bytes survive a crash; no target has
#     been touched before this point, so a target's rename can never be on disk without them.
#  3. the targets are renamed over (or deleted), the ledger is renamed into place (last), then
#     every target directory, the state directory and the parent of any directory this run
#     created are fsynced together. The data went down in barrier 1, so each target is its old
#     or its new bytes, never a torn file. Until this barrier completes the journal is on disk,
#     and every reader of the ledger recovers the journal first (the warm path, the plan path,
#     `Ledger.recover` in apply and revert, `status`), so the ledger may become durable with or
#     without any target's rename: recover records each file at its post hash, notes each at
#     its pre hash, and the apply that follows re-applies those with the base recorded in the
#     originals store. A separate barrier for the ledger would buy nothing the journal does not.
#
# Then the journal is unlinked without an fsync: if that unlink is lost, the next run finds the
# ledger and a journal whose files are all at their post hashes and records them again
# (idempotent; that run takes the engine path once). Not fsynced either: the lock file (an flock
# dies with its holder; its text only names the holder). A directory the filesystem cannot fsync
# (EINVAL on some) is skipped, as manager.fsutil.fsync_dir does; a file's fsync error is an error.


def transaction(root: str, state: str, new: dict[str, bytes | None], base: dict[str, bytes | None],
                inputs: dict[str, str], journal: dict[str, Any], ledger: dict[str, Any], state_made: bool,
                paths: dict[str, str] | None = None) -> None:
    """The engine's apply transaction for the plan's writes, on the one write set, with the three
    durability barriers described above. `new`: rel -> bytes to write (None: delete); `base`: rel ->
    bytes read; `paths`: rel -> the real path written (an in-root symlink is written through and kept).
    No roll-back: a failure part-way leaves the journal, which the next run folds into the ledger."""
    paths = paths or {}
    ledger_path, journal_path = os.path.join(state, LEDGER_FILE), os.path.join(state, JOURNAL_FILE)
    originals = os.path.join(state, ORIGINALS_DIR)
    first: list[str] = []  # committed at barrier 2: originals, then the journal
    targets = [paths.get(rel) or os.path.join(root, rel) for rel in new]
    with WriteSet() as ws:
        for rel in new:
            data = base[rel]
            if data is not None:
                orig = os.path.join(originals, inputs[rel])
                if orig not in ws.pending and not os.path.exists(orig):
                    ws.stage(orig, data, mode=0o644)
                    first.append(orig)
        if journal:
            ws.stage(journal_path, journal_bytes(journal))
            first.append(journal_path)
        for path, data in zip(targets, new.values(), strict=True):
            ws.stage(path, data)
        ws.stage(ledger_path, ledger_bytes(ledger))
        ws.sync()  # barrier 1
        for path in first:
            ws.commit(path)
        synced: set[str] = set()
        if new:  # barrier 2: the journal and the originals, before any target is touched
            synced = {state, originals, *ws.new_dirs} | ({os.path.dirname(state)} if state_made else set())
            fsync_dirs(synced)
        for path in targets:
            ws.commit(path)
        ws.commit(ledger_path)  # ledger last
        # barrier 3: the targets and the ledger, while the journal covers them
        fsync_dirs({state} | (ws.new_dirs - synced) | {os.path.dirname(p) for p in targets})
    try:
        os.unlink(journal_path)  # not fsynced: a lost unlink only makes the next run record it again
    except FileNotFoundError:
        pass
