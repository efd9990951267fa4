"""The overlay engine (see docs/overlays.md).

Names load lazily (PEP 562): the container-restart path (`manager.fastpath`) reads
`manager.overlays.root` without importing pydantic, yaml or libcst.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the names __getattr__ loads lazily, for type checkers and editors
    from .loader import Overlay, load_overlays, select
    from .manifest import Manifest, load_manifest
    from .model import ApplyResult, FileChange, OverlayStatus, RevertResult, StatusReport, TargetStatus
    from .root import find_root, package_version
    from .statuses import status, status_on_release
    from .transaction import apply, diff, revert, unified_diff

_EXPORTS = {
    "Overlay": "loader", "load_overlays": "loader", "select": "loader",
    "status": "statuses", "status_on_release": "statuses",
    "apply": "transaction", "diff": "transaction", "revert": "transaction", "unified_diff": "transaction",
    "Manifest": "manifest", "load_manifest": "manifest",
    "ApplyResult": "model", "FileChange": "model", "OverlayStatus": "model", "RevertResult": "model",
    "StatusReport": "model", "TargetStatus": "model",
    "find_root": "root", "package_version": "root",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
