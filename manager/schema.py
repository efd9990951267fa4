"""Building blocks shared by every YAML schema (overlay manifests, profiles, kernels, compose)."""

from __future__ import annotations

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """Unknown keys are errors; loaded documents are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def check_version(value: str) -> str:
    """A PEP 440 version, or ValueError naming the value."""
    try:
        Version(value)
    except InvalidVersion as exc:
        raise ValueError(f"not a PEP 440 version: {value!r}") from exc
    return value


def check_specifier(value: str) -> str:
    """A PEP 440 specifier set ('' allowed: any version), or ValueError naming the value."""
    try:
        SpecifierSet(value)
    except InvalidSpecifier as exc:
        raise ValueError(f"not a PEP 440 specifier: {value!r}") from exc
    return value
