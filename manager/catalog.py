"""Where the catalog (overlays/ and profiles/, plus compose/) lives.

Default: the catalog shipped with the project (the repository root, or the copy
bundled next to the package by `overlay bundle`). `--catalog DIR` or the
OVERLAY_CATALOG environment variable points at a user's own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .errors import CatalogError

ENV_VAR = "OVERLAY_CATALOG"


def default_catalog_dir() -> Path:
    """The built-in catalog: `<repo>/` in a checkout, `<bundle>/catalog` in a bundle."""
    pkg = Path(__file__).resolve().parent
    for candidate in (pkg.parent, pkg.parent / "catalog", pkg / "catalog"):
        if (candidate / "overlays").is_dir() or (candidate / "profiles").is_dir():
            return candidate
    return pkg.parent


@dataclass(frozen=True)
class Catalog:
    root: Path

    @property
    def overlays_dir(self) -> Path:
        return self.root / "overlays"

    @property
    def profiles_dir(self) -> Path:
        return self.root / "profiles"

    @property
    def compose_dir(self) -> Path:
        return self.root / "compose"

    @classmethod
    def locate(cls, path: str | os.PathLike[str] | None = None) -> "Catalog":
        raw = path if path is not None else os.environ.get(ENV_VAR)
        root = Path(raw).expanduser().resolve() if raw else default_catalog_dir()
        if not root.is_dir():
            raise CatalogError(f"catalog {root}: not a directory")
        if not (root / "overlays").is_dir() and not (root / "profiles").is_dir():
            raise CatalogError(f"catalog {root}: has neither overlays/ nor profiles/")
        return cls(root)
