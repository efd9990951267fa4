"""The deployment registry: `compose/deployments.yaml`, slug -> one deployment.

One file holds every deployment so ports, TP and pins live in one place. The
schema is strict (pydantic v2, extra=forbid); values that later reach YAML or a
shell are rendered inertly by `manager.compose.render`, and the few fields that
become names (slug, served name, model directory) are additionally restricted
to characters that are meaningful there, so a typo fails here with the key named.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from collections.abc import Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .. import safeyaml
from ..catalog import Catalog
from ..errors import ComposeError

REGISTRY_FILE = "deployments.yaml"
GENERATED_DIR = "generated"

SLUG_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
STATUSES = ("production", "experimental", "deprecated", "disabled")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class Deployment(BaseModel):
    """One deployment: what runs where, with which limits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    slug: str
    model: str = Field(description="model profile id")
    weights: str | None = Field(default=None,
                                description="weights variant of the model profile (default: the model's own)")
    engine: str = Field(description="engine profile id (gives the image pin)")
    hardware: str = Field(description="hardware profile id")
    gpus: int = Field(ge=1, le=16)
    tp: int = Field(ge=1, le=16)
    drafter: str | None = None
    kv_dtype: str | None = None
    ctx: int = Field(ge=256, description="--max-model-len")
    max_seqs: int = Field(default=8, ge=1, le=4096)
    port: int = Field(ge=1024, le=65535, description="default host port (overridable with HOST_PORT)")
    status: Literal["production", "experimental", "deprecated", "disabled"] = "experimental"
    note: str = ""
    served_name: str | None = None
    model_dir: str | None = Field(default=None, description="path of the weights under the models volume")
    gpu_memory_utilization: float | None = Field(
        default=None, gt=0.1, le=0.99,
        description="default: the hardware profile's safe_mem_util (what fits() budgets with)")
    num_speculative_tokens: int | None = Field(default=None, ge=1, le=16,
                                               description="default: the drafter profile's default_tokens")
    shm_size: str | None = Field(default=None, description="for TP>1 instead of ipc: host, e.g. '8gb'")
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = Field(default_factory=dict)
    delivery: Literal["files", "memory"] = Field(
        default="files", description="files: `overlay apply` at start; memory: read-only root, import hook")

    @field_validator("slug")
    @classmethod
    def _slug(cls, v: str) -> str:
        if not SLUG_RE.match(v):
            raise ValueError(f"slug {v!r} must match {SLUG_RE.pattern} (it names a file, a service and a volume)")
        return v

    @field_validator("served_name", "model_dir", "kv_dtype", "model", "weights", "engine", "hardware", "drafter")
    @classmethod
    def _no_control(cls, v: str | None) -> str | None:
        if v is not None and (_CONTROL.search(v) or not v.strip()):
            raise ValueError(f"{v!r} is empty or contains a control character (newline, tab, NUL)")
        return v

    @field_validator("model_dir")
    @classmethod
    def _relative(cls, v: str | None) -> str | None:
        if v is None:
            return v
        parts = v.split("/")
        if v.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"model_dir {v!r} must be a relative path below the models volume "
                             "(no '..', no leading '/')")
        return v

    @field_validator("shm_size")
    @classmethod
    def _shm(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[0-9]+(b|k|m|g|kb|mb|gb)", v):
            raise ValueError(f"shm_size {v!r} must look like '8gb'")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: Mapping[str, str]) -> Mapping[str, str]:
        for k in v:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                raise ValueError(f"environment name {k!r} is not a valid variable name")
        return dict(v)

    @model_validator(mode="after")
    def _tp(self) -> Deployment:
        if self.gpus % self.tp != 0:
            raise ValueError(f"gpus={self.gpus} is not a multiple of tp={self.tp}")
        return self


@dataclass(frozen=True)
class Registry:
    path: Path
    deployments: Mapping[str, Deployment]

    def get(self, slug: str) -> Deployment:
        try:
            return self.deployments[slug]
        except KeyError:
            known = ", ".join(sorted(self.deployments)) or "none"
            raise ComposeError(f"{self.path}: no deployment {slug!r} (known: {known})") from None

    @property
    def generated_dir(self) -> Path:
        return self.path.parent / GENERATED_DIR

    def generated_path(self, slug: str) -> Path:
        return self.generated_dir / f"{slug}.yml"


def registry_path(catalog: Catalog) -> Path:
    return catalog.compose_dir / REGISTRY_FILE


def _loc(err: Mapping[str, Any]) -> str:
    return ".".join(str(p) for p in err.get("loc", ()))


def parse_registry(data: object, path: Path) -> Registry:
    if not isinstance(data, dict) or not isinstance(data.get("deployments"), dict):
        raise ComposeError(f"{path}: expected a mapping with a 'deployments:' mapping of slug -> deployment")
    unknown = set(data) - {"deployments"}
    if unknown:
        raise ComposeError(f"{path}: unknown top-level key {sorted(unknown)[0]!r}")
    out: dict[str, Deployment] = {}
    for slug, body in data["deployments"].items():
        if not isinstance(body, dict):
            raise ComposeError(f"{path}: deployments.{slug}: expected a mapping")
        if "slug" in body:
            raise ComposeError(f"{path}: deployments.{slug}: 'slug' is the key, do not repeat it")
        try:
            out[str(slug)] = Deployment(slug=str(slug), **body)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = _loc(first)
            raise ComposeError(
                f"{path}: deployments.{slug}{'.' + where if where else ''}: {first['msg']}"
                + (f" (got {first.get('input')!r})" if where and first.get("type") != "missing" else "")
            ) from None
    return Registry(path=path, deployments=out)


def load_registry(catalog: Catalog) -> Registry:
    """Read and validate `<catalog>/compose/deployments.yaml`."""
    path = registry_path(catalog)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ComposeError(f"{path}: deployment registry not found") from None
    except UnicodeDecodeError as exc:
        raise ComposeError(f"{path}: not UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})") from None
    except OSError as exc:
        raise ComposeError(f"{path}: cannot read the deployment registry: {exc.strerror}") from None
    try:
        data = safeyaml.load(text)
    except yaml.YAMLError as exc:
        raise ComposeError(f"{path}: invalid YAML: {str(exc).splitlines()[0]}") from None
    return parse_registry(data, path)
