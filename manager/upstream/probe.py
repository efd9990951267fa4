"""Source probes: the overlay engine's status on the sources an engine actually contains.

Stock engines (`upstream_ref == v<vllm_version>`) are probed on the real release sdist via
`manager.overlays.status_on_release`. Engines pinned to a commit (nightly/fork images) are
only probed when their sources are given (`--probe-root ENGINE=DIR`, e.g. a tree copied out
of the image): a release's sources are not the pin's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast
from collections.abc import Iterable, Sequence

from .. import releases
from ..catalog import Catalog
from ..errors import ManagerError
from ..overlays.model import OverlayStatus, Status, TargetStatus
from .check import EngineInfo, EngineProbe, OverlayInfo, sdist_commit
from .verdict import ProbeFacts


def release_cached(version: str) -> Path | None:
    """The cached pristine tree of `version` when it can be had without the network."""
    base = releases.cache_dir()
    if (base / "trees" / version / ".complete").exists() or (base / "sdists" / f"vllm-{version}.tar.gz").exists():
        return releases.pristine_tree(version)
    return None


def _facts(overlays: Iterable[OverlayStatus], where: str) -> dict[str, ProbeFacts]:
    out: dict[str, ProbeFacts] = {}
    for ov in overlays:
        status = ov.status or None
        line = f"probe: {status} at {where}"
        if status in ("pending", "applied"):
            line += ": the overlay's anchors are there, no native fix detected"
        else:
            details = [f"{t.path}: {t.detail}" for t in ov.targets
                       if t.detail and t.status not in ("pending", "applied")]
            if details:
                line += f" [{'; '.join(details[:3])}]"
        out[ov.id] = ProbeFacts(status, (line,))
    return out


class CatalogProber:
    """Probe engines with the catalog's overlays on release sources (or given source roots)."""

    def __init__(self, catalog: Catalog, *, offline: bool = False, roots: dict[str, Path] | None = None,
                 reports: dict[str, Path] | None = None) -> None:
        self.catalog = catalog
        self.offline = offline
        self.roots = {k: Path(v) for k, v in (roots or {}).items()}
        self.reports = {k: Path(v) for k, v in (reports or {}).items()}

    def __call__(self, engine: EngineInfo, overlays: Sequence[OverlayInfo]) -> EngineProbe:
        ids = [o.id for o in overlays]
        try:
            if engine.id in self.reports:
                return probe_report_file(engine, self.reports[engine.id])
            if engine.id in self.roots:
                return self._probe_root(engine, ids, self.roots[engine.id])
            if engine.is_stock_release:
                return self._probe_release(engine, ids)
            return self._probe_commit_pin(engine, ids)
        except ManagerError as exc:
            return EngineProbe(unavailable=f"probe failed: {exc}")

    def _probe_release(self, engine: EngineInfo, ids: list[str]) -> EngineProbe:
        from ..overlays import status_on_release

        version = engine.vllm_version
        if self.offline and release_cached(version) is None:
            return EngineProbe(unavailable=f"vllm {version} sources not cached (offline)")
        report = status_on_release(version, self.catalog, ids=ids)
        root = releases.pristine_tree(version)
        commit = sdist_commit(root)
        return EngineProbe(
            statuses=_facts(report.overlays, f"vllm {version} (release sources)"),
            pin_commit=commit,
            pin_commit_source=f"vllm/_version.py __commit_id__ in the {version} sdist" if commit else "",
        )

    def _probe_commit_pin(self, engine: EngineInfo, ids: list[str]) -> EngineProbe:
        """A commit pin is probed on the release sources only when that release *is* the pin."""
        no = EngineProbe(unavailable=(
            f"engine pinned to commit {engine.upstream_ref}, not a release tag; "
            f"pass --probe-root {engine.id}=DIR with its sources"))
        version = engine.vllm_version
        if not version or (self.offline and release_cached(version) is None):
            return no
        commit = sdist_commit(releases.pristine_tree(version))
        pin = engine.upstream_ref.lower()
        if not commit or not (commit.startswith(pin) or pin.startswith(commit)):
            return no
        got = self._probe_release(engine, ids)
        where = (f"vllm {version} release sources = pin {engine.upstream_ref} "
                 f"(vllm/_version.py __commit_id__ g{commit}); the image's own changes are not probed")
        return EngineProbe(
            statuses={k: ProbeFacts(v.status, tuple(e.replace(f"vllm {version} (release sources)", where)
                                                    for e in v.evidence))
                      for k, v in got.statuses.items()},
            unavailable=got.unavailable, pin_commit=got.pin_commit, pin_commit_source=got.pin_commit_source,
        )

    def _probe_root(self, engine: EngineInfo, ids: list[str], root: Path) -> EngineProbe:
        from ..overlays import load_overlays, status

        if not (root / "vllm").is_dir():
            return EngineProbe(unavailable=f"--probe-root {engine.id}={root}: no vllm/ package there")
        wanted = [o for o in load_overlays(self.catalog) if o.manifest.id in ids]
        report = status(wanted, root)
        commit = sdist_commit(root)
        return EngineProbe(
            statuses=_facts(report.overlays, f"{engine.id} sources in {root}"),
            pin_commit=commit,
            pin_commit_source=f"vllm/_version.py __commit_id__ in {root}" if commit else "",
        )


def probe_report_file(engine: EngineInfo, path: Path) -> EngineProbe:
    """Statuses from `overlay verify --image IMAGE --json` or `overlay status --json` output saved in a file."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        return EngineProbe(unavailable=f"--probe-report {engine.id}={path}: unreadable ({type(exc).__name__})")
    where = f"{engine.id}"
    status = data.get("status") if isinstance(data, dict) else None
    if isinstance(data, dict) and isinstance(data.get("image"), str):
        where += f" image {data['image']} (overlay verify output {path})"
    else:
        where += f" (overlay status output {path})"
    report = status if isinstance(status, dict) else data
    overlays = report.get("overlays") if isinstance(report, dict) else None
    if isinstance(overlays, dict):  # the verify summary: {id: status}
        items = [OverlayStatus(str(k), _status(v)) for k, v in overlays.items()]
    elif isinstance(overlays, list):
        items = [
            OverlayStatus(
                str(o["id"]), _status(o.get("status")),
                tuple(TargetStatus(_str(t.get("path")), _status(t.get("status")), _str(t.get("detail")))
                      for t in o.get("targets") or () if isinstance(t, dict)),
            )
            for o in overlays if isinstance(o, dict) and o.get("id")
        ]
    else:
        return EngineProbe(unavailable=f"--probe-report {engine.id}={path}: no overlay statuses in it")
    return EngineProbe(statuses=_facts(items, where))


def _status(value: object) -> Status:
    """A status string of a report file, as written (only compared against known statuses, never trusted)."""
    return cast(Status, _str(value))


def _str(value: object) -> str:
    """A JSON value as the text the report would show ("" for null/absent)."""
    return "" if value is None else str(value)
