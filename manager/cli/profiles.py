"""CLI commands for this area (registered on the root group)."""

from __future__ import annotations

import click


def register(cli: click.Group) -> None:
    """Add this area's commands to the root `overlay` group."""
