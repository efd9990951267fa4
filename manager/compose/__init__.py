"""Compose deployments: registry, rendering, checks, in-container bundle, image verification."""

from typing import TYPE_CHECKING, Any

from .registry import Deployment, Registry, load_registry, parse_registry

__all__ = [
    "Deployment",
    "Registry",
    "RenderOptions",
    "ServicePlan",
    "load_registry",
    "parse_registry",
    "render_compose",
    "render_entrypoint",
    "validate_compose_text",
]

if TYPE_CHECKING:  # the names __getattr__ loads lazily, for type checkers and editors
    from .render import RenderOptions, ServicePlan, render_compose, render_entrypoint, validate_compose_text

_RENDER = {"RenderOptions", "ServicePlan", "render_compose", "render_entrypoint", "validate_compose_text"}


def __getattr__(name: str) -> Any:
    # rendering needs jinja2, which the in-container bundle leaves out: imported on first use only
    if name in _RENDER:
        from . import render

        return getattr(render, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
