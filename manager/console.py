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


# Human-readable answers to queries (tables, fits reports, plans): stdout, with rich markup.
data = Console(highlight=False)


def print_table(table: object) -> None:
    """A table answering a query is data: stdout (80 columns or $COLUMNS when not a terminal)."""
    data.print(table)
