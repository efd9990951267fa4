"""On a real Docker engine: generated files pass `docker-compose config`; a deployment comes up in the
test image, applies its overlays from the bundle, survives a restart as a no-op, and a drifting one
ends exited non-zero with the tool's message and no file changed."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import urllib.request
from pathlib import Path

import pytest

from manager.catalog import Catalog
from manager.compose.plan import load_profiles, plan_deployment
from manager.compose.registry import load_registry
from manager.compose.render import RenderOptions, render_compose
from tests.helpers import containers as dh

SLUG = "gemma4-26b-a4b-awq-3090-tp2"
LEDGER = f"{dh.SITE}/.overlay-manager/ledger.json"


def test_every_generated_file_passes_docker_compose_config(repo_root: Path, tmp_path: Path) -> None:
    dh.need_tools("docker-compose")
    files = sorted((repo_root / "compose" / "generated").glob("*.yml"))
    assert len(files) >= 5
    env = dh.compose_env(tmp_path / "bundle", tmp_path / "models")
    for f in files:
        proc = dh.compose(f.stem, f, "config", "-q", env=env, timeout=60)
        assert proc.returncode == 0, f"{f.name}: {proc.stderr}"


def test_no_gpu_render_of_every_deployment_passes_docker_compose_config(tmp_path: Path) -> None:
    dh.need_tools("docker-compose")
    catalog = Catalog.locate()
    reg, profiles = load_registry(catalog), load_profiles(catalog)
    env = dh.compose_env(tmp_path / "bundle", tmp_path / "models")
    for slug, dep in reg.deployments.items():
        f = tmp_path / f"{slug}.yml"
        f.write_text(render_compose(plan_deployment(dep, profiles, catalog), RenderOptions(gpu=False)))
        proc = dh.compose(slug, f, "config", env=env, timeout=60)
        assert proc.returncode == 0, f"{slug}: {proc.stderr}"
        assert "nvidia" not in proc.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    client = dh.docker_client()
    dh.need_tools("docker-compose")
    catalog = Catalog.locate()
    plan = plan_deployment(load_registry(catalog).get(SLUG), load_profiles(catalog), catalog)
    work = tmp_path_factory.mktemp("e2e")
    (work / "models").mkdir()
    return {
        "client": client,
        "plan": plan,
        "bundle": dh.bundle_dir(catalog),
        "image": dh.vllm_image(client),
        "drift": dh.drift_image(client),
        "work": work,
    }


def _up(e2e, image: str, name: str, **env: str):
    plan = dataclasses.replace(e2e["plan"], image=image)
    f = e2e["work"] / f"{name}.yml"
    f.write_text(render_compose(plan, RenderOptions(gpu=False)))
    project = f"omtest-{name}-{os.getpid()}"
    envs = dh.compose_env(e2e["bundle"], e2e["work"] / "models", **env)
    proc = dh.compose(project, f, "up", "-d", env=envs)
    assert proc.returncode == 0, proc.stderr
    return plan, project, f, envs


def _sentinels(container) -> dict:
    code = "import json,urllib.request;print(urllib.request.urlopen('http://127.0.0.1:8000/overlays').read().decode())"
    return json.loads(dh.exec_out(container, "python3", "-c", code))


def _mtimes(container, files: list[str]) -> dict:
    code = (
        "import json,os,sys;print(json.dumps({f: os.stat(os.path.join(sys.argv[1], f)).st_mtime_ns "
        "for f in sys.argv[2:]}))"
    )
    return json.loads(dh.exec_out(container, "python3", "-c", code, dh.SITE, *files))


@pytest.mark.docker
def test_deployment_comes_up_healthy_with_overlays_applied_and_restart_is_a_noop(e2e) -> None:
    port = _free_port()
    plan, project, f, env = _up(e2e, e2e["image"], "apply", HOST_PORT=str(port))
    assert "vllm-pr40886-gemma4-awq-moe-keys" in plan.overlays
    try:
        c = dh.project_container(e2e["client"], project)
        dh.wait_until(c, dh.healthy, 90, "healthy")
        # /health through the published host port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
            assert resp.status == 200
        # the stand-in vllm got exactly the rendered serve arguments and sees every overlay's sentinel
        seen = _sentinels(c)
        assert seen["argv"] == list(plan.serve_args)
        assert set(plan.overlays) <= set(seen["sentinels"])
        # the tool inside agrees, and its ledger records them
        status = json.loads(dh.exec_out(c, "/opt/overlay/bin/overlay", "status", "--json"))
        by_id = {o["id"]: o["status"] for o in status["overlays"]}
        assert all(by_id[i] == "applied" for i in plan.overlays), by_id
        ledger1 = dh.exec_out(c, "cat", LEDGER)
        assert all(i in ledger1 for i in plan.overlays)
        files = sorted({p for s in seen["sentinels"].values() for p in s["files"]})
        mtimes1 = _mtimes(c, files)
        started1 = c.attrs["State"]["StartedAt"]

        proc = dh.compose(project, f, "restart", env=env)
        assert proc.returncode == 0, proc.stderr
        dh.wait_until(c, lambda s: s["StartedAt"] != started1 and dh.healthy(s), 90, "healthy after restart")
        assert dh.exec_out(c, "cat", LEDGER) == ledger1  # second apply wrote nothing
        assert _mtimes(c, files) == mtimes1  # and rewrote no patched file
        assert set(plan.overlays) <= set(_sentinels(c)["sentinels"])
        assert c.logs().decode().count("stand-in vllm serving") == 2
    finally:
        dh.compose(project, f, "down", "-v", "-t", "5", env=env)


@pytest.mark.docker
def test_drifting_overlay_leaves_the_container_exited_with_the_message_and_files_unchanged(e2e) -> None:
    plan, project, f, env = _up(e2e, e2e["drift"], "drift", HOST_PORT=str(_free_port()))
    try:
        c = dh.project_container(e2e["client"], project)
        state = dh.wait_until(
            c, lambda s: s["Status"] == "exited" and c.attrs["RestartCount"] >= 3, 120,
            "exited after the restart policy's 3 retries",
        )
        assert state["ExitCode"] != 0
        logs = c.logs().decode(errors="replace")
        failures = [ln for ln in logs.splitlines() if "vllm-pr40886-gemma4-awq-moe-keys" in ln and "drift" in ln]
        assert len(failures) == c.attrs["RestartCount"] + 1  # every attempt failed the same way, changing nothing
        assert "stand-in vllm serving" not in logs
        changed = [d["Path"] for d in e2e["client"].api.diff(c.id) or [] if d["Path"].startswith(f"{dh.SITE}/vllm")]
        assert changed == [], changed
    finally:
        dh.compose(project, f, "down", "-v", "-t", "5", env=env)
