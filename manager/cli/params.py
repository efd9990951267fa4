"""Click parameter types whose values come from the catalog: validation with "did you mean",
and shell completion of overlay ids, deployment slugs and profile ids.

Values are read from the catalog the command runs with (`--catalog` / $OVERLAY_CATALOG, else the
shipped one). During shell completion the root callback has not run, so the catalog is located
from the root's parsed `--catalog` instead; any failure there completes nothing (never a traceback
in the user's shell).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Iterable

import click
from click.shell_completion import CompletionItem

from ..catalog import Catalog
from ..errors import CatalogError

if TYPE_CHECKING:
    from ..profiles import Profiles

_cache: dict[tuple[str, str], list[str]] = {}


def catalog_of(ctx: click.Context | None) -> Catalog:
    root = ctx.find_root() if ctx is not None else None
    app = getattr(root, "obj", None)
    if app is not None and hasattr(app, "catalog"):
        return app.catalog
    arg = root.params.get("catalog") if root is not None else None
    return Catalog.locate(arg)


def _profiles(catalog: Catalog) -> Profiles:
    from ..profiles import load_profiles

    return load_profiles(catalog)


def _overlay_ids(catalog: Catalog) -> list[str]:
    from ..state import catalog_overlay_ids

    return catalog_overlay_ids(str(catalog.overlays_dir)) or []


def _slugs(catalog: Catalog) -> list[str]:
    from ..compose.registry import load_registry

    return sorted(load_registry(catalog).deployments)


def _profile_refs(catalog: Catalog) -> list[str]:
    p = _profiles(catalog)
    return [f"{k}/{pid}" for k in ("models", "engines", "drafters", "hardware") for pid in sorted(p.kind(k))]


SOURCES: dict[str, Callable[[Catalog], Iterable[str]]] = {
    "overlay": _overlay_ids,
    "deployment": _slugs,
    "model": lambda c: sorted(_profiles(c).models),
    "hardware": lambda c: sorted(_profiles(c).hardware),
    "engine": lambda c: sorted(_profiles(c).engines),
    "drafter": lambda c: sorted(_profiles(c).drafters),
    # any model's weight variant (fits() then says when the chosen model has no such variant)
    "weights": lambda c: sorted({w for m in _profiles(c).models.values() for w in m.weights}),
    "kv-dtype": lambda c: sorted({"auto", *(k for e in _profiles(c).engines.values() for k in e.kv_dtypes)}),
    "profile": _profile_refs,
}


def values(kind: str, ctx: click.Context | None) -> list[str]:
    catalog = catalog_of(ctx)
    key = (str(catalog.root), kind)
    if key not in _cache:
        _cache[key] = list(SOURCES[kind](catalog))
    return _cache[key]


_VERSIONED = __import__("re").compile(r"^(?P<head>.*?)(?P<ver>\d+(?:\.\d+)+)(?P<tail>.*)$")


def _nearest_versions(value: str, known: list[str]) -> list[str]:
    """For a versioned id (vllm-0.21.0): the known ids of the same name just below and above it."""
    m = _VERSIONED.match(value)
    if not m:
        return []
    key = lambda v: tuple(int(x) for x in v.split("."))  # noqa: E731
    want = key(m["ver"])
    same = []
    for k in known:
        km = _VERSIONED.match(k)
        if km and km["head"] == m["head"] and km["tail"] == m["tail"]:
            same.append((key(km["ver"]), k))
    below = [k for v, k in sorted(same) if v < want][-1:]
    above = [k for v, k in sorted(same) if v > want][:1]
    return below + above


def did_you_mean(value: str, known: list[str]) -> str:
    import difflib

    low = value.lower()
    prefixed = sorted((k for k in known if k.lower().startswith(low)), key=len)
    near = [] if prefixed else _nearest_versions(value, known)  # vllm-0.21.0: 0.20.0 or 0.22.0, not 0.31.0
    if near:
        return "did you mean " + " or ".join(repr(k) for k in near) + "?"
    close = (prefixed
             or sorted((k for k in known if low in k.lower()), key=len)
             or difflib.get_close_matches(value, known, n=1, cutoff=0.5))
    if close:
        return f"did you mean {close[0]!r}?"
    shown = ", ".join(known[:8]) + (f", +{len(known) - 8} more" if len(known) > 8 else "")
    return f"known: {shown or 'none'}"


# the short names users type for vLLM's --kv-cache-dtype values
ALIASES: dict[str, dict[str, str]] = {
    "kv-dtype": {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "f16": "float16",
                 "fp8_e4m3": "fp8", "fp8e4m3": "fp8"},
}


class CatalogChoice(click.ParamType):
    """One of the catalog's values of `kind`; `validate=False` only completes (e.g. ids checked later)."""

    def __init__(self, kind: str, validate: bool = True) -> None:
        self.kind = kind
        self.name = kind
        self.validate = validate

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not self.validate or not isinstance(value, str):
            return value
        known = values(self.kind, ctx)
        if value in known:
            return value
        alias = ALIASES.get(self.kind, {}).get(value.lower())
        if alias in known:
            return alias
        opt = param.opts[0] if param is not None and param.opts else self.kind
        raise CatalogError(f"{opt}: {self.kind} {value!r} is not in the catalog; {did_you_mean(value, known)}")

    def shell_complete(self, ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
        try:
            known = values(self.kind, ctx)
        except Exception:  # noqa: BLE001 - completion must never print a traceback into a shell
            return []
        return [CompletionItem(v) for v in known if v.startswith(incomplete)]


POSITIVE = click.IntRange(min=1)


# Options several commands share.
root_option = click.option(
    "--root",
    "root",
    type=click.Path(file_okay=False, path_type=str),
    default=None,
    help="Directory holding the vllm/ package (default: where python would import it from).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Machine output (JSON) on stdout.")
wait_option = click.option(
    "--wait", "wait", type=click.FloatRange(min=0), default=600.0, show_default=True, metavar="SECONDS",
    help="How long to wait for the root's lock while another run holds it (0: fail at once).",
)
