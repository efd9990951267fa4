"""Load every profile YAML under profiles/{models,engines,drafters,hardware}/, validate, cross-check.

All problems are collected and raised together as one ProfileError whose message
has one line per problem: `file: key.path: value: problem`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, overload
from collections.abc import Mapping

import yaml
from pydantic import ValidationError

from .. import safeyaml
from ..catalog import Catalog
from ..errors import ProfileError
from .schema import KINDS, SCHEMAS, Documented, DrafterProfile, EngineProfile, HardwareProfile, ModelProfile


@dataclass(frozen=True)
class Profiles:
    models: dict[str, ModelProfile] = field(default_factory=dict)
    engines: dict[str, EngineProfile] = field(default_factory=dict)
    drafters: dict[str, DrafterProfile] = field(default_factory=dict)
    hardware: dict[str, HardwareProfile] = field(default_factory=dict)
    root: Path | None = None
    files: dict[tuple[str, str], Path] = field(default_factory=dict)

    def kind(self, kind: str) -> Mapping[str, Documented]:
        if kind not in KINDS:
            raise ProfileError(f"unknown profile kind {kind!r} (one of {', '.join(KINDS)})")
        return getattr(self, kind)

    @overload
    def get(self, kind: Literal["models"], pid: str | None) -> ModelProfile: ...
    @overload
    def get(self, kind: Literal["engines"], pid: str | None) -> EngineProfile: ...
    @overload
    def get(self, kind: Literal["drafters"], pid: str | None) -> DrafterProfile: ...
    @overload
    def get(self, kind: Literal["hardware"], pid: str | None) -> HardwareProfile: ...
    @overload
    def get(self, kind: str, pid: str | None) -> Documented: ...

    def get(self, kind: str, pid: str | None) -> Documented:
        """The profile `kind/pid` (typed by the kind named), or one ProfileError line listing the known ids."""
        table = self.kind(kind)
        if pid is None or pid not in table:
            known = ", ".join(sorted(table)) or "none"
            raise ProfileError(f"{kind}/{pid}: no such profile (known: {known})")
        return table[pid]


@dataclass
class _Problems:
    items: list[str] = field(default_factory=list)

    def add(self, file: Path | str, path: str, value: object, problem: str) -> None:
        shown = _short(value)
        self.items.append(f"{file}: {path or '<root>'}: {shown}: {problem}")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _loc_path(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts)


def _value_at(data: Any, loc: tuple[int | str, ...]) -> Any:
    cur = data
    for item in loc:
        try:
            cur = cur[item]
        except (KeyError, IndexError, TypeError):
            return "<missing>"
    return cur


def _validate(kind: str, path: Path, data: Any, problems: _Problems) -> Any | None:
    schema = SCHEMAS[kind]
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        for e in exc.errors():
            loc = tuple(x for x in e["loc"] if not (isinstance(x, str) and x.startswith("function-")))
            msg = e["msg"].removeprefix("Value error, ")
            if e["type"] == "extra_forbidden":
                msg = "unknown key"
            problems.add(path, _loc_path(loc), _value_at(data, loc), msg)
    return None


def read_profile_file(kind: str, path: Path, problems: _Problems) -> Any | None:
    try:
        data = safeyaml.load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        problems.add(path, "", path.name, f"not UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})")
        return None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "<yaml>"
        problems.add(path, where, path.name, f"malformed YAML: {getattr(exc, 'problem', exc)}")
        return None
    except OSError as exc:
        problems.add(path, "", path.name, f"cannot read: {exc.strerror}")
        return None
    if not isinstance(data, dict):
        problems.add(path, "", type(data).__name__, "a profile must be a mapping")
        return None
    stem = path.stem
    if "id" not in data:
        data = {"id": stem, **data}
    elif data["id"] != stem:
        problems.add(path, "id", data["id"], f"must match the file name {stem!r}")
    return _validate(kind, path, data, problems)


def _cross_check(p: Profiles, problems: _Problems) -> None:
    f = p.files
    for mid, m in p.models.items():
        path = f[("models", mid)]
        if m.default_weights not in m.weights:
            problems.add(path, "default_weights", m.default_weights,
                         f"no such weight variant (have: {', '.join(sorted(m.weights))})")
        for i, drafter in enumerate(m.drafters):
            if drafter not in p.drafters:
                problems.add(path, f"drafters[{i}]", drafter, "unknown drafter")
            elif mid not in p.drafters[drafter].models:
                problems.add(path, f"drafters[{i}]", drafter, f"drafter does not list model {mid!r}")
        for g_i, g in enumerate(m.layer_groups):
            if g.kind != "linear" and g.kv_heads and m.num_attention_heads % g.kv_heads:
                problems.add(path, f"layer_groups[{g_i}].kv_heads", g.kv_heads,
                             f"does not divide num_attention_heads {m.num_attention_heads}")
        for wid, w in m.weights.items():
            for k_i, kb in enumerate(w.known_broken):
                for e_i, engine in enumerate(kb.engines):
                    if engine not in p.engines:
                        problems.add(path, f"weights.{wid}.known_broken[{k_i}].engines[{e_i}]", engine,
                                     "unknown engine")
    for did, d in p.drafters.items():
        path = f[("drafters", did)]
        for i, mid in enumerate(d.models):
            if mid not in p.models:
                problems.add(path, f"models[{i}]", mid, "unknown model")
    for eid, e in p.engines.items():
        path = f[("engines", eid)]
        for k_i, kb in enumerate(e.known_broken):
            for e_i, other in enumerate(kb.engines):
                if other not in p.engines:
                    problems.add(path, f"known_broken[{k_i}].engines[{e_i}]", other, "unknown engine")


def load_profiles_dir(root: Path) -> Profiles:
    """Load and cross-check every profile under `root` (a profiles/ directory)."""
    root = Path(root)
    problems = _Problems()
    if not root.is_dir():
        raise ProfileError(f"{root}: profiles directory does not exist")
    tables: dict[str, dict[str, Any]] = {k: {} for k in KINDS}
    files: dict[tuple[str, str], Path] = {}
    for kind in KINDS:
        kdir = root / kind
        if not kdir.is_dir():
            continue
        for path in sorted(kdir.iterdir()):
            if path.suffix not in (".yaml", ".yml") or path.name.startswith("."):
                continue
            obj = read_profile_file(kind, path, problems)
            files[(kind, path.stem)] = path
            if obj is not None:
                tables[kind][obj.id] = obj
    for entry in sorted(root.iterdir()):
        if entry.is_dir() and entry.name not in KINDS and not entry.name.startswith("."):
            problems.add(entry, "", entry.name, f"unknown profile kind directory (expected {', '.join(KINDS)})")
    profiles = Profiles(**tables, root=root, files=files)
    _cross_check(profiles, problems)
    if problems.items:
        n = len(problems.items)
        if n == 1:  # one problem, one line
            raise ProfileError(problems.items[0])
        raise ProfileError(f"{n} profile problems:\n  " + "\n  ".join(problems.items))
    return profiles


_CACHE: dict[tuple[str, float, int], Profiles] = {}


def load_profiles(catalog: Catalog) -> Profiles:
    """The catalog's profiles, validated and cross-checked (memoized on the directory's mtimes)."""
    root = catalog.profiles_dir
    try:
        stamp = max((p.stat().st_mtime for p in root.rglob("*.y*ml")), default=0.0)
        count = sum(1 for _ in root.rglob("*.y*ml"))
    except OSError:
        stamp, count = 0.0, 0
    key = (str(root), stamp, count)
    if key not in _CACHE:
        _CACHE.clear()
        _CACHE[key] = load_profiles_dir(root)
    return _CACHE[key]


def validate_path(path: Path) -> Profiles:
    """`profiles validate [PATH]`: a profiles dir, a catalog root, or one profile file."""
    path = Path(path)
    if path.is_file():
        kind = path.parent.name
        if kind not in KINDS:
            raise ProfileError(f"{path}: cannot tell the kind; put it under one of {', '.join(KINDS)}/")
        problems = _Problems()
        obj = read_profile_file(kind, path, problems)
        if len(problems.items) == 1:
            raise ProfileError(problems.items[0])
        if problems.items:
            raise ProfileError(f"{len(problems.items)} profile problems:\n  " + "\n  ".join(problems.items))
        assert obj is not None  # read_profile_file returns None only after it recorded a problem
        return Profiles(**{kind: {obj.id: obj}}, root=path.parent.parent, files={(kind, obj.id): path})
    if (path / "profiles").is_dir():
        path = path / "profiles"
    return load_profiles_dir(path)
