"""Probe patterns (`probes[].contains`) evaluated in bounded time.

A backtracking regex such as `^(a+)+$` takes > 30 s on a 30-character line. Chosen bound:
- a pattern without regex metacharacters (every shipped probe) is a plain substring test: linear;
- any other pattern runs under a time budget (PROBE_BUDGET_S). In the main thread a CPU-time
  interval timer (ITIMER_VIRTUAL: a loaded machine does not eat the budget) interrupts it
  (CPython's regex engine checks for signals while it backtracks); in any other thread, where
  signals cannot be delivered, it runs in a child process that is killed at a wall-clock deadline.
  Over budget -> ProbeTimeout, a user error naming the pattern and the file.
Why not re2: a compiled dependency for every image's python (the offline bundle) and different
syntax for existing catalogs; why not literal-only: it would silently change what existing
regex probes mean.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading

from ..errors import OverlayError

PROBE_BUDGET_S = 2.0
_META = set(".^$*+?{}[]\\|()")


class ProbeTimeout(OverlayError):
    """A probe pattern took longer than its budget (catastrophic backtracking)."""


class _Expired(Exception):
    pass


def _timeout_error(pattern: str, where: str, budget: float) -> ProbeTimeout:
    return ProbeTimeout(
        f"{where}: probe pattern /{pattern}/ ran over its {budget:g} s budget (nested quantifiers such "
        f"as (a+)+ backtrack exponentially); simplify it or use a literal"
    )


def is_literal(pattern: str) -> bool:
    return not (_META & set(pattern))


def search(pattern: str, text: str, where: str, budget: float = PROBE_BUDGET_S) -> bool:
    """re.search(pattern, text, re.M) in bounded time; `where` names the file for the error."""
    if is_literal(pattern):
        return pattern in text
    compiled = re.compile(pattern, re.M)
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "ITIMER_VIRTUAL"):
        return _search_in_child(pattern, text, where, budget)

    def expire(signum, frame):  # noqa: ARG001
        raise _Expired

    previous = signal.signal(signal.SIGVTALRM, expire)
    old_timer = signal.setitimer(signal.ITIMER_VIRTUAL, budget)
    try:
        return compiled.search(text) is not None
    except _Expired:
        raise _timeout_error(pattern, where, budget) from None
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, previous)
        if old_timer[0]:  # give an outer timer back (approximately) what is left of it
            signal.setitimer(signal.ITIMER_VIRTUAL, max(old_timer[0] - budget, 0.001), old_timer[1])


_CHILD = "import json, re, sys; p, t = json.load(sys.stdin); print(int(re.search(p, t, re.M) is not None))"


def _search_in_child(pattern: str, text: str, where: str, budget: float) -> bool:
    try:
        proc = subprocess.run(
            [sys.executable, "-I", "-c", _CHILD], input=json.dumps([pattern, text]), capture_output=True,
            text=True, timeout=budget * 3 + 2.0,  # wall clock: start-up and a loaded machine included
        )
    except subprocess.TimeoutExpired:
        raise _timeout_error(pattern, where, budget) from None
    if proc.returncode != 0 or proc.stdout.strip() not in ("0", "1"):
        raise OverlayError(f"{where}: probe pattern /{pattern}/ could not be evaluated: {proc.stderr.strip()[-200:]}")
    return proc.stdout.strip() == "1"
