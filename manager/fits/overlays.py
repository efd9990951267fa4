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
from collections.abc import Callable

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from ..catalog import Catalog, default_catalog_dir
from ..errors import ManagerError
from ..fsutil import atomic_write, sha256_bytes
from ..overlays.info import OverlayInfo
from ..overlays.manifest import NeededWhen
from ..overlays.readinfo import read_overlays, remember_shipped, shipped_overlays

# Statuses on a pristine release (docs/design.md).
NEEDED = {"pending"}
NATIVE = {"upstream", "not-applicable"}
BROKEN = {"drift", "superseded", "missing-target", "partial", "modified", "error"}


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


def sm_in_range(nw: NeededWhen, sm: float) -> bool:
    """needed_when's min_sm / max_sm (inclusive; either may be absent) hold compute capability sm."""
    return (nw.min_sm is None or sm >= nw.min_sm - 1e-9) and (nw.max_sm is None or sm <= nw.max_sm + 1e-9)


def matches(nw: NeededWhen, d: DeploymentFacts) -> bool:
    """All given conditions must hold (AND); none given never matches unless `always`."""
    if nw.always:
        return True
    given = (nw.families, nw.weight_formats, nw.quant_methods, nw.min_sm, nw.max_sm, nw.head_dims,
             nw.transformers, nw.drafter_model_types, nw.devices)
    if all(v is None for v in given) and not nw.moe:
        return False
    if nw.families is not None and d.family not in nw.families:
        return False
    if nw.weight_formats is not None and d.weight_format not in nw.weight_formats:
        return False
    if nw.quant_methods is not None and (d.quant_method or "") not in nw.quant_methods:
        return False
    if (nw.min_sm is not None or nw.max_sm is not None) and d.device != "cuda":
        return False
    if not sm_in_range(nw, d.sm):
        return False
    if nw.head_dims is not None and not set(nw.head_dims) & set(d.head_dims):
        return False
    if nw.drafter_model_types is not None and d.drafter_model_type not in nw.drafter_model_types:
        return False
    if nw.devices is not None and d.device not in nw.devices:
        return False
    if nw.moe and not d.moe:
        return False
    if nw.transformers is not None:
        try:
            if Version(d.transformers) not in SpecifierSet(nw.transformers):
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
    # Overlays a deployment can need although this catalog lacks them ("needed but not in the
    # catalog"); None: those of the catalog shipped with the project (`shipped_overlays`).
    known: dict[str, OverlayInfo] | None = None
    # the catalog's overlays/release-status.json (manager.fits.releasestatus): version -> id -> digest/status
    shipped: dict = field(default_factory=dict)
    _memo: dict[str, tuple[dict[str, str], str | None]] = field(default_factory=dict)
    calls: int = 0  # how many times status_fn ran (for tests and the benchmark)

    @property
    def digest(self) -> str:
        """Manifests + the overlay engine's own code: either changing invalidates the disk cache."""
        parts = [f"{o.id}:{o.digest}" for o in sorted(self.overlays.values(), key=lambda o: o.id)]
        return sha256_bytes("|".join([*parts, _engine_digest()]).encode())[:16]

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
        if result is None and self.shipped:
            from .releasestatus import shipped_statuses

            got_shipped = shipped_statuses(self.shipped, version, {o.id: o.digest for o in self.overlays.values()
                                                                   if o.invalid is None})
            if got_shipped is not None:
                result = (got_shipped, None)
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
                result = self._from_ranges(version, f"vLLM {version} sources unavailable ({first}); "
                                                    "decided by manifest versions ranges")
        if result is None:
            result = self._from_ranges(version, "no release status available; used manifest versions ranges")
        self._memo[version] = result
        return result

    def _from_ranges(self, version: str, why: str) -> tuple[dict[str, str], str]:
        return ({o.id: ("pending" if o.in_range(version) else "not-applicable") for o in self.overlays.values()}, why)

    def evaluate(self, d: DeploymentFacts, vllm_version: str) -> list[OverlayVerdict]:
        out: list[OverlayVerdict] = []
        seen = set()
        known = self.known if self.known is not None else shipped_overlays()
        for info in sorted(self.overlays.values(), key=lambda o: o.id):
            seen.add(info.id)
            if not matches(info.needed_when, d):
                continue
            if info.invalid:
                out.append(OverlayVerdict(info.id, True, "fail",
                                          f"{info.id}: matches but its manifest is invalid: {info.invalid}"))
                continue
            stats, warn = self.statuses(vllm_version)
            st = stats.get(info.id, "pending" if info.in_range(vllm_version) else "not-applicable")
            if info.kernel and st not in BROKEN - {"missing-target"}:
                st = "pending"  # a kernel overlay has no native counterpart upstream
            if st in NEEDED:
                out.append(OverlayVerdict(info.id, True, "warn" if warn else "pass",
                                          f"{info.id}: needed, pending on vLLM {vllm_version}"
                                          + (f" ({warn})" if warn else "")))
            elif st in NATIVE:
                out.append(OverlayVerdict(info.id, False, "pass",
                                          f"{info.id}: not needed on vLLM {vllm_version} ({st})"))
            elif st == "superseded" and (native := _native_from(info, known)).native_on(vllm_version):
                out.append(OverlayVerdict(info.id, False, "pass",
                                          f"{info.id}: not needed on vLLM {vllm_version} "
                                          f"(superseded; fix native since {native.native_from})"))
            elif st == "applied":
                out.append(OverlayVerdict(info.id, True, "pass", f"{info.id}: needed, already applied"))
            else:
                out.append(OverlayVerdict(info.id, True, "fail", f"{info.id}: needed but {st} on vLLM {vllm_version}"))
        for oid, info in sorted(known.items()):
            if oid in seen or not matches(info.needed_when, d) or info.native_on(vllm_version):
                continue
            out.append(OverlayVerdict(oid, True, "fail",
                                      f"{oid}: needed on vLLM {vllm_version} but not in the catalog"))
        return out


def _native_from(info: OverlayInfo, known: dict[str, OverlayInfo]) -> OverlayInfo:
    """The manifest that says where the fix is native: this one, or (when its manifest predates
    `native_from`) the shipped one of the same id."""
    return info if info.native_from is not None else known.get(info.id, info)


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


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def build_index(catalog: Catalog, *, use_releases: bool = True, cache_dir: Path | None = None) -> OverlayIndex:
    """Read every overlays/<id>/overlay.yaml (`load_manifest`'s reading and validation)."""
    base = catalog.overlays_dir
    infos = read_overlays(base)
    valid_ids = [oid for oid, info in infos.items() if info.invalid is None]
    shipped = default_catalog_dir()
    if shipped is not None and _same_dir(shipped, catalog.root):  # read once: it is the shipped catalog
        remember_shipped(shipped, {oid: infos[oid] for oid in valid_ids})
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
    from .releasestatus import load_shipped

    return OverlayIndex(infos, status_fn=status_fn, cache_dir=cache_dir, shipped=load_shipped(catalog))


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
