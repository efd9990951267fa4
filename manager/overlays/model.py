"""Result types of the overlay engine (frozen dataclasses; the runner never raises for an expected outcome)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal, get_args

# An overlay's (or one target's) status: these strings are printed and in --json; mypy checks every literal use.
# Worst first: an overlay's status is the worst of its targets' statuses.
Status = Literal[
    "error",
    "modified",
    "partial",
    "drift",
    "missing-target",
    "superseded",
    "pending",
    "applied",
    "upstream",
    "not-applicable",
]
SEVERITY: list[Status] = list(get_args(Status))
FAILING: frozenset[Status] = frozenset({"drift", "partial", "modified", "error"})  # `overlay status` exits non-zero


def worst(statuses: list[Status]) -> Status:
    return min(statuses, key=SEVERITY.index) if statuses else "not-applicable"


@dataclass(frozen=True)
class TargetStatus:
    path: str
    status: Status
    detail: str = ""


@dataclass(frozen=True)
class OverlayStatus:
    id: str
    status: Status
    targets: tuple[TargetStatus, ...] = ()
    title: str = ""
    sentinel_version: int = 0

    @property
    def detail(self) -> str:
        return "; ".join(t.detail for t in self.targets if t.status == self.status and t.detail)


@dataclass(frozen=True)
class StatusReport:
    root: str
    package_version: str | None
    overlays: tuple[OverlayStatus, ...]
    source: str = "sources"  # "sources" (files parsed) or "ledger" (hashes matched the ledger)
    interrupted: str = ""  # non-empty: an apply's journal is on disk (a killed or failed run); status fails


    def by_id(self, overlay_id: str) -> OverlayStatus:
        for o in self.overlays:
            if o.id == overlay_id:
                return o
        raise KeyError(overlay_id)

    @property
    def failing(self) -> bool:
        return bool(self.interrupted) or any(o.status in FAILING for o in self.overlays)

    def to_json(self) -> dict[str, object]:
        return {
            "root": self.root,
            "package_version": self.package_version,
            "source": self.source,
            "interrupted": self.interrupted or None,
            "overlays": [
                {
                    "id": o.id,
                    "title": o.title,
                    "status": o.status,
                    "sentinel_version": o.sentinel_version,
                    "targets": [asdict(t) for t in o.targets],
                }
                for o in self.overlays
            ],
        }


@dataclass(frozen=True)
class FileChange:
    path: str
    before: bytes | None  # None: the file did not exist
    after: bytes | None  # None: the file is deleted
    overlays: tuple[str, ...] = ()

    @property
    def verb(self) -> str:
        if self.before is None:
            return "create"
        if self.after is None:
            return "delete"
        return "updated" if self.before != self.after else "identical"


@dataclass(frozen=True)
class ApplyResult:
    root: str
    package_version: str | None
    changes: tuple[FileChange, ...]
    statuses: StatusReport
    skipped: tuple[tuple[str, str], ...] = ()  # (overlay id, why)
    notes: tuple[str, ...] = ()
    dry_run: bool = False
    fast_path: bool = False  # decided from the ledger's hashes without parsing

    @property
    def changed(self) -> bool:
        return any(c.verb != "identical" for c in self.changes)

    def to_json(self) -> dict[str, object]:
        return {
            "root": self.root,
            "package_version": self.package_version,
            "dry_run": self.dry_run,
            "fast_path": self.fast_path,
            "changes": [{"path": c.path, "verb": c.verb, "overlays": list(c.overlays)} for c in self.changes],
            "skipped": [{"id": i, "why": w} for i, w in self.skipped],
            "notes": list(self.notes),
            "status": self.statuses.to_json()["overlays"],
        }


@dataclass(frozen=True)
class RevertResult:
    root: str
    changes: tuple[FileChange, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)
