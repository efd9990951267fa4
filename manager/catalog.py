"""Where the catalog (overlays/ and profiles/, plus compose/) lives.

Default: the catalog shipped with the project. An installed wheel carries it as the
package resource `manager/_catalog/` (read through importlib.resources); a checkout or
an editable install reads the repository root; a bundle sets OVERLAY_CATALOG to
`<bundle>/catalog`. `--catalog DIR` or the OVERLAY_CATALOG environment variable points
at a user's own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .errors import CatalogError

ENV_VAR = "OVERLAY_CATALOG"
RESOURCE = "_catalog"  # manager/_catalog/ in a wheel (setup.py copies overlays/, profiles/, compose/ there)
_PARTS = ("overlays", "profiles")
_extracted: list[object] = []  # keeps an importlib.resources.as_file() extraction alive for the process


def _is_catalog(path: Path) -> bool:
    return any((path / part).is_dir() for part in _PARTS)


def _candidates() -> list[Path]:
    pkg = Path(__file__).resolve().parent
    # the package resource first (a regular install: a plain directory, no importlib import
    # needed on the container-restart fast path), then a checkout's root, then a bundle's copy
    return [pkg / RESOURCE, pkg.parent, pkg.parent / "catalog", pkg / "catalog"]


def _resource_catalog() -> Path | None:
    """The `_catalog` resource through importlib.resources (a zip or other non-directory install)."""
    try:
        from contextlib import ExitStack
        from importlib.resources import as_file, files

        res = files(__package__ or "manager").joinpath(RESOURCE)
        if not res.is_dir():
            return None
        stack = ExitStack()
        path = Path(stack.enter_context(as_file(res)))
        _extracted.append(stack)
    except (ImportError, OSError, TypeError, ValueError):
        return None
    return path if _is_catalog(path) else None


def default_catalog_dir() -> Path | None:
    """The shipped catalog, or None when this installation has none (see `searched()`)."""
    for candidate in _candidates():
        if _is_catalog(candidate):
            return candidate
    return _resource_catalog()


def searched() -> str:
    """Where `default_catalog_dir` looked, for the one-line error."""
    return ", ".join(str(p) for p in _candidates()) + " and the manager/_catalog package resource"


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
    def locate(cls, path: str | os.PathLike[str] | None = None) -> Catalog:
        raw = path if path is not None else os.environ.get(ENV_VAR)
        if raw:
            root = Path(raw).expanduser().resolve()
        else:
            found = default_catalog_dir()
            if found is None:
                raise CatalogError(
                    f"no catalog found (searched {searched()}); pass --catalog DIR or set "
                    f"{ENV_VAR} to a directory holding overlays/ and profiles/"
                )
            root = found
        if not root.is_dir():
            raise CatalogError(f"catalog {root}: not a directory")
        if not (root / "overlays").is_dir() and not (root / "profiles").is_dir():
            raise CatalogError(f"catalog {root}: has neither overlays/ nor profiles/")
        return cls(root)
