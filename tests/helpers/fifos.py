"""Run a read that meets a FIFO in a thread, and fail the test instead of hanging when it blocks."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from collections.abc import Callable


def error_without_blocking(read: Callable[[], object], fifo: Path, timeout: float = 10.0) -> BaseException | None:
    """Call `read()` in a daemon thread; return what it raised (None if it returned). When it is still
    blocked after `timeout` s, open the FIFO for writing (non-blocking) so that the thread can end, and
    fail with an AssertionError naming the FIFO."""
    box: dict[str, BaseException] = {}

    def run() -> None:
        try:
            read()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["exc"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
        t.join(5)
        raise AssertionError(f"reading the FIFO {fifo} blocked for {timeout:.0f} s")
    return box.get("exc")
