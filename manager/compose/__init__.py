"""Compose deployments: registry, rendering, checks, in-container bundle, image verification."""

from .registry import Deployment, Registry, load_registry, parse_registry
from .render import RenderOptions, ServicePlan, render_compose, render_entrypoint, validate_compose_text

__all__ = [
    "Deployment", "Registry", "load_registry", "parse_registry",
    "RenderOptions", "ServicePlan", "render_compose", "render_entrypoint", "validate_compose_text",
]
