"""Feed an Inspection into fits()/plan(): the checkpoint's own model profile and measured bytes."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from ..profiles.schema import KnownBroken, ModelProfile

if TYPE_CHECKING:
    from ..inspect import Inspection
    from ..profiles.loader import Profiles

# Findings whose predicted failure is a loader error fits() should report under weight-format.
LOADER_FINDINGS = ("fused-moe-quantized-experts", "quantized-per-layer-embedding")


def checkpoint_model(insp: Inspection) -> ModelProfile:
    """The import-config profile of the checkpoint, its one weight variant carrying the loader failures predicted
    per engine."""
    prof: dict[str, Any] = dict(insp.profile)
    vid = prof["default_weights"]
    var = dict(prof["weights"][vid])
    by_msg: dict[tuple[str, str], list[str]] = {}
    for e in insp.engines:
        for f in e.failures:
            if f.finding in LOADER_FINDINGS:
                by_msg.setdefault((f.message, f.source.split(" (loader of")[0]), []).append(e.engine)
    if var.get("format") == "compressed-tensors" and prof.get("moe"):
        # as the catalog's compressed-tensors MoE variants: vLLM's WNA16 MoE falls back to moe_wna16
        var["moe_fallback"] = "moe-wna16"
        var.setdefault("sources", {})["moe_fallback"] = (
            "vLLM compressed-tensors MoE: when Marlin rejects the shape or arch "
            "the WNA16 MoE falls back to the generic moe_wna16 kernel "
            "(as profiles/models/gemma-4-26b-a4b.yaml awq)")
    var["known_broken"] = [KnownBroken(reason=f"predicted by overlay inspect: {msg}", source=src,
                                       engines=engines).model_dump()
                           for (msg, src), engines in by_msg.items()]
    prof["weights"] = {vid: var}
    return ModelProfile.model_validate(prof)


def with_checkpoint(profiles: Profiles, insp: Inspection) -> tuple[Profiles, str, str, dict[int, tuple[int, int]]]:
    """(profiles with the checkpoint's model added, model id, weight variant id, {tp: (bytes per rank, replicated)}).

    Bytes per rank are what the headers give for that TP plus the K->V copy vLLM makes on K=V layers."""
    model = checkpoint_model(insp)
    measured = {s.tp: (s.ranks[0] + s.k_eq_v_copy, s.replicated) for s in insp.weights.tp if s.valid}
    new = dataclasses.replace(profiles, models={**profiles.models, model.id: model})
    return new, model.id, model.default_weights, measured
