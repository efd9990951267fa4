"""Rendering: strict templates, quoting that cannot be bypassed, inert values, structure of the service."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from manager.compose.render import (
    BUNDLE_MOUNT,
    RenderOptions,
    ServicePlan,
    environment,
    interp,
    lit,
    render_compose,
    render_entrypoint,
    sh,
    validate_compose_text,
    yblock,
    yq,
)
from manager.errors import ComposeError

PLAN = ServicePlan(
    slug="demo-tp2",
    image="vllm/vllm-openai:v0.20.0",
    serve_args=("/models/org/model", "--served-model-name", "demo", "--tensor-parallel-size", "2"),
    overlays=("vllm-pr40886-gemma4-awq-moe-keys", "dynamo-dict-caches"),
    gpus=2,
    tp=2,
    port=8041,
    status="production",
    note="a note",
    engine="vllm-0.20.0",
    vllm_version="0.20.0",
)

HOSTILE = [
    'x"\nprivileged: true\ny: "',
    "x\n    privileged: true",
    "'; touch /tmp/pwned-by-compose; '",
    "$(touch /tmp/pwned-by-compose)",
    "`touch /tmp/pwned-by-compose`",
    "${HOME}:/host:rw",
    "key: value # comment",
    "- list item",
    "{a: 1, privileged: true}",
    "&anchor *alias !!python/object:os.system",
    "multi\nline\r\nvalue\ttab",
    "\\\"escaped\\\"",
]


def service(text: str, slug: str = "demo-tp2") -> dict:
    return yaml.safe_load(text)["services"][slug]


def compose_unescape(value: str) -> str:
    """What Compose hands the container for a value with no interpolation: `$$` -> `$`."""
    return value.replace("$$", "$")


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_served_name_renders_inertly_and_adds_no_key(hostile: str) -> None:
    plan = dataclasses.replace(PLAN, serve_args=("/models/m", "--served-model-name", hostile), note=hostile)
    svc = service(render_compose(plan))
    assert "privileged" not in svc
    assert [compose_unescape(a) for a in svc["command"]] == ["/models/m", "--served-model-name", hostile]
    assert compose_unescape(svc["labels"]["io.overlay-manager.note"]) == hostile


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_image_and_env_values_stay_values(hostile: str) -> None:
    plan = dataclasses.replace(PLAN, image=hostile, env={"EXTRA": hostile})
    data = yaml.safe_load(render_compose(plan))
    svc = data["services"]["demo-tp2"]
    assert compose_unescape(svc["image"]) == hostile
    assert compose_unescape(svc["environment"]["EXTRA"]) == hostile
    assert "privileged" not in svc and set(data) == {"services", "volumes"}


def test_dollar_is_escaped_so_compose_does_not_interpolate() -> None:
    plan = dataclasses.replace(PLAN, serve_args=("/models/m", "--served-model-name", "a$HOME${PATH}"))
    text = render_compose(plan)
    assert '"a$$HOME$${PATH}"' in text


def test_only_the_documented_variables_are_interpolated() -> None:
    text = render_compose(PLAN)
    import re

    single = re.findall(r"(?<!\$)\$\{([A-Z_]+):-", text)
    assert sorted(set(single)) == ["BIND_ADDRESS", "HEALTH_INTERVAL", "HOST_PORT", "MODELS_DIR", "OVERLAY_BUNDLE", "RESTART_POLICY"]


@pytest.mark.parametrize("hostile", HOSTILE + ["--version", "-rf"])
def test_entrypoint_runs_hostile_ids_and_args_as_plain_words(tmp_path: Path, hostile: str) -> None:
    log = tmp_path / "calls.log"
    marker = Path("/tmp/pwned-by-compose")
    marker.unlink(missing_ok=True)
    fake = tmp_path / "bin"
    fake.mkdir()
    for name in ("overlay", "vllm"):
        exe = fake / name
        exe.write_text(f'#!/bin/sh\nfor a in {name} "$@"; do printf "%s\\0" "$a"; done >> "{log}"\nprintf "\\n\\0" >> "{log}"\n')
        exe.chmod(0o755)
    plan = dataclasses.replace(PLAN, overlays=(hostile, "second"), kernel_overlays=(hostile,),
                               serve_args=("/models/m", "--served-model-name", hostile))
    svc = service(render_compose(plan))
    entry = [compose_unescape(a) for a in svc["entrypoint"]]
    cmd = [compose_unescape(a) for a in svc["command"]]
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", OVERLAY_BIN=str(fake / "overlay"),
               OVERLAY_KERNEL_CACHE=str(tmp_path / "kc"))
    proc = subprocess.run([*entry, *cmd], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    calls = [c.strip("\0").split("\0") for c in log.read_bytes().decode().split("\n\0") if c.strip("\0")]
    assert calls == [
        ["overlay", "apply", hostile, "second"],
        ["overlay", "build", hostile, "--cache", str(tmp_path / "kc")],
        ["vllm", "serve", "/models/m", "--served-model-name", hostile],
    ]
    assert not marker.exists()


def test_entrypoint_stops_at_a_failed_apply_with_its_exit_code(tmp_path: Path) -> None:
    fake = tmp_path / "overlay"
    fake.write_text('#!/bin/sh\necho "error: overlay x: drift in a.py" >&2\nexit 1\n')
    fake.chmod(0o755)
    script = render_entrypoint(PLAN)
    proc = subprocess.run(["/bin/sh", "-c", script, "overlay-entrypoint", "--port", "1"],
                          env=dict(os.environ, OVERLAY_BIN=str(fake), PATH="/usr/bin:/bin"),
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert "drift in a.py" in proc.stderr


def test_entrypoint_without_overlays_has_no_apply_and_no_build_step() -> None:
    script = render_entrypoint(dataclasses.replace(PLAN, overlays=(), kernel_overlays=()))
    assert '"$OVERLAY" apply' not in script and '"$OVERLAY" build' not in script
    assert script.rstrip().endswith('exec vllm serve "$@"')


def test_entrypoint_orders_apply_then_build_then_exec() -> None:
    script = render_entrypoint(dataclasses.replace(PLAN, kernel_overlays=("sm70-d512-attention",)))
    i_apply, i_build = script.index('"$OVERLAY" apply '), script.index('"$OVERLAY" build ')
    i_exec = script.index('exec vllm serve "$@"')
    assert i_apply < i_build < i_exec
    assert "sm70-d512-attention" in script[i_build:i_exec] and "sm70-d512-attention" not in script[:i_build]


def test_template_printing_an_unquoted_value_fails_to_render() -> None:
    tpl = environment().from_string("image: {{ image }}\n")
    with pytest.raises(ComposeError, match="unquoted value"):
        tpl.render(image="x\nprivileged: true")


def test_templates_use_strict_undefined() -> None:
    with pytest.raises(jinja2.UndefinedError):
        environment().from_string("a: {{ missing | yq }}\n").render()


def test_validate_rejects_a_privileged_key() -> None:
    text = render_compose(PLAN).replace("    init: true\n", "    init: true\n    privileged: true\n")
    with pytest.raises(ComposeError, match="unexpected keys.*privileged"):
        validate_compose_text(text, "demo-tp2")


def test_validate_rejects_an_absolute_host_mount() -> None:
    text = render_compose(PLAN).replace('"${MODELS_DIR:-./models}:/models:ro"', '"/:/host"')
    with pytest.raises(ComposeError, match="absolute host path"):
        validate_compose_text(text, "demo-tp2")


@pytest.mark.parametrize("name,default", [("lower", "x"), ("A B", "x"), ("OK", "a}b"), ("OK", "$X"), ("OK", "a b")])
def test_interp_rejects_unsafe_names_and_defaults(name: str, default: str) -> None:
    with pytest.raises(ComposeError):
        interp(name, default)


@pytest.mark.parametrize("value", ["true", "no", "a b", "x:y", "", "-x", True])
def test_lit_rejects_values_yaml_would_reinterpret(value) -> None:
    with pytest.raises(ComposeError):
        lit(value)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_yq_and_yblock_round_trip_any_text(text: str) -> None:
    expected = text.replace("$", "$$")
    assert yaml.safe_load("k: " + yq(text)) == {"k": expected}
    assert yaml.safe_load("a:\n  k: " + yblock(text, 4) + "\n  after: 1\n") == {"a": {"k": expected, "after": 1}}


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")))
def test_sh_quoting_round_trips_through_a_real_shell(text: str) -> None:
    out = subprocess.run(["/bin/sh", "-c", "printf %s " + sh(text)], capture_output=True)
    assert out.stdout == text.encode("utf-8", "surrogateescape")


def test_gpu_reservation_matches_gpu_count_and_can_be_left_out() -> None:
    svc = service(render_compose(PLAN))
    dev = svc["deploy"]["resources"]["reservations"]["devices"]
    assert dev == [{"driver": "nvidia", "device_ids": ["0", "1"], "capabilities": ["gpu"]}]
    assert "deploy" not in service(render_compose(PLAN, RenderOptions(gpu=False)))


def test_tp2_uses_host_ipc_or_the_given_shm_size() -> None:
    assert service(render_compose(PLAN))["ipc"] == "host"
    svc = service(render_compose(dataclasses.replace(PLAN, shm_size="8gb")))
    assert svc["shm_size"] == "8gb" and "ipc" not in svc
    one = service(render_compose(dataclasses.replace(PLAN, tp=1, gpus=1)))
    assert "ipc" not in one and "shm_size" not in one and "NCCL_IB_DISABLE" not in one["environment"]


def test_service_has_init_healthcheck_restart_offline_env_and_overridable_mounts() -> None:
    svc = service(render_compose(PLAN))
    assert svc["init"] is True
    assert svc["healthcheck"]["test"][:2] == ["CMD", "python3"] and "/health" in svc["healthcheck"]["test"][3]
    assert svc["restart"] == "${RESTART_POLICY:-on-failure:3}"
    assert svc["environment"]["HF_HUB_OFFLINE"] == "1"
    assert svc["ports"] == ["${BIND_ADDRESS:-127.0.0.1}:${HOST_PORT:-8041}:8000"]
    assert svc["volumes"][:2] == ["${MODELS_DIR:-./models}:/models:ro", "${OVERLAY_BUNDLE:-./overlay-bundle}:/opt/overlay:ro"]
    assert svc["volumes"][2] == "kernel-cache:/var/cache/overlay-kernels"
    assert svc["entrypoint"][-1] == "overlay-entrypoint"


def test_fewer_gpus_than_tp_is_refused() -> None:
    with pytest.raises(ComposeError, match="tp=2 needs at least 2 GPUs"):
        render_compose(dataclasses.replace(PLAN, gpus=1))


def test_kernel_deployments_point_the_serving_process_at_the_bundled_manager() -> None:
    """The routed vLLM code imports manager.kernels to launch the kernels: the serve process
    must find the bundle's site/ (where `overlay bundle` installs `manager`)."""
    with_kernels = service(render_compose(dataclasses.replace(PLAN, kernel_overlays=("sm70-d512-attention",))))
    assert with_kernels["environment"]["OVERLAY_MANAGER_HOME"] == f"{BUNDLE_MOUNT}/site"
    assert f"{BUNDLE_MOUNT}:ro" in " ".join(with_kernels["volumes"])
    without = service(render_compose(PLAN))
    assert "OVERLAY_MANAGER_HOME" not in without["environment"]
