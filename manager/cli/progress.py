"""Progress of long work on stderr: the vLLM sdist download (a bar with bytes and rate on a
terminal, one line per step otherwise) and cache hits. Installed by the CLI for every command
(`releases.set_progress`); the library itself never prints."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from ..console import err, status
from ..releases import Step

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID


def _mb(n: int | None) -> str:
    return "?" if n is None else f"{n / 1e6:.1f} MB"


class DownloadProgress:
    """A `releases.Progress`: rich bar when stderr is a terminal, else plain lines."""

    def __init__(self, tty: bool | None = None) -> None:
        self.tty = sys.stderr.isatty() if tty is None else tty
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._cached_said = False

    def __call__(self, step: Step) -> None:
        if step.event == "cached":  # once per run: a command reading 9 cached releases says so in one line
            if not self._cached_said:
                self._cached_said = True
                status("cached", f"{step.name}: {step.detail} (no download; further cached releases are not listed)",
                       "dim")
        elif step.event == "fallback":
            status("download", f"{step.name}: {step.detail}", "yellow")
        elif step.event == "extract":
            status("extract", f"{step.name} -> {step.detail}")
        elif step.event == "start":
            status("download", f"{step.name} ({_mb(step.total)}) from {step.detail}")
            if self.tty:
                from rich.progress import (BarColumn, DownloadColumn, Progress, TimeRemainingColumn,
                                           TransferSpeedColumn)

                self._bar = Progress("  ", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                                     TimeRemainingColumn(), console=err, transient=True)
                self._bar.start()
                self._task = self._bar.add_task(step.name, total=step.total)
        elif step.event == "advance":
            if self._bar is not None and self._task is not None:  # set together in "start"
                self._bar.update(self._task, completed=step.done, total=step.total)
        elif step.event == "done":
            if self._bar is not None:
                self._bar.stop()
                self._bar = None
            rate = step.done / step.seconds / 1e6 if step.seconds > 0 else 0.0
            status("downloaded", f"{step.name}: {_mb(step.done)} in {step.seconds:.1f} s "
                                 f"({rate:.1f} MB/s){', ' + step.detail if step.detail else ''}", "green")
