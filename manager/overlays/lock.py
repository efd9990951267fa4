"""The root's apply/revert lock: `<root>/.overlay-manager/lock`, an flock(2) on a file that says
who holds it.

- The holder writes `{"pid", "host", "command", "since"}` into the lock file, so a second run can
  say who it waits for (git's `index.lock` discipline: the lock names its owner).
- A busy lock is waited for visibly (`on_wait` gets one message) and at most `wait` seconds; then
  LockBusy (a user error, exit 1) names the holder. The kernel drops an flock when its holder
  dies (kill -9 included), so a stale file never blocks anybody.
- A run that created the state directory and then failed removes its lock file (and the then
  empty directory) before releasing: a refused apply leaves nothing behind. A waiter that gets an
  flock on an unlinked file sees the inode change and takes the lock again.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import sys
import time
from collections.abc import Callable, Iterator

from ..errors import OverlayError

# Also taken by the prepared-plan replay (manager.overlays.plans) before any third-party import,
# on every first container start: only modules the interpreter has loaded anyway or that cost
# nothing (no socket, datetime, typing or pathlib; paths are str or os.PathLike).

POLL_S = 0.1


class LockBusy(OverlayError):
    """Another live process held the lock for longer than --wait."""


def _describe(raw: bytes) -> str:
    try:
        info = json.loads(raw.decode("utf-8"))
        return (f"pid {int(info['pid'])} on {info.get('host', '?')} ({str(info.get('command', '?'))[:80]}, "
                f"since {info.get('since', '?')})")
    except (ValueError, KeyError, TypeError, AttributeError):
        return "another process (no owner recorded)"


def _open(path: str) -> int:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0), 0o644)
    except IsADirectoryError:
        raise OverlayError(f"{path}: the lock path is a directory; remove it (it is not the tool's)") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OverlayError(f"{path}: the lock path is a symbolic link; refused") from None
        raise OverlayError(f"{path}: cannot open the lock: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OverlayError(f"{path}: the lock path is not a regular file; refused")
    return fd


def _same_file(fd: int, path: str) -> bool:
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


@contextlib.contextmanager
def root_lock(state: str | os.PathLike[str], wait: float = 600.0,
              on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the lock of the state directory `state` (created when missing) for the block."""
    state = os.fspath(state)
    if wait != wait:  # NaN: every comparison with a deadline is false, so it would never give up
        raise OverlayError(f"--wait {wait}: not a number of seconds")
    created = not os.path.exists(state)
    try:
        os.mkdir(state)
    except FileExistsError:
        if not os.path.isdir(state):
            raise OverlayError(f"{state}: exists and is not a directory (the tool's state directory)") from None
    except OSError as exc:
        raise OverlayError(f"{state}: cannot create the state directory: {exc.strerror}") from None
    if not os.path.isdir(state) or os.path.islink(state):
        raise OverlayError(f"{state}: exists and is not a directory (the tool's state directory)")
    path = os.path.join(state, "lock")
    fresh = not os.path.lexists(path)
    deadline = time.monotonic() + max(wait, 0.0)
    told = False
    while True:
        fd = _open(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(os.pread(fd, 4096, 0))
            os.close(fd)
            if time.monotonic() >= deadline:
                raise LockBusy(
                    f"{path}: held by {holder}; gave up after {wait:g} s (--wait SECONDS to wait longer)"
                ) from None
            if not told and on_wait is not None:
                on_wait(f"{path} is held by {holder}; waiting up to {wait:g} s (--wait)")
                told = True
            time.sleep(POLL_S)
            continue
        if not _same_file(fd, path):  # the previous holder removed it while we waited
            os.close(fd)
            continue
        break
    ok = False
    try:
        owner = {
            # os.uname().nodename is what socket.gethostname() returns, without importing socket
            "pid": os.getpid(), "host": os.uname().nodename, "command": " ".join(sys.argv[:4]),
            "since": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
        }
        try:  # the owner text only names the holder (the flock is the lock): a full disk is no failure
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(owner).encode(), 0)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
        yield
        ok = True
    finally:
        try:
            if not ok and fresh:
                # nothing of ours may stay behind after a refused run: unlink while holding
                with contextlib.suppress(OSError):
                    os.unlink(path)
                if created:  # this run made the state directory: take back its empty directories
                    for dirpath, _, _ in sorted(os.walk(state), key=lambda w: -len(w[0])):
                        with contextlib.suppress(OSError):
                            os.rmdir(dirpath)  # only when empty
            else:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, 0)
        finally:
            os.close(fd)  # releases the flock
