"""Overlay conflicts: two overlays of one apply editing the same place of one file.

The second would silently edit the first's result (an insert at an anchor the first also
inserts at, the same dict entry, the same assignment, a whole-file edit). Such a pair is
refused before anything is planned, naming both overlays, the file and the place, unless one
`requires` the other (directly or through others): then the order is fixed (the required one
first) and the second edit is written against the first's result on purpose.
"""

from __future__ import annotations

from typing import Sequence

from ..errors import OverlayError
from .loader import Overlay


def _place(spec) -> tuple[str, ...] | None:
    """Where one edit spec writes, as a comparable key (None: nowhere another edit can collide)."""
    kind = spec.kind
    if kind in ("insert", "text-insert"):
        return ("at", getattr(spec, "scope", "") or "", " ".join(spec.anchor.split()))
    if kind == "dict-entry":
        return ("dict entry", spec.scope or "", spec.dict_name, " ".join(spec.key.split()))
    if kind == "set-value":
        return ("assignment", spec.scope or "", spec.assign)
    if kind == "dict-cache":
        return ("cache decorators",)
    if kind in ("new-file", "release-file"):
        return ("the whole file",)
    return None


def _requires_closure(overlays: Sequence[Overlay]) -> dict[str, set[str]]:
    by_id = {o.id: o for o in overlays}
    out: dict[str, set[str]] = {}
    for o in overlays:
        seen: set[str] = set()
        todo = list(o.manifest.requires)
        while todo:
            r = todo.pop()
            if r not in seen:
                seen.add(r)
                todo.extend(by_id[r].manifest.requires if r in by_id else ())
        out[o.id] = seen
    return out


def check_conflicts(overlays: Sequence[Overlay]) -> None:
    """Raise OverlayError for the first pair of unordered overlays editing one place of one file."""
    needs = _requires_closure(overlays)
    owner: dict[tuple[str, tuple[str, ...]], str] = {}
    for o in overlays:
        for target in o.manifest.targets:
            for spec in o.edit_specs(target):
                place = _place(spec)
                if place is None:
                    continue
                other = owner.setdefault((target, place), o.id)
                if other == o.id or other in needs[o.id] or o.id in needs[other]:
                    continue
                where = place[0] if len(place) == 1 else f"{place[0]} {' '.join(repr(p) for p in place[1:] if p)}"
                raise OverlayError(
                    f"overlays {other} and {o.id} both edit {target} ({where}): the second would edit the "
                    f"first's result; add `requires: [{other}]` to {o.id} to fix their order, or apply only one"
                )
