"""The pre-start check of memory mode: the plan that will serve the overlays, against the image's files.

Run once by the entrypoint, with the image's python and the bundle's `memory/` first on sys.path, before the
server starts (manager/compose/memory.py): `main(IDS)` prints the verified plan's path on stdout (the entrypoint
exports it as $OVERLAY_MEMORY_PLAN for every interpreter of the server) and exits 0, or prints one line on stderr
and exits 1. What decides:

- no plan, an unsigned or tampered plan, a plan for another request: refused;
- a file whose bytes are not the ones the plan was made for (a hand-edited image, another build): the overlay's
  `memory:` policy (overlay.yaml, manager/overlays/manifest.py): `refuse` (the default) refuses with overlay,
  file and both hashes; `engine` runs the full engine (the bundle's `overlay apply`) on a copy of the files the
  plan reads in a temporary directory, which records a plan signed with the bundle's key into the plan cache
  ($OVERLAY_PLAN_CACHE), and that plan serves them;
- an overlay whose writes are not module sources (`fallback`) is applied as file edits by the bundle's
  `overlay apply` (which a read-only root refuses, in its own one line).

Standard library only (manager/inmemory/__init__.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

from .memplan import ENV_CATALOG, ENV_PLANS, MemoryPlan, MemoryRefused, find_root, mismatches, select

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def policy(catalog: str, overlay_id: str) -> str:
    """The overlay's `memory:` policy: the top-level key of its overlay.yaml (the manifest schema checks the
    value when the catalog loads); `refuse` when absent."""
    try:
        with open(os.path.join(catalog, "overlays", overlay_id, "overlay.yaml"), encoding="utf-8") as fh:
            for raw in fh:
                if raw.startswith("memory:"):
                    value = raw.split(":", 1)[1].split("#", 1)[0].strip().strip("'\"")
                    return value if value in ("refuse", "engine") else "refuse"
    except OSError:
        pass
    return "refuse"


def _bundle_tool(catalog: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(catalog)), "bin", "overlay")


def engine_plan(mp: MemoryPlan, ids: list[str], catalog: str, environ: Any) -> MemoryPlan:
    """Run the bundle's full engine on a copy of what the plan reads (the files, the version metadata) in a
    temporary directory: its first apply records a plan of these bytes into the plan cache, signed with the
    bundle's key; that plan, verified as any other, serves the overlays."""
    from ..overlays.plankey import ENV_CACHE, cache_plans, key_from_env

    cache, key = environ.get(ENV_CACHE), key_from_env(environ)
    if cache is None or key is None:
        raise MemoryRefused("policy `engine` needs a plan cache ($OVERLAY_PLAN_CACHE) and a plan key "
                            "($OVERLAY_PLAN_KEY) to record the engine's plan")
    tmp = tempfile.mkdtemp(prefix="overlay-memory-root.")
    try:
        rels = list(mp.inputs) + [n for n in os.listdir(mp.root) if n.startswith("vllm-") and n.endswith(".dist-info")]
        rels.append("vllm/_version.py")
        for rel in rels:
            src, dst = os.path.join(mp.root, rel), os.path.join(tmp, rel)
            if os.path.isdir(src):
                shutil.copytree(src, dst)
            elif os.path.isfile(src):
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copyfile(src, dst)
        env = dict(environ, OVERLAY_PLANS="", OVERLAY_CATALOG=catalog)
        proc = subprocess.run([_bundle_tool(catalog), "apply", *ids, "--root", tmp], env=env,
                              stdout=sys.stderr, stderr=sys.stderr)
        if proc.returncode != 0:
            raise MemoryRefused(f"policy `engine`: the engine's apply of {' '.join(ids)} failed (exit "
                                f"{proc.returncode}): nothing is served from memory")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    path = os.path.join(cache_plans(cache, key), mp.stem + ".json")
    again = select(ids, mp.root, plan_path=path, environ=environ)
    left = mismatches(again)
    if left:
        raise MemoryRefused(left[0][1])
    return again


def check(ids: list[str], environ: Any = None) -> tuple[MemoryPlan, list[str]]:
    """(the plan that serves `ids`, lines to print on stderr), or MemoryRefused with the one line."""
    env = os.environ if environ is None else environ
    catalog = env.get(ENV_CATALOG) or ""
    mp = select(ids, find_root(env), catalog=catalog, plans=env.get(ENV_PLANS), environ=env)
    notes = []
    bad = mismatches(mp)
    if bad:
        refusing = [line for owners, line in bad if any(policy(catalog, i) == "refuse" for i in owners)]
        if refusing:
            raise MemoryRefused(refusing[0])
        notes.append(f"overlay-memory: {bad[0][1]}; policy `engine`: running the full engine in memory")
        mp = engine_plan(mp, ids, catalog, env)
    if mp.fallback:
        fb = sorted(mp.fallback)
        notes.append("overlay-memory: not deliverable in memory, applied as file edits: "
                     + "; ".join(f"{i} ({mp.fallback[i]})" for i in fb))
        proc = subprocess.run([_bundle_tool(catalog), "apply", *fb], stdout=sys.stderr, stderr=sys.stderr)
        if proc.returncode != 0:
            raise MemoryRefused(f"overlay {', '.join(fb)}: the file-edit fallback failed (exit {proc.returncode})")
    notes.append(f"overlay-memory: plan {mp.path} (signature and file hashes verified): serving "
                 f"{' '.join(mp.loaded) or 'nothing'} from memory"
                 + "".join(f"; skipped {i}: {why}" for i, why in mp.skipped))
    return mp, notes


def main(argv: list[str]) -> None:
    try:
        mp, notes = check(argv)
    except MemoryRefused as exc:
        sys.stderr.write(f"overlay-memory: refused: {exc}\n")
        sys.exit(1)
    for note in notes:
        sys.stderr.write(note + "\n")
    sys.stdout.write(mp.path + "\n")


def delivery(ids: list[str], environ: Any = None) -> list[tuple[str, str, str]]:
    """(overlay id, how it reaches the engine, why) for `overlay status` in memory mode: `memory` (served from the
    plan), `fallback` (not deliverable in memory: file edits), `skipped` (the plan's apply skipped it) or `refused`
    (no usable plan, or a file matching no plan under the `refuse` policy). Never raises."""
    env = os.environ if environ is None else environ
    catalog = env.get(ENV_CATALOG) or ""
    try:
        mp = select(ids, find_root(env), catalog=catalog, plans=env.get(ENV_PLANS), environ=env)
    except MemoryRefused as exc:
        return [(i, "refused", str(exc)) for i in ids]
    bad = {i: line for owners, line in mismatches(mp) for i in owners}
    out = []
    for i in ids:
        if i in mp.fallback:
            out.append((i, "fallback", mp.fallback[i]))
        elif i in bad:
            out.append((i, "refused" if policy(catalog, i) == "refuse" else "engine", bad[i]))
        elif i in mp.loaded:
            out.append((i, "memory", f"plan {mp.path}"))
        else:
            out.append((i, "skipped", dict(mp.skipped).get(i, "the plan writes nothing for it")))
    return out
