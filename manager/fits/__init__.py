"""fits(): named constraints, the per-layer-group memory model, and deployment planning."""

from __future__ import annotations

from ..profiles.tp import valid_tps
from .core import CONSTRAINT_IDS, Constraint, FitReport, default_engine, fits
from .memory import Memory, kv_bytes, kv_cache_bytes
from .overlays import DeploymentFacts, OverlayIndex, OverlayInfo, build_index, index_for, matches
from .plan import Plan, Rejected, plan

__all__ = [
    "CONSTRAINT_IDS", "Constraint", "DeploymentFacts", "FitReport", "Memory", "OverlayIndex", "OverlayInfo",
    "Plan", "Rejected", "build_index", "default_engine", "fits", "index_for", "kv_bytes", "kv_cache_bytes",
    "matches", "plan", "valid_tps",
]
