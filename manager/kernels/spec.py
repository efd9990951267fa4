"""The `kernels:` section of an overlay manifest (pydantic v2, extra=forbid).

    kernels:
      headers: [csrc/d512_common.cuh]          # included by sources; part of every cache key
      archs: [compute_70, sm_70]               # compute_XY -> PTX, sm_XY -> cubin
      options: ["--std=c++17"]                 # extra NVRTC options
      sources:
        - path: csrc/paged_decode_d512.cu
          entries:
            - name: paged_decode_d512
              threads: 256
              shared_bytes: 93888
              params: [ptr out, ptr part_o, i32 num_seqs, f32 scale, i64 stride_block]

Parameter types: ptr (device pointer: a torch tensor or an int), i32, i64, f32.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from ..errors import BuildError
from ..schema import Strict

ParamType = Literal["ptr", "i32", "i64", "f32"]
_ARCH = re.compile(r"^(compute|sm)_(\d{2,3})[af]?$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Options that the builder owns: the arch comes from `archs`, includes from the NVRTC install.
_RESERVED_OPTS = ("--gpu-architecture", "-arch", "--include-path", "-I")


_Strict = Strict


class Param(_Strict):
    name: str
    type: ParamType


class EntryPoint(_Strict):
    """One `extern "C" __global__` function of a source."""

    name: str
    params: list[Param]
    threads: int = Field(256, ge=1, le=1024)
    shared_bytes: int = Field(0, ge=0, le=232448)

    @field_validator("name")
    @classmethod
    def _ident(cls, v: str) -> str:
        if not _IDENT.match(v):
            raise ValueError(f"entry name {v!r} is not a C identifier")
        return v

    @field_validator("params", mode="before")
    @classmethod
    def _parse_params(cls, v: object) -> object:
        """Accept `"ptr out"` strings (C order: type then name) as well as mappings."""
        if not isinstance(v, list):
            return v
        out = []
        for item in v:
            if isinstance(item, str):
                parts = item.split()
                if len(parts) != 2:
                    raise ValueError(f"parameter {item!r}: expected '<type> <name>', e.g. 'ptr out'")
                out.append({"type": parts[0], "name": parts[1]})
            else:
                out.append(item)
        return out


class KernelSource(_Strict):
    path: str
    entries: list[EntryPoint] = Field(min_length=1)

    @field_validator("path")
    @classmethod
    def _relative_cu(cls, v: str) -> str:
        p = Path(v)
        if p.is_absolute() or ".." in p.parts:
            raise ValueError(f"source path {v!r} must be relative to the overlay directory")
        if p.suffix != ".cu":
            raise ValueError(f"source path {v!r} must end in .cu")
        return v


class KernelsSpec(_Strict):
    sources: list[KernelSource] = Field(min_length=1)
    headers: list[str] = Field(default_factory=list)
    archs: list[str] = Field(default_factory=lambda: ["compute_70", "sm_70"], min_length=1)
    options: list[str] = Field(default_factory=lambda: ["--std=c++17"])

    @field_validator("archs")
    @classmethod
    def _archs(cls, v: list[str]) -> list[str]:
        for a in v:
            if not _ARCH.match(a):
                raise ValueError(f"arch {a!r}: expected compute_XY (PTX) or sm_XY (cubin)")
        return v

    @field_validator("options")
    @classmethod
    def _options(cls, v: list[str]) -> list[str]:
        for o in v:
            if o.startswith(_RESERVED_OPTS):
                raise ValueError(f"option {o!r} is set by the builder (use `archs`)")
        return v

    @field_validator("headers")
    @classmethod
    def _headers(cls, v: list[str]) -> list[str]:
        for h in v:
            p = Path(h)
            if p.is_absolute() or ".." in p.parts:
                raise ValueError(f"header path {h!r} must be relative to the overlay directory")
        return v

    @model_validator(mode="after")
    def _unique_entries(self) -> KernelsSpec:
        seen: set[str] = set()
        for src in self.sources:
            for e in src.entries:
                if e.name in seen:
                    raise ValueError(f"entry point {e.name!r} is declared twice")
                seen.add(e.name)
        return self

    def entry(self, name: str) -> tuple[KernelSource, EntryPoint]:
        for src in self.sources:
            for e in src.entries:
                if e.name == name:
                    return src, e
        raise BuildError(f"no entry point {name!r} in the kernels section")


def load_kernels_spec(overlay_dir: Path) -> KernelsSpec | None:
    """Read `overlay.yaml`'s `kernels:` section through this schema (None when absent).

    The overlay engine's manifest (`Manifest.kernels`) validates the same section
    with the same model; this reader takes the section alone, so `overlay build`
    and the routed vLLM code in the serving process do not depend on the rest of
    the manifest (or on the engine's imports), and it also checks that the listed
    sources and headers exist.
    """
    manifest = Path(overlay_dir) / "overlay.yaml"
    try:
        data = yaml.safe_load(manifest.read_text())
    except FileNotFoundError as exc:
        raise BuildError(f"{manifest}: not found") from exc
    except yaml.YAMLError as exc:
        raise BuildError(f"{manifest}: invalid YAML ({str(exc).splitlines()[0]})") from exc
    if not isinstance(data, dict):
        raise BuildError(f"{manifest}: expected a mapping at the top level")
    raw = data.get("kernels")
    if raw is None:
        return None
    try:
        spec = KernelsSpec.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise BuildError(f"{manifest}: kernels.{loc}: {first['msg']}") from exc
    for rel in [s.path for s in spec.sources] + spec.headers:
        if not (Path(overlay_dir) / rel).is_file():
            raise BuildError(f"{manifest}: kernels: file {rel} does not exist")
    return spec
