"""`overlay compose add --from-plan N`: one `overlay plan` option as a deployment of a user catalog.

The plan is computed again from the same arguments (it is deterministic), option N (1-based, as
`plan` numbers them) becomes an entry of `<catalog>/compose/deployments.yaml` (status experimental:
nothing this tool wrote has run yet), its compose file is rendered into compose/generated/ and the
registry is checked (`overlay compose check`). Anything that fails leaves both files as they were.
The shipped catalog is never written: a user catalog comes from `overlay catalog init DIR`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..catalog import Catalog, default_catalog_dir
from ..errors import ComposeError
from ..fsutil import atomic_write
from .check import Finding

FIRST_PORT = 8100


@dataclass(frozen=True)
class AddResult:
    slug: str
    registry: Path
    generated: Path
    entry: dict
    findings: tuple[Finding, ...]  # the check's findings for the new deployment (warnings included)


def _slug_for(dep: dict) -> str:
    raw = f"{dep['model']}-{dep['weights']}-{dep['hardware']}-tp{dep['tp']}".lower()
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", raw)).strip("-")[:63]


def _taken_ports(catalog: Catalog) -> set[int]:
    from .registry import load_registry

    ports = {d.port for d in load_registry(catalog).deployments.values()}
    shipped = default_catalog_dir()
    if shipped is not None:
        try:
            ports |= {d.port for d in load_registry(Catalog(shipped)).deployments.values()}
        except ComposeError:
            pass
    return ports


def entry_from_option(report, option: int) -> dict:
    """The registry entry (no slug) for a plan option: TP devices reserved, its context and dtypes."""
    d = report.deployment
    entry: dict = {"model": d["model"], "weights": d["weights"], "engine": d["engine"], "hardware": d["hardware"],
                   "gpus": d["tp"], "tp": d["tp"]}
    if d.get("drafter"):
        entry["drafter"] = d["drafter"]
    if d.get("kv_dtype") and d["kv_dtype"] != "auto":
        entry["kv_dtype"] = d["kv_dtype"]
    entry["ctx"] = int(d.get("ctx") or report.memory.max_ctx)
    if d.get("max_seqs"):
        entry["max_seqs"] = int(d["max_seqs"])
    entry["status"] = "experimental"
    entry["note"] = (f"added from `overlay plan` option {option} (verdict {report.verdict}); "
                     "not yet run by this catalog's owner")
    return entry


def add_from_plan(catalog: Catalog, *, option: int, model: str, hardware: str, gpus: int, ctx: int | None = None,
                  max_seqs: int | None = None, slug: str | None = None, port: int | None = None) -> AddResult:
    from ..fits import plan
    from .check import render_all, run_check
    from .plan import load_profiles, plan_deployment
    from .registry import load_registry, parse_registry

    shipped = default_catalog_dir()
    if catalog.base is None and shipped is not None and Path(shipped).resolve() == catalog.root.resolve():
        raise ComposeError("compose add writes a user catalog, not the shipped one: run `overlay catalog init DIR`, "
                           "then `overlay --catalog DIR compose add ...`")
    reg = load_registry(catalog)
    profiles = load_profiles(catalog)
    pl = plan(profiles, model=model, hardware=hardware, gpus=gpus, ctx=ctx, max_seqs=max_seqs, catalog=catalog)
    if not pl.options:
        raise ComposeError(f"plan {model} on {gpus}x {hardware}: no deployment fits, nothing to add")
    if not 1 <= option <= len(pl.options):
        raise ComposeError(f"--from-plan {option}: the plan has options 1..{len(pl.options)}")
    report = pl.options[option - 1]
    entry = entry_from_option(report, option)
    slug = slug or _slug_for(report.deployment)
    if slug in reg.deployments:
        raise ComposeError(f"{reg.path}: deployment {slug!r} exists; pass --slug NAME")
    if port is None:
        taken = _taken_ports(catalog)
        port = next(p for p in range(FIRST_PORT, 65536) if p not in taken)
    entry["port"] = port

    text = reg.path.read_text(encoding="utf-8")
    block = yaml.safe_dump({slug: entry}, sort_keys=False, default_flow_style=False, width=1000)
    block = "".join(f"  {ln}\n" for ln in block.splitlines())
    if re.search(r"(?m)^deployments:\s*\{\}\s*$", text):
        new_text = re.sub(r"(?m)^deployments:\s*\{\}\s*$", "deployments:", text, count=1).rstrip("\n") + "\n" + block
    else:
        new_text = text.rstrip("\n") + "\n\n" + block
    from .. import safeyaml

    new_reg = parse_registry(safeyaml.load(new_text), reg.path)  # a bad entry fails before anything is written
    gen = new_reg.generated_path(slug)
    rendered = render_all({slug: plan_deployment(new_reg.get(slug), profiles, catalog)})[slug]
    had_gen = gen.read_bytes() if gen.exists() else None
    atomic_write(reg.path, new_text.encode())
    try:
        gen.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(gen, rendered.encode())
        report_chk = run_check(catalog, profiles)
        mine = tuple(f for f in report_chk.findings if f.slug == slug)
        bad = [f for f in mine if not f.ok]
        if bad:
            raise ComposeError(f"compose check of {slug}: {bad[0].check}: {bad[0].message}; nothing was added")
    except BaseException:
        atomic_write(reg.path, text.encode())
        if had_gen is None:
            gen.unlink(missing_ok=True)
        else:
            atomic_write(gen, had_gen)
        raise
    return AddResult(slug, reg.path, gen, entry, mine)


def engine_note(profiles, model: str, hardware: str, options: list) -> str | None:
    """One line for `plan` when the hardware has no engine that runs from a published image today:
    None when some option pulls a published image."""
    hw = profiles.hardware[hardware]
    if not options:
        return (f"no engine in this catalog runs {model} on {hardware} (sm {hw.sm:.1f}) today: "
                "every combination is rejected")
    engines = sorted({r.deployment["engine"] for r in options})
    recipes = sorted({profiles.engines[e].image_recipe for e in engines if profiles.engines[e].image_recipe})
    if all(profiles.engines[e].image_recipe for e in engines):
        return (f"no published vLLM image runs on {hardware} (sm {hw.sm:.1f}): every option uses {', '.join(engines)}, "
                f"whose image you build here with `overlay image build {' '.join(recipes)}`")
    return None


def add_command(catalog: Catalog, option: int, model: str, hardware: str, gpus: int, ctx: int | None,
                max_seqs: int | None) -> str:
    """The command `plan` prints: plan option N into a user catalog (made first when there is none)."""
    args = f"compose add --from-plan {option} --model {model} --hardware {hardware} --gpus {gpus}"
    args += f" --ctx {ctx}" if ctx else ""
    args += f" --max-seqs {max_seqs}" if max_seqs else ""
    if catalog.base is not None:
        return f"overlay --catalog {catalog.root} {args}"
    return f"overlay catalog init DIR && overlay --catalog DIR {args}"
