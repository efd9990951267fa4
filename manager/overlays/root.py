"""Locate the package root (a site-packages-like directory holding `vllm/`) and its version."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..errors import OverlayError
from ..state import package_version as _package_version
from ..state import vllm_root


def find_root(root_arg: str | Path | None, package: str = "vllm") -> Path:
    """`--root DIR`, else where `import <package>` would find it (without importing it: state.vllm_root)."""
    if root_arg is not None:
        root = Path(vllm_root(os.fspath(root_arg) or ".", package) or ".")
        if not root.is_dir():
            raise OverlayError(f"--root {root_arg}: not a directory")
        if not (root / package).is_dir():
            raise OverlayError(f"--root {root_arg}: no {package}/ package inside")
        return root
    found = vllm_root(None, package)
    if found is None:
        raise OverlayError(
            f"package {package!r} not found on sys.path ({sys.executable}); "
            f"pass --root DIR (the directory holding {package}/)"
        )
    return Path(found)


def package_version(root: Path, package: str = "vllm") -> str | None:
    """The installed version, from the dist-info METADATA or `<package>/_version.py`."""
    return _package_version(root, package)
