"""Where the catalog (overlays/ and profiles/, plus compose/) lives.

Default: the catalog shipped with the project. An installed wheel carries it as the
package resource `manager/_catalog/` (read through importlib.resources); a checkout or
an editable install reads the repository root; a bundle sets OVERLAY_CATALOG to
`<bundle>/catalog`. `--catalog DIR` or the OVERLAY_CATALOG environment variable points
at a user's own. A user catalog holding compose/ alone (`overlay catalog init DIR` makes one) is
layered over the shipped one: overlays/, profiles/ and compose/images/ are read from the
shipped catalog.
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
    base: Path | None = None  # the shipped catalog this one is layered over (for the parts it lacks)

    def _part(self, name: str) -> Path:
        own = self.root / name
        if self.base is None or own.is_dir():
            return own
        return self.base / name

    @property
    def overlays_dir(self) -> Path:
        return self._part("overlays")

    @property
    def profiles_dir(self) -> Path:
        return self._part("profiles")

    @property
    def images_dir(self) -> Path:
        """compose/images/ (the engine image recipes): the user's, else the shipped ones."""
        own = self.root / "compose" / "images"
        if self.base is None or own.is_dir():
            return own
        return self.base / "compose" / "images"

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
        if (root / "overlays").is_dir() or (root / "profiles").is_dir():
            return cls(root)
        if not (root / "compose").is_dir():
            raise CatalogError(f"catalog {root}: has none of overlays/, profiles/, compose/ "
                               "(`overlay catalog init DIR` makes a user catalog)")
        shipped = default_catalog_dir()  # compose/ alone: a user catalog layered over the shipped one
        if shipped is None:
            raise CatalogError(f"catalog {root}: holds compose/ alone and there is no shipped catalog "
                               f"to take overlays/ and profiles/ from (searched {searched()})")
        return cls(root, shipped)


USER_REGISTRY_HEADER = """\
# A user catalog, layered over the shipped one (overlay catalog init): overlays/ and profiles/
# come from the shipped catalog unless this directory has its own. Use it with
# `overlay --catalog DIR ...` or OVERLAY_CATALOG=DIR. `overlay compose add --from-plan N ...`
# adds entries here; keys as in the shipped compose/deployments.yaml.
deployments: {}
"""


def init_catalog(path: str | os.PathLike[str]) -> Path:
    """Make a user catalog at `path`: compose/deployments.yaml with no deployments. `path` must be
    new or an empty directory; returns the registry file written."""
    root = Path(path).expanduser()
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise CatalogError(f"catalog init {root}: exists and is not an empty directory")
    if default_catalog_dir() is None:
        raise CatalogError(f"catalog init {root}: no shipped catalog to layer over (searched {searched()})")
    reg = root / "compose" / "deployments.yaml"
    try:
        reg.parent.mkdir(parents=True, exist_ok=True)
        reg.write_text(USER_REGISTRY_HEADER)
    except OSError as exc:
        raise CatalogError(f"catalog init {root}: cannot write: {exc.strerror or exc}") from None
    return reg
