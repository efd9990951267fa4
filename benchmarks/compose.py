"""Benchmark the compose area.

1. render + check of the whole registry (plan via fits(), render every file, every invariant): target < 1 s.
2. the start-up time the entrypoint adds inside the test image (Debian bookworm python3 + real vLLM 0.20.0
   sources, bundle mounted read-only, network off): `overlay apply` cold (first start: no bytecode,
   edits written) and warm (restart: bytecode cached in the container, everything already applied).

    .venv/bin/python benchmarks/compose.py [--json] [--runs N] [--no-docker]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # manager, and tests.helpers.containers (the compose tests' Docker images)

DRIVER = r"""
import json, subprocess, sys, time
ids = sys.argv[1:]
def t(cmd):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("%s failed: %s" % (cmd, p.stderr.strip()[-300:]))
    return time.perf_counter() - t0
o = "/opt/overlay/bin/overlay"
res = {"python3 -c pass": t(["python3", "-c", "pass"])}
res["apply cold"] = t([o, "apply", *ids])    # first start: no bytecode yet, edits written
res["apply warm"] = t([o, "apply", *ids])    # restart: bytecode cached, everything applied
res["overlay --version"] = t([o, "--version"])
res["status"] = t([o, "status", *ids])
print(json.dumps(res))
"""


def bench_registry(runs: int) -> dict:
    from manager.catalog import Catalog
    from manager.compose.check import check_registry
    from manager.compose.plan import load_profiles, plan_all
    from manager.compose.registry import load_registry

    catalog = Catalog.locate()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        reg = load_registry(catalog)
        profiles = load_profiles(catalog)
        report = check_registry(reg, plan_all(reg, catalog, profiles), profiles.engines)
        times.append(time.perf_counter() - t0)
    return {"deployments": len(reg.deployments), "ok": report.ok, "first_s": round(times[0], 3),
            "median_s": round(statistics.median(times), 3), "target_s": 1.0}


def bench_container(runs: int) -> dict:
    from tests.helpers import containers as dh
    from manager.catalog import Catalog
    from manager.compose.plan import load_profiles, plan_deployment
    from manager.compose.registry import load_registry

    client = dh.engine_client()
    if client is None:
        return {"skipped": "no Docker engine answers"}
    catalog = Catalog.locate()
    plan = plan_deployment(load_registry(catalog).get("gemma4-26b-a4b-awq-3090-tp2"), load_profiles(catalog), catalog)
    image = dh.vllm_image(client)
    bundle = dh.bundle_dir(catalog)
    samples: dict[str, list[float]] = {}
    wall = []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = client.containers.run(
            image, ["python3", "-c", DRIVER, *plan.overlays], network_mode="none", remove=True,
            volumes={str(bundle): {"bind": "/opt/overlay", "mode": "ro"}},
        )
        wall.append(time.perf_counter() - t0)
        for k, v in json.loads(out.decode().strip().splitlines()[-1]).items():
            samples.setdefault(k, []).append(v)
    t0 = time.perf_counter()
    client.containers.run(image, ["true"], network_mode="none", remove=True)
    bare = time.perf_counter() - t0
    return {
        "image": image, "overlays": list(plan.overlays), "runs": runs,
        "median_s": {k: round(statistics.median(v), 3) for k, v in samples.items()},
        "container_run_bare_s": round(bare, 3),
        "container_run_with_driver_median_s": round(statistics.median(wall), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-docker", action="store_true")
    args = ap.parse_args()
    res = {"registry_render_check": bench_registry(max(args.runs, 3))}
    if not args.no_docker:
        res["container_startup"] = bench_container(args.runs)
    if args.json:
        print(json.dumps(res, indent=2))
        return
    r = res["registry_render_check"]
    print(f"render+check of {r['deployments']} deployments: first {r['first_s']} s, median {r['median_s']} s "
          f"(target < {r['target_s']} s), ok={r['ok']}")
    c = res.get("container_startup")
    if c and "skipped" not in c:
        print(f"entrypoint overhead in {c['image']} (overlays: {' '.join(c['overlays'])}), median of {c['runs']}:")
        for k, v in c["median_s"].items():
            print(f"  {k:<20} {v:.3f} s")
        print(f"  bare `docker run true`: {c['container_run_bare_s']} s")
    elif c:
        print(f"container start-up: skipped ({c['skipped']})")


if __name__ == "__main__":
    main()
