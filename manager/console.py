"""One rich console pair for the whole tool: status to stderr, data to stdout."""

from __future__ import annotations

import json
import sys

from rich.console import Console
from rich.markup import escape

# Status, progress, tables meant for people: stderr.
err = Console(stderr=True, highlight=False, soft_wrap=True)
# Data (JSON, rendered YAML, diffs): stdout, never decorated.
out = Console(highlight=False, soft_wrap=True, emoji=False, markup=False)


def print_json(data: object) -> None:
    """Write machine output to stdout as plain JSON (no colour codes)."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def print_data(text: str) -> None:
    """Write text data (YAML, a diff) to stdout verbatim."""
    sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
    sys.stdout.flush()


def status(verb: str, subject: str, style: str = "cyan") -> None:
    """A copier-style status line on stderr: `  create  path` (the subject is shown literally)."""
    err.print(f"[{style}]{verb:>12}[/{style}]  {escape(subject)}")


def user_text(value: object) -> str:
    """Any text that did not come from this program (ids, paths, titles, messages), made safe
    to embed in a rich markup string: `[/x]` and `[bold]` are shown as typed, never parsed."""
    return escape(str(value))


class _DataConsole(Console):
    """stdout for people, greppable when piped: a line is never wrapped when stdout is not a terminal
    (one record per line, no word split: issue 26 point 5); on a terminal it wraps to the width."""

    def print(self, *objects: object, **kwargs: object) -> None:  # type: ignore[override]
        if kwargs.get("soft_wrap") is None and not self.is_terminal:
            kwargs["soft_wrap"] = True
        super().print(*objects, **kwargs)  # type: ignore[arg-type]  # rich's own keywords, passed through


# Human-readable answers to queries (tables, fits reports, plans): stdout, with rich markup.
data = _DataConsole(highlight=False)


def piped_table_lines(table: object) -> list[str]:
    """A rich Table for stdout that is not a terminal: one line per row, never a cell folded or a word
    split (`overlay status | grep gemma4.py` finds the row). Columns keep their alignment and any
    max_width they were given (a title that gives way with an ellipsis); a cell's own newlines become
    ', '. Trailing blanks are dropped."""
    import io

    for col in getattr(table, "columns", []):
        col._cells = [c.replace("\n", ", ") if isinstance(c, str) else c for c in col._cells]
        if col.max_width is None:
            col.no_wrap = True
    sink = Console(file=io.StringIO(), width=100_000, color_system=None, highlight=False, emoji=False)
    sink.print(table)
    return [ln.rstrip() for ln in sink.file.getvalue().splitlines()]  # type: ignore[attr-defined]


def print_table(table: object) -> None:
    """A table answering a query is data: stdout. On a terminal rich draws it to the width; piped,
    it is one line per row (piped_table_lines)."""
    if data.is_terminal:
        data.print(table)
        return
    sys.stdout.write("".join(line + "\n" for line in piped_table_lines(table)))
    sys.stdout.flush()
