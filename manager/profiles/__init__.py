"""Profiles: typed Model / Engine / Drafter / Hardware YAML under profiles/, plus import-config."""

from __future__ import annotations

from .importcfg import import_config, profile_from_config, to_yaml
from .loader import Profiles, load_profiles, load_profiles_dir, validate_path
from .schema import (
    KINDS,
    KV_DTYPE_BYTES,
    AttentionBackend,
    DrafterProfile,
    EngineProfile,
    HardwareProfile,
    KnownBroken,
    LayerGroup,
    ModelProfile,
    Moe,
    WeightVariant,
)

__all__ = [
    "KINDS",
    "KV_DTYPE_BYTES",
    "AttentionBackend",
    "DrafterProfile",
    "EngineProfile",
    "HardwareProfile",
    "KnownBroken",
    "LayerGroup",
    "ModelProfile",
    "Moe",
    "Profiles",
    "WeightVariant",
    "import_config",
    "load_profiles",
    "load_profiles_dir",
    "profile_from_config",
    "to_yaml",
    "validate_path",
]
