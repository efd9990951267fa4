"""overlay-manager: sentinel-marked overlays, fit checks and compose deployments for vLLM."""

__version__ = "0.1.0"
