"""The one write set of the overlay engine: stage, commit, roll back (standard library only).

Both write paths go through it: the engine's transaction (`manager.overlays.transaction`: apply and revert)
and the prepared-plan replay (`manager.overlays.durable`). In the spirit of pip's
`req_uninstall.StashedUninstallPathSet`:

- `stage(path, data)` writes the new bytes to a temp file beside the destination (named with TMP_MARK, so a
  killed run's temp files are recognised and removed by the next run), with the replaced file's mode and
  owner (a new file: 0o644); `data=None` stages a deletion. With `undo=True` it keeps what a roll-back needs:
  the original bytes (given by the caller, who read them) and the original's stat.
- `sync()` is one durability barrier: every staged temp file fsynced at once (a thread each, so the
  filesystem commits them together: ext4/xfs group commit), nothing renamed yet.
- `commit(path)` renames one staged file over its destination (`os.replace`) or deletes it, and drops its
  cached bytecode; `sync_dirs()` then fsyncs each parent directory once (plus those of directories it made).
- `rollback()` puts back, newest first, the byte-exact original of every committed path staged with `undo`
  (mode, owner, and an in-root symlink written through are kept, as the write kept them), through a write set
  of its own: `commit` is the one place a target is replaced or deleted;
  `discard()` removes the temp files never committed.

Errors are OSErrors; the callers name the file in their own words. No `typing` at run time: the warm plan
replay (manager.fastpath) imports this before anything else loads.
"""

from __future__ import annotations

import _thread
import os

TYPE_CHECKING = False  # not typing's: `typing` imports `re`, which the warm plan replay never loads
if TYPE_CHECKING:
    from collections.abc import Iterable

TMP_MARK = ".overlay-manager-tmp-"  # manager.fsutil.TMP_MARK (not imported: this module stays stdlib-light)

# a directory the filesystem cannot fsync says so with these (manager.fsutil.DIR_FSYNC_UNSUPPORTED): skipped
_DIR_FSYNC_UNSUPPORTED = (22, 95, 9, 30)  # EINVAL, ENOTSUP/EOPNOTSUPP, EBADF, EROFS


def fsync_all(fds: list[int], strict: bool = True) -> None:
    """fsync every fd, all at once: one thread per extra fd, so the filesystem can commit them in
    one journal transaction (measured on ext4: 8 files in 8.5 ms together, 44 ms one by one).
    `strict=False` (directories): an fd the filesystem cannot fsync is skipped."""
    errors: list[OSError] = []

    def one(fd: int) -> None:
        try:
            os.fsync(fd)
        except OSError as exc:  # a directory the filesystem cannot fsync (EINVAL, ...) is skipped; EIO is not
            if strict or exc.errno not in _DIR_FSYNC_UNSUPPORTED:
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


def fsync_dirs(dirs: Iterable[str]) -> None:
    """fsync each directory once, all at once; one that cannot be opened or fsynced is skipped (as
    manager.fsutil.fsync_dir), an I/O error is raised."""
    fds = []
    try:
        for d in sorted(set(dirs)):
            try:
                fds.append(os.open(d, os.O_RDONLY))
            except OSError:
                continue
        fsync_all(fds, strict=False)
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
    """Give the new file behind `fd` the owner (uid, gid) of the file it replaces, as
    manager.fsutil.atomic_write does: a root run on a 1000:1000 tree leaves it 1000:1000. Only a
    privileged run can; for any other the owner already is the runner's, and EPERM is ignored."""
    if st is None:
        return
    mine = os.fstat(fd)
    if (mine.st_uid, mine.st_gid) != (st.st_uid, st.st_gid):
        try:
            os.fchown(fd, st.st_uid, st.st_gid)
        except OSError:
            pass


def drop_bytecode(path: str) -> None:
    """Remove the cached bytecode of the source file `path` (`__pycache__/<stem>.*.pyc`, every tag and
    optimisation level): the one bytecode dropper of the engine and the plan replay."""
    if not path.endswith(".py"):
        return
    cache = os.path.join(os.path.dirname(path), "__pycache__")
    stem = os.path.basename(path)[:-3] + "."
    if not os.path.isdir(cache):  # the common case (a wheel's tree has none): one stat
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


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None


def _write_temp(path: str, data: bytes, mode: int, st: os.stat_result | None) -> tuple[str, int]:
    """`data` in `.<name>.overlay-manager-tmp-<random>` beside `path` (fsutil's temp names): (temp, open fd)."""
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}{TMP_MARK}{os.urandom(6).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with open(fd, "wb", closefd=False) as fh:
            fh.write(data)
        keep_owner(fd, st)
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    return tmp, fd


class WriteSet:
    """Files staged beside their destinations, committed in order, rolled back byte-exact."""

    def __init__(self) -> None:
        self._fds: list[int] = []
        self.pending: dict[str, str | None] = {}  # destination -> temp not committed yet (None: a deletion)
        self.committed: list[str] = []  # destinations replaced or deleted, in order
        self.new_dirs: set[str] = set()  # parents of directories created for the temp files
        self._undo: dict[str, tuple[bytes | None, os.stat_result | None]] = {}  # destination -> original, stat

    def __enter__(self) -> WriteSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()

    def stage(self, path: str, data: bytes | None, *, mode: int | None = None, undo: bool = False,
              before: bytes | None = None) -> None:
        """Stage `data` for `path` (None: its deletion). Mode kept (`mode` when given, 0o644 for a new file),
        owner kept where the runner may set it. `undo`: keep `before` (the bytes the caller read from
        `path`, None: it did not exist) to roll back to."""
        st = _stat(path)
        if undo:
            self._undo[path] = (before, st)
        if data is None:
            self.pending[path] = None
            return
        _makedirs(os.path.dirname(path), self.new_dirs)
        if mode is None:
            mode = st.st_mode & 0o7777 if st is not None else 0o644
        tmp, fd = _write_temp(path, data, mode, st)
        self._fds.append(fd)
        self.pending[path] = tmp

    def sync(self) -> None:
        """The barrier: every staged temp file's bytes on disk (nothing renamed yet)."""
        try:
            fsync_all(self._fds)
        finally:
            self._close()

    def _close(self) -> None:
        while self._fds:
            os.close(self._fds.pop())

    def commit(self, path: str) -> None:
        """Put the staged bytes of `path` in place (os.replace; a staged deletion: unlink, absent is fine),
        then drop its cached bytecode."""
        tmp = self.pending[path]
        if tmp is None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        else:
            os.replace(tmp, path)
        del self.pending[path]
        self.committed.append(path)
        drop_bytecode(path)

    def dirs(self) -> set[str]:
        """The directories whose entries this set changed: each committed path's parent, and the parent of
        every directory it created."""
        return {os.path.dirname(p) for p in self.committed} | self.new_dirs

    def sync_dirs(self) -> None:
        """Each changed directory fsynced once (after the commits: their renames on disk)."""
        fsync_dirs(self.dirs())

    def rollback(self) -> list[tuple[str, OSError]]:
        """Put back the original of every committed path staged with `undo`, newest first, through a write
        set of its own (the same stage, barrier, commit, directory fsyncs): its bytes as read, its mode and
        owner; a path that did not exist is deleted again. Returns the paths that could not be put back
        (each with its error); the others are on disk."""
        failed: list[tuple[str, OSError]] = []
        order = [p for p in reversed(self.committed) if p in self._undo]
        with WriteSet() as back:
            for path in order:
                before, st = self._undo[path]
                try:
                    back.stage(path, before, mode=st.st_mode & 0o7777 if st is not None else None)
                except OSError as exc:
                    failed.append((path, exc))
            try:
                back.sync()
            except OSError as exc:
                return failed + [(p, exc) for p in back.pending]
            for path in list(back.pending):
                try:
                    back.commit(path)
                except OSError as exc:
                    failed.append((path, exc))
            try:
                back.sync_dirs()
            except OSError as exc:
                failed.extend((p, exc) for p in back.committed)
        self.committed = [p for p in self.committed if p not in back.committed]
        return failed

    def discard(self) -> None:
        """Remove the temp files not committed (a failed run leaves no litter of its own)."""
        self._close()
        for tmp in self.pending.values():
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        self.pending.clear()
