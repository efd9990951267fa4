"""The one-line hint for a missing extra, followable however the tool was installed.

overlay-manager is not on PyPI: an extra comes from the checkout or its wheel, or, for an installed
tool, its packages go into the tool's venv (`pipx inject`, `uv tool install --with`). The package
lists mirror pyproject.toml's [project.optional-dependencies] (tests/package/test_extras.py checks).
"""

from __future__ import annotations

EXTRAS: dict[str, tuple[str, ...]] = {
    "inspect": ("httpx>=0.27",),
    "upstream": ("httpx>=0.27",),
    "verify": ("docker>=7",),
    "audit": ("lz4>=4", "zstandard>=0.22"),
    "kernels": ("nvidia-cuda-nvrtc-cu12", "nvidia-cuda-runtime-cu12", "nvidia-cuda-cccl-cu12"),
}


def install_hint(extra: str) -> str:
    """How to add `extra` (one line): pipx, uv tool, or pip from the checkout/wheel."""
    pkgs = " ".join(f"'{p}'" if any(c in p for c in "<>=") else p for p in EXTRAS.get(extra, ()))
    with_args = " ".join(f"--with {p}" for p in pkgs.split()) if pkgs else ""
    return (f"add the [{extra}] extra: `pipx inject overlay-manager {pkgs}`, or `uv tool install --reinstall "
            f"{with_args} CHECKOUT_OR_WHEEL`, or `pip install 'CHECKOUT_OR_WHEEL[{extra}]'` "
            "(overlay-manager is not on PyPI: install from its checkout or the wheel built from it)")
