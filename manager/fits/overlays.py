"""Which overlays a deployment needs, and whether each exists and applies to the engine's vLLM.

An overlay is needed when its manifest's `needed_when` matches the deployment AND its
status on the engine's vLLM release is `pending` (the fix is not native there).
Status comes from `manager.overlays.status_on_release` (real release sources,
downloaded once), memoized in-process and on disk keyed by version + manifest hash.
When the sources cannot be had, the manifest's `versions` range decides, with a warning.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from ..catalog import Catalog
from ..errors import ManagerError
from ..fsutil import atomic_write, sha256_bytes

# Statuses on a pristine release (docs/design.md).
NEEDED = {"pending"}
NATIVE = {"upstream", "not-applicable"}
BROKEN = {"drift", "superseded", "missing-target", "partial", "modified", "error"}

# Overlays the project knows a deployment can need, used only when the catalog lacks the
# manifest (so "needed but missing" can be reported). `native_from`: first vLLM release
# that has the fix natively (from the overlay briefs / manifests' drop_when).
EXPECTED: dict[str, dict[str, Any]] = {
    "vllm-pr40886-gemma4-awq-moe-keys": {
        "needed_when": {"families": ["gemma4"], "weight_formats": ["compressed-tensors"]},
        "moe_only": True,
        "native_from": "0.22.0",
    },
    "gemma4-convertor-per-layer": {
        "needed_when": {"families": ["gemma4", "gemma4_unified"], "transformers": ">=5.15"},
        "native_from": "0.28.0",
    },
    "gemma4-unified-port": {"needed_when": {"families": ["gemma4_unified"]}, "native_from": "0.24.0"},
    "gemma4-mtp-per-layer": {
        "needed_when": {"families": ["gemma4"], "transformers": ">=5.15", "drafter_model_types": ["gemma4_mtp"]},
        "native_from": "0.28.0",
    },
    "gemma4-mtp-cpu-kv-sharing": {
        "needed_when": {"families": ["gemma4"], "drafter_model_types": ["gemma4_mtp"], "devices": ["cpu"]},
        "native_from": "0.27.1",
    },
    "dynamo-dict-caches": {"needed_when": {"max_sm": 7.0}, "native_from": None},
    "sm70-d512-attention": {"needed_when": {"max_sm": 7.0, "head_dims": [512]}, "native_from": None},
}


@dataclass(frozen=True)
class OverlayInfo:
    id: str
    needed_when: dict[str, Any]
    versions: str = ""
    kernel: bool = False
    invalid: str | None = None  # the manifest error, when it does not validate
    digest: str = ""
    provides_families: tuple[str, ...] = ()  # model families the overlay ports onto older engines

    def in_range(self, version: str) -> bool:
        if not self.versions:
            return True
        try:
            return Version(version) in SpecifierSet(self.versions)
        except (InvalidSpecifier, InvalidVersion):
            return True


@dataclass(frozen=True)
class DeploymentFacts:
    """What needed_when is evaluated against."""

    family: str
    weight_format: str
    quant_method: str | None
    sm: float
    head_dims: tuple[int, ...]
    transformers: str
    moe: bool
    drafter_model_type: str | None = None
    device: str = "cuda"  # "cpu": SM conditions (min_sm / max_sm) describe CUDA GPUs and never match


def matches(nw: dict[str, Any], d: DeploymentFacts) -> bool:
    """All given keys must hold (AND); an empty mapping never matches unless `always`."""
    keys = {k: v for k, v in nw.items() if v is not None and v is not False}
    if not keys:
        return False
    if keys.get("always"):
        return True
    if "families" in keys and d.family not in keys["families"]:
        return False
    if "weight_formats" in keys and d.weight_format not in keys["weight_formats"]:
        return False
    if "quant_methods" in keys and (d.quant_method or "") not in keys["quant_methods"]:
        return False
    if ("min_sm" in keys or "max_sm" in keys) and d.device != "cuda":
        return False
    if "min_sm" in keys and d.sm < float(keys["min_sm"]) - 1e-9:
        return False
    if "max_sm" in keys and d.sm > float(keys["max_sm"]) + 1e-9:
        return False
    if "head_dims" in keys and not set(keys["head_dims"]) & set(d.head_dims):
        return False
    if "drafter_model_types" in keys and d.drafter_model_type not in keys["drafter_model_types"]:
        return False
    if "devices" in keys and d.device not in keys["devices"]:
        return False
    if "transformers" in keys:
        try:
            if Version(d.transformers) not in SpecifierSet(str(keys["transformers"])):
                return False
        except (InvalidSpecifier, InvalidVersion):
            return False
    return True


@dataclass(frozen=True)
class OverlayVerdict:
    id: str
    needed: bool
    result: str  # pass / warn / fail
    note: str


StatusFn = Callable[[str], dict[str, str]]


@dataclass
class OverlayIndex:
    """The catalog's overlays plus a memoized per-release status lookup."""

    overlays: dict[str, OverlayInfo]
    status_fn: StatusFn | None = None
    cache_dir: Path | None = None
    _memo: dict[str, tuple[dict[str, str], str | None]] = field(default_factory=dict)
    calls: int = 0  # how many times status_fn ran (for tests and the benchmark)

    @property
    def digest(self) -> str:
        """Manifests + the overlay engine's own code: either changing invalidates the disk cache."""
        parts = [f"{o.id}:{o.digest}" for o in sorted(self.overlays.values(), key=lambda o: o.id)]
        return sha256_bytes("|".join(parts + [_engine_digest()]).encode())[:16]

    def statuses(self, version: str) -> tuple[dict[str, str], str | None]:
        """id -> status on `version`, and a warning when it came from the versions range."""
        if version in self._memo:
            return self._memo[version]
        result: tuple[dict[str, str], str | None] | None = None
        disk = self.cache_dir / f"overlay-status-{version}-{self.digest}.json" if self.cache_dir else None
        if disk is not None and disk.is_file():
            try:
                result = (json.loads(disk.read_text()), None)
            except (OSError, ValueError):
                result = None
        if result is None and self.status_fn is not None:
            try:
                self.calls += 1
                got = self.status_fn(version)
                result = (dict(got), None)
                if disk is not None:
                    try:
                        atomic_write(disk, json.dumps(got, sort_keys=True).encode())
                    except OSError:
                        pass
            except ManagerError as exc:
                first = str(exc).splitlines()[0][:80]
                result = self._from_ranges(version, f"vLLM {version} sources unavailable ({first}); decided by manifest versions ranges")
        if result is None:
            result = self._from_ranges(version, "no release status available; used manifest versions ranges")
        self._memo[version] = result
        return result

    def _from_ranges(self, version: str, why: str) -> tuple[dict[str, str], str]:
        return ({o.id: ("pending" if o.in_range(version) else "not-applicable") for o in self.overlays.values()}, why)

    def evaluate(self, d: DeploymentFacts, vllm_version: str) -> list[OverlayVerdict]:
        out: list[OverlayVerdict] = []
        seen = set()
        for info in sorted(self.overlays.values(), key=lambda o: o.id):
            seen.add(info.id)
            if not matches(info.needed_when, d):
                continue
            if info.invalid:
                out.append(OverlayVerdict(info.id, True, "fail", f"{info.id}: matches but its manifest is invalid: {info.invalid}"))
                continue
            stats, warn = self.statuses(vllm_version)
            st = stats.get(info.id, "pending" if info.in_range(vllm_version) else "not-applicable")
            if info.kernel and st not in BROKEN - {"missing-target"}:
                st = "pending"  # a kernel overlay has no native counterpart upstream
            if st in NEEDED:
                out.append(OverlayVerdict(info.id, True, "warn" if warn else "pass",
                                          f"{info.id}: needed, pending on vLLM {vllm_version}" + (f" ({warn})" if warn else "")))
            elif st in NATIVE:
                out.append(OverlayVerdict(info.id, False, "pass", f"{info.id}: not needed on vLLM {vllm_version} ({st})"))
            elif st == "superseded" and _native(info.id, vllm_version):
                out.append(OverlayVerdict(info.id, False, "pass",
                                          f"{info.id}: not needed on vLLM {vllm_version} (superseded; fix native since {EXPECTED[info.id]['native_from']})"))
            elif st == "applied":
                out.append(OverlayVerdict(info.id, True, "pass", f"{info.id}: needed, already applied"))
            else:
                out.append(OverlayVerdict(info.id, True, "fail", f"{info.id}: needed but {st} on vLLM {vllm_version}"))
        for oid, exp in EXPECTED.items():
            if oid in seen or not matches(exp["needed_when"], d):
                continue
            if exp.get("moe_only") and not d.moe:
                continue
            nf = exp.get("native_from")
            if nf and Version(vllm_version) >= Version(nf):
                continue
            out.append(OverlayVerdict(oid, True, "fail", f"{oid}: needed on vLLM {vllm_version} but not in the catalog"))
        return out


_ENGINE_DIGEST: list[str] = []


def _engine_digest() -> str:
    if not _ENGINE_DIGEST:
        pkg = Path(__file__).resolve().parent.parent / "overlays"
        h = []
        for f in sorted(pkg.rglob("*.py")):
            try:
                h.append(sha256_bytes(f.read_bytes())[:12])
            except OSError:
                pass
        _ENGINE_DIGEST.append(sha256_bytes("".join(h).encode())[:16])
    return _ENGINE_DIGEST[0]


def _native(oid: str, version: str) -> bool:
    nf = EXPECTED.get(oid, {}).get("native_from")
    try:
        return bool(nf) and Version(version) >= Version(nf)
    except InvalidVersion:
        return False


def _read_raw(path: Path) -> tuple[dict[str, Any], bytes]:
    data = path.read_bytes()
    raw = yaml.safe_load(data)
    return (raw if isinstance(raw, dict) else {}), data


def build_index(catalog: Catalog, *, use_releases: bool = True, cache_dir: Path | None = None) -> OverlayIndex:
    """Read every overlays/<id>/overlay.yaml (validated by the overlay engine when it can)."""
    base = catalog.overlays_dir
    infos: dict[str, OverlayInfo] = {}
    valid_ids: list[str] = []
    if base.is_dir():
        try:
            from ..overlays.manifest import load_manifest
        except ImportError:  # pragma: no cover - the overlay engine ships with the project
            load_manifest = None  # type: ignore[assignment]
        for d in sorted(p for p in base.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
            mf = d / "overlay.yaml"
            if not mf.is_file():
                continue
            try:
                raw, data = _read_raw(mf)
            except (OSError, yaml.YAMLError) as exc:
                infos[d.name] = OverlayInfo(d.name, {}, invalid=f"unreadable: {exc}")
                continue
            invalid = None
            if load_manifest is not None:
                try:
                    load_manifest(mf)
                except ManagerError as exc:
                    first = str(exc).splitlines()[0].split("; ")[0].replace(str(mf) + ": ", "")
                    n = str(exc).count("; ") + 1
                    invalid = first[:100] + (f" (+{n - 1} more)" if n > 1 else "")
            nw = raw.get("needed_when") or {}
            oid = str(raw.get("id") or d.name)
            infos[oid] = OverlayInfo(
                id=oid,
                needed_when=dict(nw) if isinstance(nw, dict) else {},
                versions=str(raw.get("versions") or ""),
                kernel="kernels" in raw,
                invalid=invalid,
                digest=sha256_bytes(data)[:16],
                provides_families=tuple(str(f) for f in (raw.get("provides_families") or [])
                                        if isinstance(raw.get("provides_families"), list)),
            )
            if invalid is None:
                valid_ids.append(oid)
    status_fn = None
    if use_releases and valid_ids:
        def status_fn(version: str, _ids=tuple(valid_ids)) -> dict[str, str]:
            # The overlay engine's own status logic on the release's pristine sources. Built
            # from the manifests that validate, so one unfinished manifest does not hide the rest.
            from ..overlays import Overlay, load_manifest, status
            from ..releases import pristine_tree

            ovs = [Overlay(load_manifest(base / oid / "overlay.yaml"), base / oid) for oid in _ids
                   if (base / oid / "overlay.yaml").is_file()]
            report = status(ovs, pristine_tree(version), use_ledger=False)
            return {o.id: o.status for o in report.overlays}
    if cache_dir is None and use_releases:
        from ..releases import cache_dir as _cd

        cache_dir = Path(os.environ.get("OVERLAY_FITS_CACHE", _cd() / "fits"))
    return OverlayIndex(infos, status_fn=status_fn, cache_dir=cache_dir)


_INDEXES: dict[tuple[str, str], OverlayIndex] = {}


def index_for(catalog: Catalog) -> OverlayIndex:
    """The in-process memoized index for a catalog (rebuilt when a manifest changes)."""
    base = catalog.overlays_dir
    stamp = ""
    if base.is_dir():
        parts = []
        for mf in sorted(base.glob("*/overlay.yaml")):
            try:
                st = mf.stat()
                parts.append(f"{mf}:{st.st_mtime_ns}:{st.st_size}")
            except OSError:
                pass
        stamp = "|".join(parts)
    key = (str(catalog.root), stamp)
    idx = _INDEXES.get(key)
    if idx is None:
        _INDEXES.clear()
        idx = _INDEXES[key] = build_index(catalog)
    return idx
