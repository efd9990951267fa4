"""Load the catalog's overlays, order them (dependencies first) and select some by id."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING
from collections.abc import Iterable, Sequence

from ..catalog import Catalog
from ..errors import OverlayError
from ..state import catalog_overlay_ids
from .manifest import Manifest, load_manifest, manifest_digest

if TYPE_CHECKING:
    from .edits import Edit


@dataclass(frozen=True)
class Overlay:
    manifest: Manifest
    dir: Path

    @property
    def id(self) -> str:
        return self.manifest.id

    @cached_property
    def digest(self) -> str:
        return manifest_digest(self.dir)

    def edit_specs(self, target: str) -> list:
        """The manifest edits for one target (an edit without `target` serves every target)."""
        return [e for e in self.manifest.edits if e.target in (None, target)]

    def make_edits(self, target: str) -> list[Edit]:
        from .edits import EditContext, make_edit

        ctx = EditContext(self.id, self.manifest.sentinel_version, self.dir)
        return [make_edit(spec, ctx, target) for spec in self.edit_specs(target)]


def load_overlays(catalog: Catalog) -> list[Overlay]:
    """Every overlay of the catalog, sorted by id; all manifest errors reported together."""
    base = catalog.overlays_dir
    if not base.is_dir():
        return []
    overlays, errors = [], []
    for oid in catalog_overlay_ids(os.fspath(base), any_kind=True) or []:
        d = base / oid
        mf = d / "overlay.yaml"
        try:
            overlays.append(Overlay(load_manifest(mf), d))
        except OverlayError as exc:
            errors.append(str(exc))
    if errors:
        raise OverlayError("; ".join(errors))
    known = {o.id for o in overlays}
    for o in overlays:
        for r in o.manifest.requires:
            if r not in known:
                raise OverlayError(f"{o.dir / 'overlay.yaml'}: requires: unknown overlay {r!r}")
    return _ordered(overlays)


def _ordered(overlays: list[Overlay]) -> list[Overlay]:
    """Dependencies (`requires`) first, otherwise by id. Iterative (a depth-first walk with its
    own stack): a `requires` chain of any length is ordered, never a RecursionError."""
    by_id = {o.id: o for o in overlays}
    out: list[Overlay] = []
    seen: set[str] = set()
    for first in sorted(overlays, key=lambda x: x.id):
        if first.id in seen:
            continue
        path: list[str] = [first.id]  # the chain being walked (a cycle shows up on it)
        on_path = {first.id}
        todo: list[list[str]] = [list(reversed(first.manifest.requires))]
        while todo:
            if todo[-1]:
                r = todo[-1].pop()
                if r in seen:
                    continue
                if r in on_path:
                    raise OverlayError(f"overlay requires cycle: {' -> '.join([*path[path.index(r):], r])}")
                path.append(r)
                on_path.add(r)
                todo.append(list(reversed(by_id[r].manifest.requires)))
                continue
            todo.pop()
            done = path.pop()
            on_path.discard(done)
            seen.add(done)
            out.append(by_id[done])
    return out


def select(overlays: Sequence[Overlay], ids: Iterable[str] | None) -> list[Overlay]:
    ids = list(ids or [])
    if not ids:
        return list(overlays)
    by_id = {o.id: o for o in overlays}
    unknown = [i for i in ids if i not in by_id]
    if unknown:
        raise OverlayError(f"unknown overlay {unknown[0]!r} (known: {', '.join(sorted(by_id)) or 'none'})")
    wanted = set(ids)
    # a selected overlay brings the ones it requires
    changed = True
    while changed:
        changed = False
        for i in list(wanted):
            for r in by_id[i].manifest.requires:
                if r not in wanted:
                    wanted.add(r)
                    changed = True
    return [o for o in overlays if o.id in wanted]
