"""Overlay conflicts: two overlays of one apply editing the same place of one file.

The second would silently edit the first's result (an insert at an anchor the first also
inserts at, the same dict entry, the same assignment, a whole-file edit). Such a pair is
refused before anything is planned, naming both overlays, the file and the place, unless one
`requires` the other (directly or through others): then the order is fixed (the required one
first) and the second edit is written against the first's result on purpose.

The same holds across runs: an overlay the ledger records on a file this apply writes (applied
by an earlier run, not rewritten now) is compared too, read from the same catalog (the request's
own Overlay when it is in it, else `overlays/<id>/overlay.yaml` beside the request's overlays).
An earlier overlay the catalog no longer holds cannot be compared and is passed over.
"""

from __future__ import annotations

from pathlib import Path
from collections.abc import Iterable, Sequence

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


def _requires_closure(overlays: Sequence[Overlay], known: Sequence[Overlay] = ()) -> dict[str, set[str]]:
    """Per overlay of `overlays`: every id it requires, directly or through others (looked up
    among `overlays`, then `known`, then the catalog directory they come from)."""
    by_id = {o.id: o for o in [*known, *overlays]}

    def lookup(oid: str) -> Overlay | None:
        if oid not in by_id:
            by_id[oid] = _from_catalog(overlays, oid)  # type: ignore[assignment]
        return by_id[oid]

    out: dict[str, set[str]] = {}
    for o in overlays:
        seen: set[str] = set()
        todo = list(o.manifest.requires)
        while todo:
            r = todo.pop()
            if r not in seen:
                seen.add(r)
                dep = lookup(r)
                todo.extend(dep.manifest.requires if dep is not None else ())
        out[o.id] = seen
    return out


def _from_catalog(beside: Sequence[Overlay], oid: str) -> Overlay | None:
    """Overlay `oid` from the catalog directory the overlays `beside` come from (None: not there)."""
    from .manifest import load_manifest

    if not beside:
        return None
    d = beside[-1].dir.parent / oid
    if not (d / "overlay.yaml").is_file():
        return None
    try:
        return Overlay(load_manifest(d / "overlay.yaml"), d)
    except OverlayError:
        return None


def earlier_overlays(root: Path, known: Sequence[Overlay], writing: Sequence[Overlay],
                     files: Iterable[str]) -> list[Overlay]:
    """The overlays the ledger of `root` records on `files` that are not among `writing`: the
    request's own (`known`) where it holds them, else loaded from the catalog directory the
    request's overlays come from. A ledger that cannot be read gives none (apply reports it)."""
    from .ledger import Ledger

    try:
        led = Ledger.load(root)
    except OverlayError:
        return []
    now = {o.id for o in writing}
    by_id = {o.id: o for o in known}
    out: dict[str, Overlay] = {}
    for rel in files:
        rec = led.files.get(rel)
        for oid in rec["overlays"] if rec else ():
            if oid in now or oid in out:
                continue
            o = by_id.get(oid) or _from_catalog(writing, oid)
            if o is not None:
                out[oid] = o
    return list(out.values())


def check_conflicts(overlays: Sequence[Overlay], earlier: Sequence[Overlay] = (),
                    known: Sequence[Overlay] = ()) -> None:
    """Raise OverlayError for the first pair of unordered overlays editing one place of one file:
    two of `overlays` (this apply's writers), or one of them and one of `earlier` (already applied
    on the file by an earlier run; pairs of two earlier ones are not this apply's to judge).
    `known`: further overlays (the whole request) through which `requires` chains are followed."""
    now = {o.id for o in overlays}
    needs = _requires_closure([*earlier, *overlays], known)
    owner: dict[tuple[str, tuple[str, ...]], str] = {}
    for o in [*earlier, *overlays]:
        for target in o.manifest.targets:
            for spec in o.edit_specs(target):
                place = _place(spec)
                if place is None:
                    continue
                other = owner.setdefault((target, place), o.id)
                if other == o.id or o.id not in now or other in needs[o.id] or o.id in needs[other]:
                    continue
                where = place[0] if len(place) == 1 else f"{place[0]} {' '.join(repr(p) for p in place[1:] if p)}"
                first = other if other in now else f"{other} (applied earlier)"
                raise OverlayError(
                    f"overlays {first} and {o.id} both edit {target} ({where}): the second would edit the "
                    f"first's result; add `requires: [{other}]` to {o.id} to fix their order, or apply only one"
                    + ("" if other in now else f" (revert {other} first)")
                )
