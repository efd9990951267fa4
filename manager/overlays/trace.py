"""Opt-in runtime marker: proof that a patched block ran in the engine, not only that it sits on disk.

Every python `insert` block carries a guard that, when the process runs with `OVERLAY_TRACE=1`, writes one line
to stderr the first time the block runs in that process:

    overlay-trace: <overlay-id> v<sentinel version> <edit name> pid=<pid> module=<module>

The guard is self-contained (only `os` and `sys`, through `__import__`: the engine process does not import
`manager`), its text is fixed by the overlay id, sentinel version and edit name (so the block bytes, the sentinel's
sha= and byte-exact revert are unchanged by the environment), and it costs one dict lookup when tracing is off.
Where it goes in the snippet: first statement (after a docstring) of each top-level `def` and of each top-level
`if` body (a branch that is taken); before the snippet when it has other statements.

`read_trace(text)` parses those lines back (what `overlay trace LOGFILE` prints).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

TRACE_ENV = "OVERLAY_TRACE"
PREFIX = "overlay-trace:"
_LINE_RE = re.compile(
    r"overlay-trace: (?P<id>[a-z0-9][a-z0-9._-]*) v(?P<version>\d+) (?P<edit>[A-Za-z0-9][A-Za-z0-9_.-]*)"
    r" pid=(?P<pid>\d+) module=(?P<module>\S+)"
)


@dataclass(frozen=True)
class TraceLine:
    overlay: str
    version: int
    edit: str
    pid: int
    module: str


def guard_code(overlay_id: str, version: int, edit: str) -> str:
    """The statement that logs `overlay-trace: ...` once per process when OVERLAY_TRACE=1."""
    key = f"{overlay_id} v{version} {edit}"
    return (
        f'if __import__("os").environ.get("{TRACE_ENV}") == "1" and "{key}" not in '
        f'__import__("sys").__dict__.setdefault("_overlay_trace_seen", set()):\n'
        f'    __import__("sys")._overlay_trace_seen.add("{key}")\n'
        f'    __import__("sys").stderr.write("{PREFIX} {key} pid=%d module=%s\\n" % '
        f'(__import__("os").getpid(), __name__))\n'
        f'    __import__("sys").stderr.flush()\n'
    )


def add_guards(code: str, overlay_id: str, version: int, edit: str) -> str:
    """The snippet `code` with trace guards placed (see the module docstring). Deterministic."""
    import textwrap

    import libcst as cst

    mod = cst.parse_module(textwrap.dedent(code).strip("\n") + "\n")
    guard = cst.parse_module(guard_code(overlay_id, version, edit)).body[0]

    def into(body: cst.BaseSuite) -> cst.BaseSuite:
        if not isinstance(body, cst.IndentedBlock):  # `def f(): x` on one line: leave it
            return body
        stmts = list(body.body)
        at = 1 if stmts and _is_docstring(stmts[0]) else 0
        stmts.insert(at, guard)
        return body.with_changes(body=stmts)

    out: list[cst.SimpleStatementLine | cst.BaseCompoundStatement] = []
    placed = False
    for stmt in mod.body:
        if isinstance(stmt, (cst.FunctionDef, cst.If)):
            out.append(stmt.with_changes(body=into(stmt.body)))
            placed = True
        else:
            out.append(stmt)
    if not placed:
        first = out[0]
        # keep comments above the snippet above the guard
        out = [guard.with_changes(leading_lines=first.leading_lines), first.with_changes(leading_lines=()), *out[1:]]
    return mod.with_changes(body=out).code


def _is_docstring(stmt: object) -> bool:
    import libcst as cst

    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Expr) and isinstance(stmt.body[0].value, (cst.SimpleString,
                                                                                          cst.ConcatenatedString)))


def read_trace(text: str) -> tuple[TraceLine, ...]:
    """Every `overlay-trace:` line in a log (other text, e.g. vLLM's log prefixes, is ignored)."""
    out = []
    for m in _LINE_RE.finditer(text):
        out.append(TraceLine(m["id"], int(m["version"]), m["edit"], int(m["pid"]), m["module"]))
    return tuple(out)


@dataclass(frozen=True)
class TraceSummary:
    """Which overlays' blocks ran, from one log: lines in order of appearance, and what was expected but absent."""

    lines: tuple[TraceLine, ...]
    overlays: tuple[str, ...]  # distinct overlay ids seen, sorted
    missing: tuple[str, ...]  # expected overlay ids with no line
    # in-memory delivery's markers (manager/inmemory/marker.py): {pid: {overlay id: [modules served from memory]}}
    memory: dict[int, dict[str, list[str]]] = field(default_factory=dict)


def read_trace_file(path: str, expect: tuple[str, ...] = ()) -> TraceSummary:
    """Read a server log (the engine's stderr; `-`: standard input) and summarise its `overlay-trace:` lines."""
    from ..errors import OverlayError

    try:
        if path == "-":  # `docker logs X 2>&1 | overlay trace -`
            import sys

            text = sys.stdin.buffer.read().decode(errors="replace")
        else:
            with open(path, errors="replace") as fh:
                text = fh.read()
    except OSError as exc:
        raise OverlayError(f"{path}: cannot read the log ({exc.strerror or exc})") from None
    from ..inmemory.marker import read_memory_lines

    lines = read_trace(text)
    seen = tuple(sorted({ln.overlay for ln in lines}))
    return TraceSummary(lines, seen, tuple(e for e in expect if e not in seen), read_memory_lines(text))
