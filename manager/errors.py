"""The one exception tree. Every user-facing failure is a ManagerError subclass.

The CLI's single handler maps ManagerError -> exit 1 (one line, no traceback),
any other exception -> exit 3 with a crash log, KeyboardInterrupt -> 130.
"""

from __future__ import annotations


class ManagerError(Exception):
    """A user error: bad input, a refused operation, a failed precondition."""

    exit_code = 1


class CatalogError(ManagerError):
    """The catalog directory (overlays/ + profiles/) is missing or malformed."""


class OverlayError(ManagerError):
    """An overlay manifest is invalid, or applying/reverting it failed."""


class ProfileError(ManagerError):
    """A profile YAML is invalid or a reference between profiles dangles."""


class ComposeError(ManagerError):
    """The deployment registry or a rendered compose file is wrong."""


class UpstreamError(ManagerError):
    """Upstream facts (GitHub API, git) could not be obtained."""


class BuildError(ManagerError):
    """A kernel overlay failed to compile or load."""


class ReleaseError(ManagerError):
    """A vLLM release's sources could not be downloaded or extracted."""


class InspectError(ManagerError):
    """A checkpoint (config.json, index, safetensors headers) is unreadable or malformed."""


class EngineError(ManagerError):
    """An engine install could not be read or queried (`overlay engine audit`: a wheel, a site-packages tree, an image);
    the real-engine test harness (testing/engine.py, not shipped) raises it too."""
