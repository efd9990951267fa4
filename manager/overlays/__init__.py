"""The overlay engine (see docs/overlays.md)."""

from .engine import Overlay, apply, diff, load_overlays, revert, select, status, status_on_release, unified_diff
from .manifest import Manifest, load_manifest
from .model import ApplyResult, FileChange, OverlayStatus, RevertResult, StatusReport, TargetStatus
from .root import find_root, package_version

__all__ = [
    "Overlay", "apply", "diff", "load_overlays", "revert", "select", "status", "status_on_release",
    "unified_diff", "Manifest", "load_manifest", "ApplyResult", "FileChange", "OverlayStatus",
    "RevertResult", "StatusReport", "TargetStatus", "find_root", "package_version",
]
