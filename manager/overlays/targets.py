"""The `targets:` of an overlay manifest, read with the standard library (for the plan path).

`manager.overlays.plans` runs before yaml or pydantic load; it may write only files that are
targets of the overlays a plan applies, so it reads those targets itself: a block or flow list of
plain or quoted relative paths in normal form. Anything else (a duplicate key, another YAML
form, an odd character) gives None, and the full engine decides.
"""

from __future__ import annotations

import os

from ..state import read_bounded


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


_PATH_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-/"


def manifest_targets(overlay_dir: str) -> frozenset[str] | None:
    """The `targets:` of an overlay's manifest (block or flow
    list of plain or quoted paths); None when the file cannot be read that simply (the engine
    then decides). The plan path writes nothing that is not one of these."""
    try:
        text = read_bounded(os.path.join(overlay_dir, "overlay.yaml"), 1 << 20).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    lines = text.splitlines()
    found: list[str] | None = None
    for i, line in enumerate(lines):
        if not line.startswith("targets:"):
            continue
        if found is not None:
            return None  # a duplicate key: the engine refuses it
        rest = line[len("targets:"):].split(" #", 1)[0].strip()
        found = []
        if rest:
            if not (rest.startswith("[") and rest.endswith("]")):
                return None
            found = [_unquote(t.strip()) for t in rest[1:-1].split(",") if t.strip()]
            continue
        for nxt in lines[i + 1:]:
            body = nxt.split(" #", 1)[0].rstrip()
            if not body.strip() or body.lstrip().startswith("#"):
                continue
            if not (nxt[:1].isspace() or nxt.startswith("-")):
                break
            item = body.strip()
            if not item.startswith("- "):
                return None
            found.append(_unquote(item[2:].strip()))
    if not found:
        return None
    for t in found:
        parts = t.split("/")
        if (not t or t.startswith("/") or any(p in ("", ".", "..") for p in parts)
                or t.strip(_PATH_CHARS)):
            return None  # not in the engine's normal form: the engine reports it
    return frozenset(found)
