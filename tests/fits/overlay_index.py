"""A fixed overlay index for fits() and plan(): the catalog's overlays as OverlayInfo, with the statuses
the overlay engine reports on pristine releases faked (no release tree is read)."""

from __future__ import annotations

from packaging.version import Version

from manager.fits import OverlayIndex, OverlayInfo
from manager.overlays.manifest import NeededWhen


def fake_status(version: str) -> dict[str, str]:
    """Statuses the overlay engine reports on pristine releases (see the overlay manifests' drop_when)."""
    v = Version(version)
    return {
        "vllm-pr40886-gemma4-awq-moe-keys": "pending" if v < Version("0.22.0") else
        ("upstream" if v < Version("0.31.0") else "superseded"),
        "gemma4-convertor-per-layer": "pending" if v < Version("0.28.0") else "upstream",
        "dynamo-dict-caches": "pending",
        "sm70-d512-attention": "pending",
        "sm70-w4-gemm": "pending" if v < Version("0.21") else "not-applicable",
    }


def closed_index() -> OverlayIndex:
    """make_index() that decides alone: overlays the shipped catalog adds later are not "missing" here."""
    idx = make_index()
    idx.known = dict(idx.overlays)
    return idx


def make_index(status_fn=fake_status, drop: tuple[str, ...] = ()) -> OverlayIndex:
    infos = {
        "vllm-pr40886-gemma4-awq-moe-keys": OverlayInfo(
            "vllm-pr40886-gemma4-awq-moe-keys", versions=">=0.19.0", native_from="0.22.0",
            needed_when=NeededWhen(families=["gemma4"], weight_formats=["compressed-tensors"], moe=True)),
        "gemma4-convertor-per-layer": OverlayInfo(
            "gemma4-convertor-per-layer", versions=">=0.19.0", native_from="0.28.0",
            needed_when=NeededWhen(families=["gemma4"], transformers=">=5.15")),
        "dynamo-dict-caches": OverlayInfo("dynamo-dict-caches", needed_when=NeededWhen(max_sm=7.0), versions=">=0.19.0"),
        "sm70-d512-attention": OverlayInfo("sm70-d512-attention", needed_when=NeededWhen(max_sm=7.0, head_dims=[512]),
                                           kernel=True),
        "sm70-w4-gemm": OverlayInfo("sm70-w4-gemm", versions=">=0.19.0,<0.21", kernel=True, needed_when=NeededWhen(
            min_sm=7.0, max_sm=7.0, weight_formats=["compressed-tensors", "nvfp4"])),
    }
    for d in drop:
        infos.pop(d)
    return OverlayIndex(infos, status_fn=status_fn)
