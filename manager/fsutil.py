"""Filesystem helpers shared by every writer: atomic writes and hashes."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import tempfile
from pathlib import Path

# Temp files of atomic_write: `.<name>.overlay-manager-tmp-<random>`. The marker cannot be
# mistaken for a file of anybody else's, so the next run may delete what a killed one left.
TMP_MARK = ".overlay-manager-tmp-"
_TMP_RE = re.compile(r"^\..+" + re.escape(TMP_MARK) + r"[A-Za-z0-9_]{6,}$")


def is_temp_name(name: str) -> bool:
    """True for a name atomic_write gives its temp files (and nothing else)."""
    return bool(_TMP_RE.match(name))


def clean_temp_files(directory: Path) -> list[Path]:
    """Delete the temp files atomic_write left in `directory` (a killed writer's); returns them.

    Only regular files (not symlinks) whose names carry TMP_MARK; never recurses. The caller
    must hold the lock that serialises writers into this directory."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for e in entries:
        if is_temp_name(e.name) and e.is_file(follow_symlinks=False):
            try:
                os.unlink(e.path)
            except FileNotFoundError:
                continue
            removed.append(Path(e.path))
    return removed


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def atomic_write(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write `data` to `path` atomically.

    Temp file in the same directory, fsync, os.replace, then fsync the directory.
    The existing file's permission bits are kept (or `mode` when given / new file 0o644), and
    its owner and group where the runner may set them.
    """
    path = Path(path)
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    try:
        st: os.stat_result | None = path.stat()
    except FileNotFoundError:
        st = None
    if mode is None:
        mode = stat.S_IMODE(st.st_mode) if st is not None else 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}{TMP_MARK}", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
            if st is not None and (st.st_uid, st.st_gid) != (os.geteuid(), os.getegid()):
                try:  # the replaced file's owner is kept (a root run on a 1000:1000 tree)
                    os.fchown(fh.fileno(), st.st_uid, st.st_gid)
                except OSError:
                    pass  # only a privileged run can; then the owner is the runner's, as before
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(directory)


# a filesystem that cannot fsync a directory says so with these: skipped. Anything else (EIO: the
# device failed) is an error, never swallowed: the rename may not be on disk.
DIR_FSYNC_UNSUPPORTED = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF, errno.EROFS})


def fsync_dir(directory: Path) -> None:
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError as exc:
        if exc.errno not in DIR_FSYNC_UNSUPPORTED:
            raise
    finally:
        os.close(dfd)


def write_if_changed(path: Path, data: bytes) -> str:
    """Compare before writing. Returns the copier-style verb: create / identical / updated."""
    path = Path(path)
    try:
        current = path.read_bytes()
    except FileNotFoundError:
        atomic_write(path, data)
        return "create"
    if current == data:
        return "identical"
    atomic_write(path, data)
    return "updated"
