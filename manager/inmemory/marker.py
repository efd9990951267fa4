"""The runtime marker of in-memory delivery: one stderr line per overlay and module, per process.

    overlay-memory: <overlay-id> pid=<pid> module=<module>

written by the hook (manager/inmemory/hook.py) with OVERLAY_TRACE=1 when a module is executed from its patched
text, and again by a forked child for every module it inherited; `overlay trace` reads them back per process.
Standard library only.
"""

from __future__ import annotations

PREFIX = "overlay-memory:"


def line(overlay_id: str, pid: int, module: str) -> str:
    return f"{PREFIX} {overlay_id} pid={pid} module={module}"


def read_memory_lines(text: str) -> dict[int, dict[str, list[str]]]:
    """{pid: {overlay id: [modules]}} from a log (other text, e.g. vLLM's prefixes, ignored)."""
    import re

    out: dict[int, dict[str, list[str]]] = {}
    for m in re.finditer(r"overlay-memory: ([a-z0-9][a-z0-9._-]*) pid=(\d+) module=([A-Za-z0-9_.]+)", text):
        mods = out.setdefault(int(m[2]), {}).setdefault(m[1], [])
        if m[3] not in mods:
            mods.append(m[3])
    return out
