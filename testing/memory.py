"""A synthetic catalog and vLLM root for the in-memory delivery tests (tests/inmemory): one overlay that inserts a
traced block into `vllm/demo.py` (a function Triton-style code would hash through inspect.getsource) and creates
`vllm/demo_new.py`, and a signed plan of it recorded by the real engine's first apply on a copy of the root."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

OVERLAY_ID = "demo-memory"
VERSION = "0.20.0"
DEMO = '''"""The demo module of a synthetic vLLM."""


def answer():
    value = 41
    return value


def boom():
    raise ValueError("boom from demo")
'''
MANIFEST = f"""id: {OVERLAY_ID}
title: demo overlay for in-memory delivery
summary: inserts a traced line into vllm/demo.py and adds vllm/demo_new.py
vendored_on: 2026-12-06
package: vllm
versions: ">=0.1"
targets:
  - vllm/demo.py
  - vllm/demo_new.py
drop_when: never (a test overlay)
sentinel_version: 1
needed_when: {{always: true}}
{{memory}}edits:
  - kind: insert
    name: bump
    target: vllm/demo.py
    scope: answer
    anchor: "value = 41"
    position: after
    code: snippets/bump.py
    trace: true
  - kind: new-file
    name: new-module
    target: vllm/demo_new.py
    source: files/demo_new.py
"""


@dataclass(frozen=True)
class MemoryFixture:
    catalog: Path
    root: Path       # pristine: the plan's inputs (never written)
    plans: Path      # the directory holding the signed plan
    plan: Path
    key: Path


def make_root(dest: Path) -> Path:
    (dest / "vllm").mkdir(parents=True)
    (dest / "vllm" / "__init__.py").write_text("")
    (dest / "vllm" / "demo.py").write_text(DEMO)
    info = dest / f"vllm-{VERSION}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VERSION}\n")
    return dest


def make_catalog(dest: Path, memory_policy: str | None = None) -> Path:
    ov = dest / "overlays" / OVERLAY_ID
    (ov / "snippets").mkdir(parents=True)
    (ov / "files").mkdir()
    policy = f"memory: {memory_policy}\n" if memory_policy else ""
    (ov / "overlay.yaml").write_text(MANIFEST.replace("{memory}", policy))
    (ov / "snippets" / "bump.py").write_text("value += 1\n")
    (ov / "files" / "demo_new.py").write_text('def created():\n    return "created by the overlay"\n')
    (dest / "profiles").mkdir()
    return dest


def make_fixture(tmp: Path, memory_policy: str | None = None) -> MemoryFixture:
    """Catalog, pristine root, and the plan the engine records on a scratch copy of the root (signed)."""
    from manager.catalog import Catalog
    from manager.overlays import load_overlays
    from manager.overlays.plankey import create_key_file, load_key
    from manager.overlays.prepare import apply_and_record

    catalog = make_catalog(tmp / "catalog", memory_policy)
    root = make_root(tmp / "root")
    scratch = tmp / "scratch"
    shutil.copytree(root, scratch)
    key = tmp / "plan-key"
    create_key_file(key)
    cache = tmp / "cache"
    rec = apply_and_record(load_overlays(Catalog(catalog)), scratch, explicit=True, ids=[OVERLAY_ID],
                           cache=str(cache), key=load_key(key))
    assert rec.plan is not None, rec.note
    plans = tmp / "plans"
    plans.mkdir()
    plan = plans / os.path.basename(rec.plan)
    shutil.copyfile(rec.plan, plan)
    shutil.rmtree(scratch)
    return MemoryFixture(catalog, root, plans, plan, key)


def memory_env(fx: MemoryFixture, pycache: Path | None = None, **extra: str) -> dict[str, str]:
    """The environment of a server process in memory mode (manager/compose/memory.py), for a local root."""
    env = {
        "OVERLAY_MEMORY_IDS": OVERLAY_ID,
        "OVERLAY_MEMORY_CATALOG": str(fx.catalog),
        "OVERLAY_MEMORY_PLANS": str(fx.plans),
        "OVERLAY_PLAN_KEY": str(fx.key),
        "OVERLAY_MEMORY_ROOT": str(fx.root),
    }
    if pycache is not None:
        env["OVERLAY_MEMORY_PYCACHE"] = str(pycache)
    env.update(extra)
    return env
