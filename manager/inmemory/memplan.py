"""The in-memory plan: which prepared plan serves the selected overlays, verified, and the modules it patches.

The plan is the one `overlay apply IDS` would replay (manager/overlays/plans.py: the same key, the same lookup in
`$OVERLAY_MEMORY_PLANS` and in the plan cache, the same signature check under the plan key and the same
structural checks). What it writes becomes modules served from memory: a write of `vllm/a/b.py` is the module
`vllm.a.b` (of `vllm/a/__init__.py`, the package `vllm.a`); a created file is a new module of its package. A
write that is not a module source (another suffix, a deletion) cannot be served from memory: its overlays are
`fallback` (file edits, which a read-only root refuses).

Standard library only: it runs in the engine's interpreters (manager/inmemory/__init__.py).
"""

from __future__ import annotations

import json
import os

from .. import __version__
from ..overlays.plankey import ENV_CACHE, PlanKey, PlanKeyError, cache_plans, key_from_env, signature
from ..overlays.plans import PlanRefused, _requested, apply_hunks, check_plan, find_plan, plan_dirs, plan_key
from ..state import ABSENT, UnreadableFile, package_version, read_bounded, vllm_root
from ..state import sha256 as _sha256

TYPE_CHECKING = False  # not typing's (it imports re): this runs at every interpreter start
if TYPE_CHECKING:
    from typing import Any

ENV_PLAN = "OVERLAY_MEMORY_PLAN"        # the plan file the pre-start check chose (set by the entrypoint)
ENV_IDS = "OVERLAY_MEMORY_IDS"          # the overlays to serve, space-separated
ENV_CATALOG = "OVERLAY_MEMORY_CATALOG"  # the bundle's catalog
ENV_PLANS = "OVERLAY_MEMORY_PLANS"      # the bundle's plans/ (os.pathsep list)
ENV_ROOT = "OVERLAY_MEMORY_ROOT"        # the directory holding vllm/ (default: found on sys.path)


class MemoryRefused(Exception):
    """The selected overlays cannot be served from memory (one line naming plan, overlay, file, hashes)."""


class Target:
    """One module the plan patches: where its source is, what it must hash to before and after."""

    __slots__ = ("full", "hunks", "is_package", "module", "new", "overlays", "post", "pre", "rel")

    def __init__(self, rel: str, full: str, module: str, write: dict[str, Any], overlays: list[str]) -> None:
        self.rel, self.full, self.module = rel, full, module
        self.is_package = rel.endswith("/__init__.py")
        self.pre, self.post, self.hunks = write["pre_sha256"], write["post_sha256"], write["hunks"]
        self.new = self.pre == ABSENT
        self.overlays = overlays

    def patched(self) -> bytes:
        """The patched source: the original read now, its sha256 checked, the hunks applied, the result checked."""
        if self.new:
            base = b""
            if os.path.lexists(self.full):
                raise MemoryRefused(mismatch(self, file_sha256(self.full)))
        else:
            try:
                base = read_bounded(self.full)
            except (OSError, UnreadableFile):
                raise MemoryRefused(mismatch(self, ABSENT)) from None
            have = _sha256(base).hexdigest()
            if have != self.pre:
                raise MemoryRefused(mismatch(self, have))
        data = apply_hunks(base, self.hunks, self.rel)
        if _sha256(data).hexdigest() != self.post:
            raise MemoryRefused(f"{'/'.join(self.overlays)}: {self.rel}: the plan's result hash does not verify "
                                "(tampered or corrupt plan)")
        return data


def file_sha256(path: str) -> str:
    try:
        return str(_sha256(read_bounded(path)).hexdigest())
    except FileNotFoundError:
        return ABSENT
    except (OSError, UnreadableFile):
        return "unreadable"


def mismatch(t: Target, have: str) -> str:
    """The one line of a refusal: overlay, file, both hashes."""
    return (f"overlay {', '.join(t.overlays)}: {t.full} has sha256 {have}, its plan was made for {t.pre}: "
            "not served from memory")


def module_name(rel: str) -> str | None:
    """'vllm/a/b.py' -> 'vllm.a.b', 'vllm/a/__init__.py' -> 'vllm.a'; None for anything that is not module source."""
    if not rel.endswith(".py"):
        return None
    parts = rel[:-3].split("/")
    if parts[-1] == "__init__":
        parts.pop()
    if not parts or not all(p.isidentifier() for p in parts):
        return None
    return ".".join(parts)


class MemoryPlan:
    """A verified plan: its file, the modules it serves, the overlays it loads, skips, or cannot serve."""

    __slots__ = ("fallback", "inputs", "loaded", "modules", "path", "root", "skipped", "stem", "version")

    def __init__(self, path: str, plan: dict[str, Any], root: str) -> None:
        self.path, self.root = path, root
        self.stem = os.path.basename(path)[:-5]
        self.version = plan.get("package_version")
        self.inputs: dict[str, str] = plan["inputs"]
        order = [o["id"] for o in plan["overlays"]]
        files = plan["ledger"]["files"]
        self.modules: dict[str, Target] = {}
        self.fallback: dict[str, str] = {}
        for w in plan["writes"]:
            rel = w["path"]
            owners = [i for i in order if i in files[rel]["overlays"]]
            name = module_name(rel)
            if name is None or w["post_sha256"] == ABSENT:
                why = "deletes" if w["post_sha256"] == ABSENT else "writes"
                for i in owners:
                    self.fallback.setdefault(i, f"{why} {rel}, which is not a module's source")
                continue
            self.modules[name] = Target(rel, os.path.join(root, rel), name, w, owners)
        written = {i for t in self.modules.values() for i in t.overlays}
        self.loaded = [i for i in order if i in written and i not in self.fallback]
        report = plan.get("report") if isinstance(plan.get("report"), dict) else {}
        self.skipped = [(s[0], s[1]) for s in (report or {}).get("skipped", [])
                        if isinstance(s, list) and len(s) == 2 and all(isinstance(x, str) for x in s)]


def _load(path: str) -> dict[str, Any]:
    try:
        raw = read_bounded(path, 64 << 20)
    except (OSError, UnreadableFile) as exc:
        raise MemoryRefused(f"{path}: cannot read the plan ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        plan = json.loads(raw)
    except (ValueError, RecursionError):
        raise MemoryRefused(f"{path}: not valid JSON") from None
    if not isinstance(plan, dict):
        raise MemoryRefused(f"{path}: not a plan")
    return plan


def _key(environ: Any = None) -> PlanKey | None:
    try:
        return key_from_env(environ)
    except PlanKeyError as exc:
        raise MemoryRefused(f"{exc}; nothing is served from memory") from None


def env_ids(environ: Any = None) -> list[str]:
    return ((os.environ if environ is None else environ).get(ENV_IDS) or "").split()


def find_root(environ: Any = None) -> str:
    env = os.environ if environ is None else environ
    root = env.get(ENV_ROOT) or vllm_root(None)
    if root is None or not os.path.isdir(os.path.join(root, "vllm")):
        raise MemoryRefused("no vllm package on this python's path: nothing to serve from memory")
    return root


def select(ids: list[str], root: str, *, catalog: str | None = None, plans: str | None = None,
           plan_path: str | None = None, key: PlanKey | bool | None = True, environ: Any = None) -> MemoryPlan:
    """The verified plan serving `ids` on the vLLM at `root`, from `plan_path` (what the pre-start check chose)
    or looked up as `overlay apply IDS` would. `key=True`: the key `$OVERLAY_PLAN_KEY` names. Raises MemoryRefused."""
    pkey = _key(environ) if key is True else key or None
    version = package_version(root)
    if plan_path is None:
        if catalog is None:
            raise MemoryRefused(f"no catalog (${ENV_CATALOG}) to choose a plan for {' '.join(ids)}")
        req = _requested(catalog, ids)
        if req is None:
            raise MemoryRefused(f"catalog {catalog}: no overlay {' or '.join(ids)}")
        stem = plan_key(version, bool(ids), req[0])
        dirs = plan_dirs(plans)
        found = find_plan(dirs, stem)
        raw_cache = (os.environ if environ is None else environ).get(ENV_CACHE)
        cache = os.path.realpath(raw_cache) if raw_cache else None
        if found is None and cache and pkey is not None:
            found = find_plan([cache_plans(cache, pkey)], stem)
        if found is None:
            raise MemoryRefused(f"no prepared plan of {' '.join(ids)} on vllm {version} (plan {stem[:16]}, looked "
                                f"in {', '.join(dirs) or 'no directory'}): nothing is served from memory")
        plan_path, plan = found
    else:
        plan = _load(plan_path)
        stem = os.path.basename(plan_path)[:-5] if plan_path.endswith(".json") else ""
    problem, _ = signature(plan, stem, pkey)
    if problem is not None:
        raise MemoryRefused(f"{plan_path}: {problem}")
    try:
        check_plan(plan, plan_path)
    except PlanRefused as exc:
        raise MemoryRefused(str(exc)) from None
    if plan.get("tool_version") != __version__ or plan.get("package_version") != version:
        raise MemoryRefused(f"{plan_path}: made for tool {plan.get('tool_version')} and vllm "
                            f"{plan.get('package_version')}, this is tool {__version__} and vllm {version}")
    if ids and sorted(plan["requested"]) != sorted(ids):
        raise MemoryRefused(f"{plan_path}: made for {' '.join(sorted(plan['requested']))}, not {' '.join(ids)}")
    return MemoryPlan(plan_path, plan, root)


def mismatches(mp: MemoryPlan) -> list[tuple[list[str], str]]:
    """(overlays, one line) for each file the plan serves or read whose bytes are not the ones it was made for."""
    out = []
    served = {t.rel for t in mp.modules.values()}
    for t in mp.modules.values():
        have = ABSENT if not os.path.lexists(t.full) else file_sha256(t.full)
        if have != t.pre:
            out.append((t.overlays, mismatch(t, have)))
    for rel, want in mp.inputs.items():  # the files the plan read to decide (probes), not served
        full = os.path.join(mp.root, rel)
        have = ABSENT if not os.path.lexists(full) else file_sha256(full)
        if rel not in served and have != want:
            out.append((list(mp.loaded), f"overlay {', '.join(mp.loaded)}: {full} has sha256 {have}, its plan "
                        f"read {want}: not served from memory"))
    return out
