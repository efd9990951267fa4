"""Locate the package root (a site-packages-like directory holding `vllm/`) and its version."""

from __future__ import annotations

import importlib.machinery
import sys
from pathlib import Path

from ..errors import OverlayError
from ..state import package_version as _package_version


def find_root(root_arg: str | Path | None, package: str = "vllm") -> Path:
    """`--root DIR`, else where `import <package>` would find it (without importing it)."""
    if root_arg is not None:
        root = Path(root_arg).expanduser().resolve()
        if not root.is_dir():
            raise OverlayError(f"--root {root_arg}: not a directory")
        if not (root / package).is_dir():
            raise OverlayError(f"--root {root_arg}: no {package}/ package inside")
        return root
    spec = importlib.machinery.PathFinder.find_spec(package, sys.path)
    if spec is None or not spec.submodule_search_locations:
        raise OverlayError(
            f"package {package!r} not found on sys.path ({sys.executable}); pass --root DIR (the directory holding {package}/)"
        )
    pkg_dir = Path(list(spec.submodule_search_locations)[0]).resolve()
    return pkg_dir.parent


def package_version(root: Path, package: str = "vllm") -> str | None:
    """The installed version, from the dist-info METADATA or `<package>/_version.py`."""
    return _package_version(root, package)
