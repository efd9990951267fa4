"""Test seams of the overlay engine, kept out of the production write path.

`python -m testing.faults ARGS` runs `overlay ARGS` (the same entry point as
`python -m manager`) with a pause of $OVERLAY_TEST_WRITE_DELAY seconds before each target
file write, so a test can kill it between writes (or in the window between the journal and
the first write).
"""

from __future__ import annotations

import os
import time

WRITE_DELAY_ENV = "OVERLAY_TEST_WRITE_DELAY"


def pause_before_writes(delay: float) -> None:
    """Sleep `delay` seconds before each file the transaction writes (this process only)."""
    from manager.overlays import transaction

    transaction.BEFORE_WRITE.append(lambda: time.sleep(delay))


def main() -> None:
    delay = float(os.environ.get(WRITE_DELAY_ENV, "0") or 0)
    if delay:
        pause_before_writes(delay)
    from manager.fastpath import main as overlay

    overlay()


if __name__ == "__main__":
    main()
