"""The overlay manifest (`overlays/<id>/overlay.yaml`), validated with pydantic v2.

Every validation error names the file, the key path and the offending value.
"""

from __future__ import annotations

import datetime as _dt
import posixpath
import re
from pathlib import Path
from typing import Annotated, Literal

import yaml
from packaging.specifiers import SpecifierSet
from pydantic import Field, StrictInt, ValidationError, field_validator, model_validator

from ..errors import OverlayError
from ..kernels.spec import KernelsSpec
from ..schema import Strict, check_specifier, check_version
from ..state import UnreadableFile, overlay_digest, read_bounded

MANIFEST_MAX = 1 << 20  # a hand-written manifest is a few KiB

_YamlLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: ~10x faster

ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
EDIT_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


_Strict = Strict


class Upstream(_Strict):
    repo: str = Field(pattern=r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
    pr: int = Field(gt=0)
    state: Literal["open", "closed", "merged"]
    head_commit: str | None = Field(default=None, pattern=r"^[0-9a-f]{7,40}$")  # None: not yet recorded
    merge_commit: str | None = Field(default=None, pattern=r"^[0-9a-f]{7,40}$")
    url: str | None = None

    @model_validator(mode="after")
    def _merge_matches_state(self) -> Upstream:
        if self.state == "merged" and not self.merge_commit:
            raise ValueError("state 'merged' needs merge_commit")
        if self.state != "merged" and self.merge_commit:
            raise ValueError(f"merge_commit given but state is {self.state!r}")
        return self


class TestedOn(_Strict):
    hardware: str
    vllm: str
    note: str | None = None


class NeededWhen(_Strict):
    """When a deployment needs this overlay (evaluated by fits(); keys are AND-ed)."""

    always: bool = False
    families: list[str] | None = None
    weight_formats: list[str] | None = None
    quant_methods: list[str] | None = None
    min_sm: float | None = None
    max_sm: float | None = None
    head_dims: list[int] | None = None
    transformers: str | None = None
    drafter_model_types: list[str] | None = None  # the deployment's drafter maps to one of these (gemma4_mtp)
    devices: list[Literal["cpu", "cuda"]] | None = None  # the engine profile's `device` (a CPU-backend-only bug)
    moe: bool = False  # true: only mixture-of-experts models

    @field_validator("transformers")
    @classmethod
    def _spec(cls, v: str | None) -> str | None:
        return v if v is None else check_specifier(v)


def _inside(what: str, v: str) -> str:
    """A path field must be relative and free of '..' (the engine also resolves symlinks)."""
    if not v or v.startswith("/") or "\\" in v or ".." in Path(v).parts or (len(v) > 1 and v[1] == ":"):
        where = "package root" if what == "target" else "overlay directory"
        raise ValueError(f"{what} {v!r} must be a relative path inside the {where}")
    if what == "target" and (posixpath.normpath(v) != v or v.startswith("./")):
        # one spelling per file: `vllm/./x.py` and `vllm/x.py` would be two targets for one file
        raise ValueError(f"target {v!r} is not in normal form (write {posixpath.normpath(v)!r})")
    return v


class Probe(_Strict):
    """Recognises the native upstream fix. All given conditions must hold."""

    target: str

    @field_validator("target")
    @classmethod
    def _target(cls, v: str) -> str:
        return _inside("target", v)
    scope: str | None = None
    defines: str | None = None  # a name assigned/defined inside the scope
    contains: str | None = None  # a regex searched in the scope's source
    description: str | None = None

    @model_validator(mode="after")
    def _one_condition(self) -> Probe:
        if not (self.defines or self.contains):
            raise ValueError("a probe needs 'defines' or 'contains'")
        if self.contains:
            try:
                re.compile(self.contains)
            except re.error as exc:
                raise ValueError(f"contains: bad regex {self.contains!r}: {exc}") from exc
        return self


class _EditBase(_Strict):
    name: str = Field(pattern=EDIT_NAME_RE)
    target: str | None = None  # default: every manifest target


class InsertEdit(_EditBase):
    kind: Literal["insert"]
    scope: str = ""  # dotted path: Class.method._nested ("" = module level)
    anchor: str  # a statement (or compound-statement header ending in ':')
    position: Literal["before", "after"] = "before"
    code: str  # snippet file, relative to the overlay directory
    trace: bool = False  # add OVERLAY_TRACE=1 runtime-marker guards to the block (manager/overlays/trace.py)

    @field_validator("code")
    @classmethod
    def _code(cls, v: str) -> str:
        return _inside("code", v)


class DictEntryEdit(_EditBase):
    kind: Literal["dict-entry"]
    scope: str = ""
    dict_name: str  # the name the dict literal is assigned to
    key: str  # Python expression
    value: str  # Python expression


class SetValueEdit(_EditBase):
    kind: Literal["set-value"]
    scope: str = ""
    assign: str  # assignment target, e.g. `x` or `self.flag`
    value: str  # new value expression


class DictCacheEdit(_EditBase):
    kind: Literal["dict-cache"]
    functions: list[str] = ["*"]  # qualified names (Class.method) or "*" for all


class NewFileEdit(_EditBase):
    kind: Literal["new-file"]
    source: str  # file in the overlay directory; target is where it lands

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        return _inside("source", v)


class ReleaseFileEdit(_EditBase):
    """A whole file copied from a pinned vLLM release's sdist (sha256-verified; never vendored)."""

    kind: Literal["release-file"]
    release: str  # the vLLM release whose sdist holds the file
    path: str  # path inside the release's package root, e.g. vllm/model_executor/models/x.py
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @field_validator("release")
    @classmethod
    def _release(cls, v: str) -> str:
        return check_version(v)

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if v.startswith("/") or ".." in Path(v).parts:
            raise ValueError(f"path {v!r} must be a relative path inside the release's package root")
        return v


class TextInsertEdit(_EditBase):
    kind: Literal["text-insert"]
    anchor: str  # a whole line (compared stripped)
    within: str | None = None  # regex of the line that opens the enclosing brace block
    position: Literal["before", "after"] = "before"
    code: str

    @field_validator("code")
    @classmethod
    def _code(cls, v: str) -> str:
        return _inside("code", v)


OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "absent")


class UpstreamTestChange(_Strict):
    """An outcome of vLLM's own test suite this overlay changes on purpose (`overlay upstream-tests`)."""

    test: str = Field(pattern=r"^tests/[^:]+\.py::\S.*$")  # a pytest node id in the release's test tree
    versions: str = ""  # the releases it holds for (a specifier; "" = every release the overlay applies to)
    before: Literal[OUTCOMES] | None = None  # type: ignore[valid-type]  # None: whatever it was
    after: Literal[OUTCOMES]  # type: ignore[valid-type]
    reason: str = Field(min_length=1)

    @field_validator("versions")
    @classmethod
    def _versions(cls, v: str) -> str:
        return check_specifier(v)


class ExampleModel(_Strict):
    """The example-model entry a later release's `tests/models/registry.py` has for an architecture this overlay
    ports: added to the older release's test tree for the patched run (copied from that release's sdist, sha256
    of the whole file checked; never vendored)."""

    architecture: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    release: str
    path: str = Field(default="tests/models/registry.py", pattern=r"^tests/[A-Za-z0-9_/]+\.py$")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @field_validator("release")
    @classmethod
    def _release(cls, v: str) -> str:
        return check_version(v)


class UpstreamTests(_Strict):
    changes: list[UpstreamTestChange] = []
    example_models: list[ExampleModel] = []


EditSpec = Annotated[
    InsertEdit | DictEntryEdit | SetValueEdit | DictCacheEdit | NewFileEdit | TextInsertEdit | ReleaseFileEdit,
    Field(discriminator="kind"),
]


class Manifest(_Strict):
    id: str
    title: str
    summary: str
    upstream: Upstream | None = None  # None: a local fix with no upstream PR
    vendored_on: _dt.date
    tested_on: list[TestedOn] = []
    package: Literal["vllm"] = "vllm"
    versions: str = ""
    targets: list[str] = Field(min_length=1)
    drop_when: str
    # The first vLLM release that has the fix natively (what the probes recognise there); None:
    # no release has it (a local workaround or a kernel). fits() reads it for a superseded status
    # and for an overlay a deployment needs that its catalog lacks.
    native_from: str | None = None
    probes: list[Probe] = []
    sentinel_version: StrictInt = Field(ge=1)  # `true` is not 1
    needed_when: NeededWhen = NeededWhen()
    # Model families (profile `family`, e.g. gemma4_unified) this overlay adds to releases that
    # lack them: fits() passes engine-family through it while its status there is pending.
    provides_families: list[str] = []
    requires: list[str] = []
    edits: list[EditSpec] = []
    kernels: KernelsSpec | None = None  # kernel overlays (manager.kernels.spec, docs/kernels.md)
    # vLLM's own tests (manager/upstream/suite.py, docs/engine.md): the outcomes this overlay changes on purpose
    upstream_tests: UpstreamTests = UpstreamTests()
    notes: str | None = None
    # In-memory delivery (manager/inmemory, docs/compose.md): when a target's bytes match no prepared plan,
    # `refuse` stops the container before the server starts (one line naming overlay, file and hashes);
    # `engine` runs the full engine on a copy of the targets in memory and serves what it wrote.
    memory: Literal["refuse", "engine"] = "refuse"

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not ID_RE.match(v):
            raise ValueError(f"id {v!r} must match {ID_RE.pattern}")
        return v

    @field_validator("versions")
    @classmethod
    def _versions(cls, v: str) -> str:
        return check_specifier(v)

    @field_validator("native_from")
    @classmethod
    def _native_from(cls, v: str | None) -> str | None:
        return v if v is None else check_version(v)

    @field_validator("targets")
    @classmethod
    def _targets(cls, v: list[str]) -> list[str]:
        for t in v:
            _inside("target", t)
        twice = sorted({t for t in v if v.count(t) > 1})
        if twice:
            raise ValueError(f"target {twice[0]!r} is listed twice")
        return v

    @model_validator(mode="after")
    def _edits_target_known(self) -> Manifest:
        names = [e.name for e in self.edits]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"duplicate edit names: {sorted(dup)}")
        for e in self.edits:
            if e.target is not None and e.target not in self.targets:
                raise ValueError(f"edit {e.name!r}: target {e.target!r} is not listed in targets")
            if e.target is None and len(self.targets) > 1 and e.kind not in ("dict-cache",):
                raise ValueError(f"edit {e.name!r}: 'target' is required when there are several targets")
        return self

    @property
    def specifier(self) -> SpecifierSet:
        return SpecifierSet(self.versions)

    def applies_to_version(self, version: str | None) -> bool:
        if not self.versions or version is None:
            return True
        return self.specifier.contains(version, prereleases=True)


def _format_loc(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for p in loc:
        if isinstance(p, int):
            parts.append(f"[{p}]")
        elif p in ("insert", "dict-entry", "set-value", "dict-cache", "new-file", "text-insert", "release-file"):
            continue  # discriminator tag pydantic adds to the path
        else:
            parts.append(("." if parts else "") + str(p))
    return "".join(parts) or "(top)"


def format_validation_error(path: Path, exc: ValidationError) -> str:
    lines = []
    for e in exc.errors():
        key = _format_loc(tuple(e.get("loc", ())))
        value = e.get("input")
        shown = repr(value) if not isinstance(value, dict) else "{…}"
        if len(shown) > 80:
            shown = shown[:77] + "..."
        lines.append(f"{path}: {key}: {e.get('msg')} (value: {shown})")
    return "; ".join(lines)


def read_manifest(path: Path) -> dict[str, object]:
    """The manifest file's YAML mapping, unvalidated; OverlayError (one line) when it cannot be read."""
    from .. import safeyaml

    try:
        raw = safeyaml.load(read_bounded(str(path), MANIFEST_MAX).decode("utf-8"))
    except UnreadableFile as exc:  # a FIFO, a device, a huge file: refused before any read can block
        raise OverlayError(f"{path}: {exc}; not a manifest file") from None
    except FileNotFoundError:
        raise OverlayError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise OverlayError(f"{path}: is a directory, not a manifest file") from None
    except UnicodeDecodeError as exc:
        raise OverlayError(f"{path}: not UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})") from None
    except OSError as exc:
        raise OverlayError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise OverlayError(f"{path}:{where}: invalid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(raw, dict):
        raise OverlayError(f"{path}: (top): expected a mapping, got {type(raw).__name__}")
    return raw


def validate_manifest(path: Path, raw: dict[str, object]) -> Manifest:
    """`raw` (read from `path`) as a Manifest; OverlayError naming the file, key and value."""
    try:
        manifest = Manifest.model_validate(raw)
    except ValidationError as exc:
        raise OverlayError(format_validation_error(path, exc)) from None
    if manifest.id != path.parent.name:
        raise OverlayError(f"{path}: id: {manifest.id!r} must equal the directory name {path.parent.name!r}")
    return manifest


def load_manifest(path: Path) -> Manifest:
    return validate_manifest(path, read_manifest(path))


def manifest_digest(overlay_dir: Path) -> str:
    """sha256 over the manifest and every file it may read (snippets, sources)."""
    return overlay_digest(overlay_dir)
