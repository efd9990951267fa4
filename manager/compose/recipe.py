"""An image recipe (compose/images/<name>/): the record image builds from and wheels locks for."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Recipe:
    name: str
    path: Path
    tag: str
    vllm_version: str
    apply: tuple[str, ...]
    build: tuple[str, ...]
    requirements: tuple[str, ...]
