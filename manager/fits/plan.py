"""plan(): every deployment of a model on N cards that fits, best first, and why the rest do not."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from packaging.version import Version

from ..catalog import Catalog
from ..profiles.loader import Profiles
from ..profiles.tp import TP_SIZES
from .core import FitReport, fits
from .overlays import OverlayIndex

if TYPE_CHECKING:
    from ..inspect import Inspection


@dataclass(frozen=True)
class Rejected:
    deployment: dict[str, Any]
    reasons: list[str]

    def to_json(self) -> dict[str, object]:
        return {"deployment": dict(self.deployment), "reasons": list(self.reasons)}


@dataclass(frozen=True)
class Plan:
    model: str
    hardware: str
    gpus: int
    options: list[FitReport] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "model": self.model, "hardware": self.hardware, "gpus": self.gpus,
            "options": [
                {**r.deployment, "verdict": r.verdict, "overlays": list(r.overlays), "max_ctx": r.memory.max_ctx,
                 "kv_capacity_tokens": r.memory.kv_capacity_tokens,
                 "warnings": [f"{c.id}: {c.message}" for c in r.constraints if c.result == "warn"]}
                for r in self.options
            ],
            "rejected": [r.to_json() for r in self.rejected],
        }


def _bits(profiles: Profiles, model: str, vid: str) -> int:
    w = profiles.models[model].weights[vid]
    return 16 if w.format in ("bf16", "fp16") else (w.bits or 16)


def plan(
    profiles: Profiles,
    *,
    model: str | None = None,
    hardware: str,
    gpus: int = 1,
    engines: list[str] | None = None,
    ctx: int | None = None,
    max_seqs: int | None = None,
    catalog: Catalog | None = None,
    overlay_index: OverlayIndex | None = None,
    checkpoint: Inspection | None = None,
) -> Plan:
    """`checkpoint` (manager.inspect.Inspection): plan for that checkpoint (its config, measured bytes)."""
    if checkpoint is not None:
        from .checkpoint import with_checkpoint

        profiles, model, _, _ = with_checkpoint(profiles, checkpoint)
    m = profiles.get("models", model)
    model = m.id  # the id get() found it under (every table is keyed by its profiles' ids)
    profiles.get("hardware", hardware)
    tps = [t for t in TP_SIZES if t <= gpus]
    engs = engines or sorted(profiles.engines)
    options: list[FitReport] = []
    rejected: list[Rejected] = []
    for tp in tps:
        for eid in engs:
            e = profiles.engines[eid]
            for vid in m.weights:
                kvs = ["auto"] + [k for k in ("fp8",) if k in e.kv_dtypes]
                for kv in kvs:
                    for dr in [None, *m.drafters]:
                        r = fits(profiles, model=model, hardware=hardware, gpus=gpus, tp=tp, weights=vid,
                                 engine=eid, drafter=dr, ctx=ctx, kv_dtype=kv, max_seqs=max_seqs,
                                 catalog=catalog, overlay_index=overlay_index, checkpoint=checkpoint)
                        if r.verdict != "fails":
                            options.append(r)
                        elif kv == "auto" and dr is None:
                            reasons = [f"{c.id}: {c.message}" for c in r.constraints if c.result == "fail"]
                            rejected.append(Rejected(r.deployment, reasons))

    def key(r: FitReport):
        dep = r.deployment
        e = profiles.engines[dep["engine"]]
        return (
            0 if r.verdict == "fits" else 1,
            sum(1 for c in r.constraints if c.result == "warn" and c.id != "nvlink"),
            -_bits(profiles, model, dep["weights"]),
            0 if dep["kv_dtype"] == "auto" else 1,
            0 if dep["drafter"] else 1,
            len(r.overlays),
            -r.memory.max_ctx,
            -Version(e.vllm_version).release[0] * 1000 - Version(e.vllm_version).release[1],
            dep["tp"],
        )

    options.sort(key=key)
    return Plan(model, hardware, gpus, options, rejected)
