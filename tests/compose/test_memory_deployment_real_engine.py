"""In-memory delivery on the real engine through the generated compose file (issue 25 points 1 and 2).

The CPU deployment of tests/compose/test_cpu_deployment_real_engine.py (same session set-up: engine venv, runtime
image, tiny dense checkpoint and its transformers reference, catalog, bundle; tests/conftest.py) rendered by
the real `overlay compose render SLUG --no-gpu --delivery memory`: `read_only: true`, tmpfs for the writable paths,
an entrypoint that checks the bundle's signed plan against the engine's files and execs the API server with the
bundle's `memory/` first on PYTHONPATH (no `overlay apply`). The site override mounts the engine venv read-only (no
writable root at all) and sets OVERLAY_TRACE=1. Checked: tokens equal the reference; the vllm tree is byte-identical
before and after and `docker diff` shows nothing written in the container; the trace has every overlay loaded from
memory in the engine core process; a file whose bytes match no plan stops the container before the server starts,
with one line naming overlay, file and both hashes. Marked `engine` and `docker` like the file-mode module.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
import yaml

from manager.compose.memory import MEMORY_WRITABLE_PATHS
from manager.inmemory.marker import read_memory_lines
from tests.compose.test_cpu_deployment_real_engine import (
    CONVERTOR, CONVERTOR_FILE, ENGINE_MOUNT, LOGPROB_TOL, N_TOKENS, PROMPT, REPORT, SLUG, START_TIMEOUT, TOP_K, Stack,
    _cli, _free_port, stack,
)
from tests.helpers import containers as dh

eng = pytest.importorskip("testing.engine")

pytestmark = [pytest.mark.engine, pytest.mark.docker]
__all__ = ["stack"]  # the file-mode module's fixture (the session's set-up), used here

ROOT_MOUNT = "/opt/vllm-root"
ENGINE_CORE = re.compile(r"^\((EngineCore[_A-Za-z0-9]*) pid=(\d+)\)", re.M)


@pytest.fixture(scope="module", autouse=True)
def _report(request):
    """This module's measured lines (REPORT is shared with the file-mode module), printed at its end."""
    first = len(REPORT)
    t0 = time.monotonic()
    yield
    REPORT.append(("memory mode: the whole module (render, one engine start, one refused start)",
                   f"{time.monotonic() - t0:.0f} s"))
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.write_line("\ncompose e2e in memory mode on the real engine, measured:")
        for what, measured in REPORT[first:]:
            tr.write_line(f"| {what} | {measured} |")


def _tree_hash(root: Path) -> str:
    """sha256 over every file of the vllm package (path and bytes), in path order."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def rendered(stack: Stack) -> Path:
    out = stack.work / f"{SLUG}-memory.yml"
    _cli("--catalog", str(stack.catalog), "compose", "render", SLUG, "--no-gpu", "--delivery", "memory",
         "-o", str(out))
    return out


def _override(stack: Stack, name: str, pythonpath: str, extra_volumes: list[str] = ()) -> Path:
    site = stack.engine.site_packages.relative_to(stack.engine.venv)
    doc = {"services": {SLUG: {
        "image": stack.image,
        "environment": {"PYTHONPATH": pythonpath.format(site=f"{ENGINE_MOUNT}/{site}"), "OVERLAY_TRACE": "1"},
        "volumes": [f"{stack.engine.venv}:{ENGINE_MOUNT}:ro", *extra_volumes],
    }}}
    path = stack.work / f"{name}.override.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _up(stack: Stack, name: str, files: list[Path], **env: str) -> tuple[str, dict[str, str], int]:
    port = _free_port()
    envs = dh.compose_env(stack.bundle, stack.models, HOST_PORT=str(port), HEALTH_INTERVAL="2s", **env)
    project = f"ommemory-{name}-{os.getpid()}"
    proc = dh.compose(project, files, "up", "-d", env=envs, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return project, envs, port


def test_the_memory_rendering_is_read_only_with_tmpfs_and_checks_instead_of_applying(rendered):
    svc = yaml.safe_load(rendered.read_text())["services"][SLUG]
    assert svc["read_only"] is True
    assert "/tmp:exec" in svc["tmpfs"]
    script = svc["entrypoint"][2]
    assert " apply " not in script and "overlay_memory.inmemory.check" in script
    assert svc["environment"]["OVERLAY_MEMORY_IDS"] == CONVERTOR
    assert "/opt/overlay:ro" in " ".join(svc["volumes"])


def test_served_from_memory_tokens_equal_the_reference_and_nothing_is_written(stack, rendered):
    vllm_dir = stack.engine.site_packages / "vllm"
    before = _tree_hash(vllm_dir)
    files = [rendered, _override(stack, "memory", "{site}")]
    project, env, port = _up(stack, "serve", files)
    try:
        c = dh.project_container(stack.client, project)
        t0 = time.monotonic()
        dh.wait_until(c, dh.healthy, START_TIMEOUT, "healthy")
        REPORT.append(("memory mode: `up -d` -> healthy (plan check + server start, read-only root)",
                       f"{time.monotonic() - t0:.0f} s"))
        server = eng.Server(f"http://127.0.0.1:{port}", port, stack.work / "memory.log", 0, 0.0)
        got = server.complete(PROMPT, N_TOKENS, TOP_K)
        gap = eng.compare_to_reference(got, stack.reference, LOGPROB_TOL)
        REPORT.append(("memory mode: served /v1/completions vs transformers",
                       f"{N_TOKENS}/{N_TOKENS} tokens equal; max logprob gap {gap:.1e}"))
        logs = c.logs().decode(errors="replace")
        assert "signature and file hashes verified" in logs and f"serving {CONVERTOR} from memory" in logs
        # every overlay was loaded from memory in the engine core process (its pid from vLLM's log prefix)
        cores = {int(m.group(2)) for m in ENGINE_CORE.finditer(logs)}
        assert cores, "no EngineCore line in the log"
        loaded = read_memory_lines(logs)
        for pid in cores:
            assert CONVERTOR in loaded.get(pid, {}), (pid, loaded)
        log = stack.work / "memory-container.log"
        log.write_bytes(c.logs())
        proc = eng.overlay_cli("trace", str(log), "--json")
        memory = json.loads(proc.stdout)["memory"]
        assert all(CONVERTOR in memory[str(pid)] for pid in cores), memory
        REPORT.append(("memory mode: overlays loaded from memory per process (`overlay trace`)",
                       "; ".join(f"pid {p}: {', '.join(sorted(v))}" for p, v in sorted(memory.items()))))
        # nothing written in the container's root (read-only): `docker diff` lists at most the mount points
        c.reload()
        mounts = {m["Destination"] for m in c.attrs["Mounts"]} | set(c.attrs["HostConfig"].get("Tmpfs") or {})
        assert set(MEMORY_WRITABLE_PATHS) <= mounts
        mounts.add("/usr/sbin/docker-init")  # `init: true` binds docker's init there
        mount_points = mounts | {str(p) for m in mounts for p in Path(m).parents}  # docker makes them in the layer
        changed = [d["Path"] for d in (c.diff() or [])]
        assert all(p in mount_points for p in changed), sorted(set(changed) - mount_points)
        REPORT.append(("memory mode: `docker diff` of the serving container", ", ".join(changed) or "empty"))
    finally:
        dh.compose(project, files, "down", "-v", "-t", "10", env=env, timeout=300)
    assert _tree_hash(vllm_dir) == before
    assert not (stack.engine.site_packages / ".overlay-manager").exists()


def test_a_file_matching_no_plan_stops_the_container_before_the_server_with_one_line(stack, rendered):
    root = stack.work / "roots" / "memory-drift"
    target = root / CONVERTOR_FILE
    target.parent.mkdir(parents=True)
    shutil.copyfile(stack.engine.site_packages / CONVERTOR_FILE, target)
    with target.open("a") as fh:
        fh.write("# edited by hand\n")
    have = hashlib.sha256(target.read_bytes()).hexdigest()
    # the hand-edited file shadows the engine's through an overlay mount of that one file
    mount = f"{target}:{ENGINE_MOUNT}/{stack.engine.site_packages.relative_to(stack.engine.venv)}/{CONVERTOR_FILE}:ro"
    files = [rendered, _override(stack, "memory-drift", "{site}", [mount])]
    project, env, _ = _up(stack, "drift", files, RESTART_POLICY="no")
    try:
        c = dh.project_container(stack.client, project)
        state = dh.wait_until(c, lambda s: s["Status"] == "exited", 300, "exited")
        assert state["ExitCode"] == 1
        lines = [ln for ln in c.logs().decode(errors="replace").splitlines() if ln.strip()]
        assert len(lines) == 1, lines
        assert lines[0].startswith(f"overlay-memory: refused: overlay {CONVERTOR}: ")
        assert have in lines[0] and stack.venv_hash in lines[0] and CONVERTOR_FILE in lines[0]
        REPORT.append(("memory mode: a hand-edited target", f"exit 1 before the server: `{lines[0][:150]}...`"))
    finally:
        dh.compose(project, files, "down", "-v", "-t", "10", env=env, timeout=300)
