"""The plan path's write transaction, standard library only: every byte staged in a temp file
beside its destination, three group-committed fsync barriers, originals and journal before any
target, ledger last (the engine's transaction, made durable at a third of its fsync cost).

`manager.overlays.plans` replays a verified plan through `transaction`; nothing here imports
beyond the standard library, since it runs in `manager.fastpath` before click, rich, pydantic,
yaml or libcst load.
"""

from __future__ import annotations

import _thread
import os

from ..state import JOURNAL_FILE, LEDGER_FILE, ORIGINALS_DIR, journal_bytes, ledger_bytes

TYPE_CHECKING = False  # not typing's: `typing` imports `re`, which the warm plan replay never loads
if TYPE_CHECKING:
    from typing import Any

# Crash safety is the engine's: originals stored, journal, atomic replace of each target, ledger
# last, journal removed. What follows is where the data is made durable, i.e. survives a power
# loss or a kernel crash (a kill -9 never needs an fsync: the page cache outlives the process).
# The engine's `atomic_write` pays two fsyncs per file, one after the other (the file, then its
# directory): 16 for a three-file first apply, ~4 ms each on a virtual disk, most of the plan
# path's time. Here the fsyncs that one ordering step needs are issued at once (a thread each,
# see _fsync_all), so the filesystem commits them together (ext4/xfs group commit), and there
# are three such barriers:
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

TMP_MARK = ".overlay-manager-tmp-"  # manager.fsutil.TMP_MARK (not imported: this module stays stdlib-light)


def _fsync_all(fds: list[int], strict: bool = True) -> None:
    """fsync every fd, all at once: one thread per extra fd, so the filesystem can commit them in
    one journal transaction (measured on ext4: 8 files in 8.5 ms together, 44 ms one by one).
    `strict=False` (directories): an fd the filesystem cannot fsync is skipped."""
    errors: list[OSError] = []

    def one(fd: int) -> None:
        try:
            os.fsync(fd)
        except OSError as exc:  # a directory the filesystem cannot fsync (EINVAL, ...) is skipped; EIO is not
            if strict or exc.errno not in (22, 95, 9, 30):  # EINVAL, ENOTSUP/EOPNOTSUPP, EBADF, EROFS
                errors.append(exc)

    # _thread (built in) rather than threading, whose import is ~1 ms of a first container start:
    # each helper thread holds a lock that it releases when its fsync is done; acquiring it joins
    joins = []
    for fd in fds[1:]:
        done = _thread.allocate_lock()
        done.acquire()

        def run(fd: int = fd, done: _thread.LockType = done) -> None:
            try:
                one(fd)
            finally:
                done.release()

        try:
            _thread.start_new_thread(run, ())
        except RuntimeError:  # no thread to be had: this one, now
            run()
        joins.append(done)
    if fds:
        one(fds[0])
    for done in joins:
        done.acquire()
    if errors:
        raise errors[0]


def _fsync_dirs(dirs: set[str] | list[str]) -> None:
    fds = []
    try:
        for d in sorted(set(dirs)):
            try:
                fds.append(os.open(d, os.O_RDONLY))
            except OSError:
                continue  # as manager.fsutil.fsync_dir
        _fsync_all(fds, strict=False)
    finally:
        for fd in fds:
            os.close(fd)


def _makedirs(directory: str, changed: set[str]) -> None:
    """os.makedirs; the parent of every directory it creates goes into `changed` (their new
    entries need a directory fsync too)."""
    missing, d = [], directory
    while not os.path.isdir(d):
        missing.append(d)
        if os.path.dirname(d) == d:
            break
        d = os.path.dirname(d)
    if missing:
        os.makedirs(directory, exist_ok=True)
        changed.update(os.path.dirname(m) for m in missing)


def keep_owner(fd: int, st: os.stat_result | None) -> None:
    """Give the new file behind `fd` the owner (uid, gid) of the file it replaces, as the
    engine's atomic_write does: a root run on a 1000:1000 tree leaves it 1000:1000. Only a
    privileged run can; for any other the owner already is the runner's, and EPERM is ignored."""
    if st is None:
        return
    mine = os.fstat(fd)
    if (mine.st_uid, mine.st_gid) != (st.st_uid, st.st_gid):
        try:
            os.fchown(fd, st.st_uid, st.st_gid)
        except OSError:
            pass


class _Staged:
    """Temp files written next to their destinations (barrier 1), renamed in groups later."""

    def __init__(self) -> None:
        self.fds: list[int] = []
        self.pending: dict[str, str] = {}  # destination -> temp file not renamed yet
        self.new_dirs: set[str] = set()  # parents of directories created for the temp files

    def add(self, path: str, data: bytes, mode: int | None = None) -> None:
        """Write `data` to `.<name>.overlay-manager-tmp-<random>` beside `path` (fsutil's temp
        names, so the next run's clean-up recognizes a killed run's); mode kept, 0o644 for a
        new file."""
        directory = os.path.dirname(path)
        _makedirs(directory, self.new_dirs)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            st = None
        if mode is None:
            mode = st.st_mode & 0o7777 if st is not None else 0o644
        tmp = os.path.join(directory, f".{os.path.basename(path)}{TMP_MARK}{os.urandom(6).hex()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self.fds.append(fd)
        self.pending[path] = tmp
        with open(fd, "wb", closefd=False) as fh:
            fh.write(data)
        keep_owner(fd, st)
        os.fchmod(fd, mode)

    def sync(self) -> None:
        """Barrier 1: every temp file's bytes on disk (nothing renamed yet)."""
        try:
            _fsync_all(self.fds)
        finally:
            self.close()

    def close(self) -> None:
        while self.fds:
            os.close(self.fds.pop())

    def rename(self, path: str) -> None:
        os.replace(self.pending[path], path)
        del self.pending[path]

    def discard(self) -> None:
        """Remove the temp files not renamed (a failed run leaves no litter of its own)."""
        self.close()
        for tmp in self.pending.values():
            try:
                os.unlink(tmp)
            except OSError:
                pass
        self.pending.clear()


def drop_bytecode(path: str) -> None:
    """Remove the cached bytecode of the source file `path` (`__pycache__/<stem>.*.pyc`, every tag and
    optimisation level): the one bytecode dropper of both write paths (the engine's and plan replay)."""
    if not path.endswith(".py"):
        return
    cache = os.path.join(os.path.dirname(path), "__pycache__")
    stem = os.path.basename(path)[:-3] + "."
    if not os.path.isdir(cache):  # the common case (a wheel's tree has none): one stat, as the engine did
        return
    try:
        names = os.listdir(cache)
    except OSError:
        return
    for n in names:
        if n.startswith(stem) and n.endswith(".pyc"):
            try:
                os.unlink(os.path.join(cache, n))
            except OSError:  # a directory, immutable, foreign-owned: left (CPython revalidates a .pyc)
                pass


def transaction(root: str, state: str, new: dict[str, bytes | None], base: dict[str, bytes | None],
                 inputs: dict[str, str], journal: dict[str, Any], ledger: dict[str, Any], state_made: bool,
                 paths: dict[str, str] | None = None) -> None:
    """The engine's apply transaction for the plan's writes, with the three durability barriers
    described above. `new`: rel -> bytes to write (None: delete); `base`: rel -> bytes read;
    `paths`: rel -> the real path written (an in-root symlink is written through and kept)."""
    paths = paths or {}
    staged = _Staged()
    ledger_path, journal_path = os.path.join(state, LEDGER_FILE), os.path.join(state, JOURNAL_FILE)
    originals = os.path.join(state, ORIGINALS_DIR)
    first: list[str] = []  # renamed at barrier 2: originals, then the journal
    try:
        for rel in new:
            if base[rel] is not None:
                orig = os.path.join(originals, inputs[rel])
                data = base[rel]
                if data is not None and orig not in staged.pending and not os.path.exists(orig):
                    staged.add(orig, data, mode=0o644)
                    first.append(orig)
        if journal:
            staged.add(journal_path, journal_bytes(journal))
            first.append(journal_path)
        for rel, data in new.items():
            if data is not None:
                staged.add(paths.get(rel) or os.path.join(root, rel), data)
        staged.add(ledger_path, ledger_bytes(ledger))
        staged.sync()  # barrier 1
        for path in first:
            staged.rename(path)
        synced: set[str] = set()
        if new:  # barrier 2: the journal and the originals, before any target is touched
            synced = {state, originals, *staged.new_dirs} | ({os.path.dirname(state)} if state_made else set())
            _fsync_dirs(synced)
        last = {state} | (staged.new_dirs - synced)
        for rel, data in new.items():
            path = paths.get(rel) or os.path.join(root, rel)
            if data is None:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
            else:
                staged.rename(path)
            last.add(os.path.dirname(path))
            drop_bytecode(path)
        staged.rename(ledger_path)  # ledger last
        _fsync_dirs(last)  # barrier 3: the targets and the ledger, while the journal covers them
    finally:
        staged.discard()
    try:
        os.unlink(journal_path)  # not fsynced: a lost unlink only makes the next run record it again
    except FileNotFoundError:
        pass
