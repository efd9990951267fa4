"""Registry invariants (`overlay compose check`) and writing the generated files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol
from collections.abc import Mapping

import yaml

from ..catalog import Catalog
from ..fsutil import write_if_changed
from .registry import Registry
from .render import RenderOptions, ServicePlan, render_compose

if TYPE_CHECKING:
    from ..profiles import Profiles


class EnginePin(Protocol):
    """What the checks read of an engine profile (`EngineProfile` has both)."""

    image: str
    unverified: list[str]


@dataclass(frozen=True)
class Finding:
    slug: str
    check: str
    ok: bool
    message: str
    warn: bool = False  # ok, but rests on something unverified or a deployment marked as not working

    def as_dict(self) -> dict[str, object]:
        return {"slug": self.slug, "check": self.check, "ok": self.ok, "warn": self.warn, "message": self.message}


@dataclass(frozen=True)
class CheckReport:
    findings: tuple[Finding, ...]

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.findings)

    @property
    def problems(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if not f.ok)

    @property
    def warnings(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.ok and f.warn)


def render_all(plans: Mapping[str, ServicePlan], options: RenderOptions | None = None) -> dict[str, str]:
    options = options if options is not None else RenderOptions()
    return {slug: render_compose(plan, options) for slug, plan in sorted(plans.items())}


def write_generated(registry: Registry, rendered: Mapping[str, str]) -> dict[str, str]:
    """Write `compose/generated/<slug>.yml`; returns slug -> create/identical/updated."""
    return {slug: write_if_changed(registry.generated_path(slug), text.encode()) for slug, text in rendered.items()}


def _service(path: Path, slug: str) -> dict | None:
    try:
        data = yaml.safe_load(path.read_text())
        return data["services"][slug]
    except Exception:  # noqa: BLE001 - reported as a finding by the caller
        return None


IMAGES_DIR = "images"  # compose/images/<recipe>/: the recipes of locally built images


def _recipe_finding(registry: Registry, slug: str, pin: str, recipe: str) -> Finding:
    """A locally built image: its recipe exists and names the pinned tag (nothing is pulled or looked up)."""
    where = registry.path.parent / IMAGES_DIR / recipe
    rel = f"{registry.path.parent.name}/{IMAGES_DIR}/{recipe}"
    try:
        data = yaml.safe_load((where / "recipe.yaml").read_text())
    except FileNotFoundError:
        return Finding(slug, "image-pin", True, f"{pin}: local build, but its recipe {rel}/recipe.yaml is missing",
                       warn=True)
    except yaml.YAMLError as exc:
        return Finding(slug, "image-pin", False,
                       f"{rel}/recipe.yaml: not YAML ({exc.__class__.__name__})")
    tag = data.get("tag") if isinstance(data, dict) else None
    if tag != pin:
        return Finding(slug, "image-pin", False, f"{rel}/recipe.yaml: tag {tag!r} != engine pin {pin!r}")
    return Finding(slug, "image-pin", True,
                   f"{pin} (local build from {rel}: `overlay image build {recipe}`; no registry)")


def check_registry(registry: Registry, plans: Mapping[str, ServicePlan],
                   engines: Mapping[str, EnginePin]) -> CheckReport:
    """Unique ports, image = engine pin, TP = device count, fits() or experimental-with-reason, files current."""
    out: list[Finding] = []
    by_port: dict[int, list[str]] = {}
    for slug, dep in sorted(registry.deployments.items()):
        by_port.setdefault(dep.port, []).append(slug)
    for port, slugs in sorted(by_port.items()):
        for slug in slugs:
            if len(slugs) > 1:
                out.append(Finding(slug, "unique-port", False,
                                   f"port {port} is also used by {', '.join(s for s in slugs if s != slug)}"))
            else:
                out.append(Finding(slug, "unique-port", True, f"port {port}"))

    rendered = render_all(plans)
    for slug, dep in sorted(registry.deployments.items()):
        plan = plans[slug]
        path = registry.generated_path(slug)
        # TP equals the device count (registry and generated file)
        if dep.tp != dep.gpus:
            out.append(Finding(slug, "tp-devices", False, f"tp={dep.tp} but gpus={dep.gpus}"))
        else:
            out.append(Finding(slug, "tp-devices", True, f"tp={dep.tp} on {dep.gpus} GPU(s)"))
        # fits() passes, or the deployment is experimental and its note names the failing constraints
        if plan.failing:
            named = all(cid in dep.note for cid in plan.failing)
            if dep.status in ("experimental", "disabled") and named:
                out.append(Finding(slug, "fits", True, f"{dep.status}; fails {', '.join(plan.failing)} (named in note)",
                                   warn=True))
            elif dep.status in ("experimental", "disabled"):
                out.append(Finding(slug, "fits", False,
                                   f"fails {', '.join(plan.failing)}; the note must name the failing constraint"))
            else:
                out.append(Finding(slug, "fits", False,
                                   f"status {dep.status} but fits() fails {', '.join(plan.failing)}"))
        else:
            out.append(Finding(slug, "fits", True,
                               f"verdict {plan.verdict or 'ok'}; overlays: "
                               f"{' '.join(dict.fromkeys(plan.overlays + plan.kernel_overlays)) or 'none'}"))
        # every unverified profile field the verdict rests on (a placeholder image among them) is a warning
        unverified = [w.removeprefix("unverified: ") for w in plan.warnings if w.startswith("unverified: ")]
        if unverified:
            out.append(Finding(slug, "unverified", True,
                               f"rests on {len(unverified)} unverified field(s): {'; '.join(unverified)}", warn=True))
        else:
            out.append(Finding(slug, "unverified", True, "every profile field names its source"))
        # generated file exists and is current
        try:
            current = path.read_text()
        except FileNotFoundError:
            current = None
        if current is None:
            out.append(Finding(slug, "generated-current", False,
                               f"{path} is missing; run `overlay compose render --all`"))
        elif current != rendered[slug]:
            out.append(Finding(slug, "generated-current", False,
                               f"{path} is stale; run `overlay compose render --all`"))
        else:
            out.append(Finding(slug, "generated-current", True, str(path.name)))
        # the file on disk pins the engine profile's image and reserves tp devices
        svc = _service(path, slug) if current is not None else None
        engine = engines.get(dep.engine)
        pin = engine.image if engine is not None else None
        if svc is None:
            out.append(Finding(slug, "image-pin", False, f"{path}: cannot read service {slug!r}"))
        else:
            engine_unverified = engine.unverified if engine is not None else []
            if svc.get("image") != pin:
                out.append(Finding(slug, "image-pin", False,
                                   f"{path}: image {svc.get('image')!r} != engine {dep.engine} pin {pin!r}"))
            elif recipe := getattr(engine, "image_recipe", None):  # an EnginePin (a pulled image) has none
                out.append(_recipe_finding(registry, slug, str(pin), recipe))
            elif "image" in engine_unverified:
                out.append(Finding(slug, "image-pin", True,
                                   f"{pin}: unverified (engines/{dep.engine}: no such image was built or read)",
                                   warn=True))
            else:
                out.append(Finding(slug, "image-pin", True, str(pin)))
            devices = (((svc.get("deploy") or {}).get("resources") or {})
                       .get("reservations") or {}).get("devices") or []
            ids = [i for d in devices for i in d.get("device_ids", [])]
            cmd = [str(a) for a in svc.get("command") or []]
            tp_arg = cmd[cmd.index("--tensor-parallel-size") + 1] if "--tensor-parallel-size" in cmd else None
            if len(ids) != dep.tp or tp_arg != str(dep.tp):
                out.append(Finding(slug, "file-tp", False,
                                   f"{path}: {len(ids)} device(s), --tensor-parallel-size {tp_arg}, "
                                   f"registry tp={dep.tp}"))
            else:
                out.append(Finding(slug, "file-tp", True, f"{len(ids)} device(s), --tensor-parallel-size {tp_arg}"))
    # generated files without a registry entry
    if registry.generated_dir.is_dir():
        for stray in sorted(registry.generated_dir.glob("*.yml")):
            if stray.stem not in registry.deployments:
                out.append(Finding(stray.stem, "generated-current", False, f"{stray} has no registry entry; delete it"))
    return CheckReport(tuple(out))


def run_check(catalog: Catalog, profiles: Profiles | None = None) -> CheckReport:
    from .plan import load_profiles, plan_all
    from .registry import load_registry

    registry = load_registry(catalog)
    profiles = profiles if profiles is not None else load_profiles(catalog)
    plans = plan_all(registry, catalog, profiles)
    return check_registry(registry, plans, profiles.engines)
