"""Run a read that may meet a FIFO in a thread, and fail the test instead of hanging when it blocks."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from collections.abc import Callable


def finishes(fn: Callable[[], object], limit: float = 10.0) -> tuple[bool, object]:
    """fn() in a daemon thread: (done within `limit` s, what it returned or raised)."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["v"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box["v"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit)
    return not t.is_alive(), box.get("v")


def error_without_blocking(read: Callable[[], object], fifo: Path, timeout: float = 10.0) -> BaseException | None:
    """Call `read()` in a daemon thread; return what it raised (None if it returned). When it is still
    blocked after `timeout` s, open the FIFO for writing (non-blocking) so that the thread can end, and
    fail with an AssertionError naming the FIFO."""
    done, value = finishes(read, timeout)
    if not done:
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
        raise AssertionError(f"reading the FIFO {fifo} blocked for {timeout:.0f} s")
    return value if isinstance(value, BaseException) else None
