"""Memory mode of the compose rendering (manager/compose/memory.py, `delivery: memory`, `render --delivery memory`):
the file is read-only with tmpfs for the writable paths, the entrypoint checks instead of applying, and the script's
steps run in a real shell in order, stopping at a refused check with its exit code."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from manager.compose import spec
from manager.compose.memory import MEMORY_WRITABLE_PATHS, memory_entrypoint_script, memory_environment
from manager.compose.registry import parse_registry
from manager.compose.render import BUNDLE_MOUNT, KERNEL_CACHE, RenderOptions, render_compose
from manager.errors import ComposeError
from tests.compose.test_render import PLAN, compose_unescape, service

MEMORY = dataclasses.replace(PLAN, delivery="memory", kernel_overlays=("sm70-d512-attention",))


def test_memory_rendering_is_read_only_with_exec_tmpfs_and_the_hook_environment() -> None:
    svc = service(render_compose(MEMORY))
    assert svc["read_only"] is True
    assert svc["tmpfs"] == [f"{p}:exec" for p in MEMORY_WRITABLE_PATHS]
    env = svc["environment"]
    assert env["OVERLAY_MEMORY_IDS"] == "vllm-pr40886-gemma4-awq-moe-keys dynamo-dict-caches"
    assert env["OVERLAY_PLAN_KEY"] == f"{BUNDLE_MOUNT}/plan-key" and env["OVERLAY_DELIVERY"] == "memory"
    assert svc["labels"]["io.overlay-manager.delivery"] == "memory"
    assert f"{BUNDLE_MOUNT}:ro" in " ".join(svc["volumes"])
    script = compose_unescape(svc["entrypoint"][2])
    assert '"$OVERLAY" apply' not in script and '"$OVERLAY" build sm70-d512-attention' in script


def test_files_rendering_is_unchanged_by_the_option_and_the_option_overrides_the_plan() -> None:
    files = service(render_compose(PLAN))
    assert "read_only" not in files and "tmpfs" not in files and "OVERLAY_MEMORY_IDS" not in files["environment"]
    assert service(render_compose(PLAN, RenderOptions(delivery="memory")))["read_only"] is True
    assert "read_only" not in service(render_compose(MEMORY, RenderOptions(delivery="files")))
    with pytest.raises(ComposeError, match="--delivery 'disk'"):
        render_compose(PLAN, RenderOptions(delivery="disk"))


def test_memory_rendering_is_valid_compose_spec() -> None:
    doc = yaml.safe_load(render_compose(MEMORY, RenderOptions(gpu=False)))
    assert spec.validate(doc) == []


def test_registry_takes_delivery_memory_and_names_a_bad_value_in_one_line(tmp_path: Path) -> None:
    entry = {"model": "m", "engine": "e", "hardware": "h", "gpus": 1, "tp": 1, "ctx": 4096, "port": 8100}
    reg = parse_registry({"deployments": {"a": {**entry, "delivery": "memory"}}}, tmp_path / "d.yaml")
    assert reg.get("a").delivery == "memory"
    with pytest.raises(ComposeError, match="delivery") as err:
        parse_registry({"deployments": {"a": {**entry, "delivery": "ram"}}}, tmp_path / "d.yaml")
    assert "\n" not in str(err.value)


def _fakes(tmp_path: Path, check_exit: int) -> tuple[Path, dict[str, str]]:
    log = tmp_path / "calls.log"
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    scripts = {
        "python3": f'echo "python3 $*" >> "{log}"\necho /opt/overlay/plans/p.json\nexit {check_exit}\n',
        "overlay": f'echo "overlay $*" >> "{log}"\n',
        "vllm": f'echo "vllm $* plan=$OVERLAY_MEMORY_PLAN pythonpath=$PYTHONPATH" >> "{log}"\n',
    }
    for name, body in scripts.items():
        (bin_ / name).write_text("#!/bin/sh\n" + body)
        (bin_ / name).chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_}:/usr/bin:/bin", OVERLAY_BIN=str(bin_ / "overlay"), PYTHONPATH="/site",
               OVERLAY_PYTHON=str(bin_ / "python3"), OVERLAY_KERNEL_CACHE=str(tmp_path / "kc"))
    return log, env


def test_memory_entrypoint_checks_builds_then_execs_with_the_plan_and_the_hook_on_pythonpath(tmp_path) -> None:
    log, env = _fakes(tmp_path, 0)
    script = memory_entrypoint_script(MEMORY, BUNDLE_MOUNT, KERNEL_CACHE)
    proc = subprocess.run(["/bin/sh", "-c", script, "overlay-entrypoint", "--port", "1"], env=env,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    calls = log.read_text().splitlines()
    assert calls[0].startswith("python3 -c ") and calls[0].endswith(
        f"{BUNDLE_MOUNT}/memory vllm-pr40886-gemma4-awq-moe-keys dynamo-dict-caches")
    assert calls[1] == f"overlay build sm70-d512-attention --cache {tmp_path / 'kc'}"
    assert calls[2] == (f"vllm serve --port 1 plan=/opt/overlay/plans/p.json "
                        f"pythonpath={BUNDLE_MOUNT}/memory:/site")


def test_a_refused_check_stops_the_entrypoint_with_its_exit_code_before_the_server(tmp_path) -> None:
    log, env = _fakes(tmp_path, 1)
    script = memory_entrypoint_script(MEMORY, BUNDLE_MOUNT, KERNEL_CACHE)
    proc = subprocess.run(["/bin/sh", "-c", script, "overlay-entrypoint"], env=env, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 1
    assert [c.split()[0] for c in log.read_text().splitlines()] == ["python3"]


def test_memory_environment_points_every_cache_below_tmp() -> None:
    env = memory_environment("/b", "/k", ["x"])
    caches = [v for k, v in env.items() if k.endswith(("_HOME", "_ROOT", "_DIR")) or k == "HF_HOME"]
    assert caches and all(v.startswith("/tmp/") for v in caches)
    assert env["OVERLAY_MEMORY_PYCACHE"].startswith("/k/")
