"""Overlay manifests read as OverlayInfo (what fits and inspect say about an overlay), below both.

A manifest that does not validate still yields an OverlayInfo (its valid parts and the first error), so
fits() can say "needed, but its manifest is invalid"; `shipped_overlays` memoizes the installation's catalog.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import ValidationError

from ..catalog import Catalog, default_catalog_dir
from ..errors import ManagerError
from ..fsutil import sha256_bytes
from ..state import catalog_overlay_ids
from .info import OverlayInfo
from .manifest import NeededWhen, read_manifest, validate_manifest


def read_overlay(mf: Path) -> OverlayInfo:
    """One overlays/<id>/overlay.yaml as an OverlayInfo; a manifest that does not validate keeps
    the parts that do (its needed_when, when valid) and the first error, shortened."""
    oid = mf.parent.name
    try:
        digest = sha256_bytes(mf.read_bytes())[:16]
    except OSError as exc:
        return OverlayInfo(oid, invalid=f"unreadable: {exc}")
    try:
        raw = read_manifest(mf)
    except ManagerError as exc:
        return OverlayInfo(oid, invalid=_first_error(exc, mf), digest=digest)
    try:
        return OverlayInfo.from_manifest(validate_manifest(mf, raw), digest=digest)
    except ManagerError as exc:
        invalid = _first_error(exc, mf)
    try:
        needed_when = NeededWhen.model_validate(raw.get("needed_when") or {})
    except ValidationError:
        needed_when = NeededWhen()
    rid, versions, provides = raw.get("id"), raw.get("versions"), raw.get("provides_families")
    return OverlayInfo(
        rid if isinstance(rid, str) and rid else oid,
        needed_when=needed_when,
        versions=versions if isinstance(versions, str) else "",
        kernel="kernels" in raw,
        provides_families=tuple(str(f) for f in provides) if isinstance(provides, list) else (),
        invalid=invalid,
        digest=digest,
    )


def _first_error(exc: ManagerError, mf: Path) -> str:
    """The first of a manifest's errors without the path, and how many more there are."""
    first = str(exc).splitlines()[0].split("; ")[0].replace(str(mf) + ": ", "")
    n = str(exc).count("; ") + 1
    return first[:100] + (f" (+{n - 1} more)" if n > 1 else "")


def read_overlays(base: Path) -> dict[str, OverlayInfo]:
    """id -> OverlayInfo for every overlays/<id>/overlay.yaml under `base`."""
    infos: dict[str, OverlayInfo] = {}
    for oid in catalog_overlay_ids(os.fspath(base)) or []:
        info = read_overlay(base / oid / "overlay.yaml")
        infos[info.id] = info
    return infos


_SHIPPED: dict[str, dict[str, OverlayInfo]] = {}
_SHIPPED_ROOT: list[Path | None] = []  # default_catalog_dir() of this installation, looked up once


def shipped_overlays() -> dict[str, OverlayInfo]:
    """The valid overlays of the catalog shipped with the project (memoized): what fits() can name
    as needed when a user's own catalog lacks them. The installation's catalog is found once per
    process (every fits() call asks; the lookup's path resolution was a third of a warm fits())."""
    if not _SHIPPED_ROOT:
        _SHIPPED_ROOT.append(default_catalog_dir())
    root = _SHIPPED_ROOT[0]
    if root is None:
        return {}
    key = str(root)
    if key not in _SHIPPED:
        _SHIPPED[key] = {k: v for k, v in read_overlays(Catalog(root).overlays_dir).items() if v.invalid is None}
    return _SHIPPED[key]


def remember_shipped(root: Path, valid: dict[str, OverlayInfo]) -> None:
    """The valid overlays of the shipped catalog at `root`, read by someone else (fits' index): kept for
    shipped_overlays."""
    _SHIPPED.setdefault(str(root), valid)
