"""gemma4-ple-nvfp4-dequant on the real vLLM 0.19.1 and 0.20.0 sources: Gemma4Model.load_weights of the patched
(and the pristine) gemma4.py, run on the factory's ct-nvfp4-ple checkpoint tensors, loads the per-layer embedding
table dequantized and equal to the checkpoint's dequantized reference (pristine: KeyError)."""

from __future__ import annotations

import importlib.util
import logging
import sys
import types

import pytest

from manager.catalog import Catalog
from manager.overlays import apply, load_overlays, revert, status_on_release
from tests.helpers import SHIPPED_OVERLAYS
from tests.overlays.shipped.extracted import extract_def, run_extracted

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

OID = "gemma4-ple-nvfp4-dequant"
GEMMA4 = "vllm/model_executor/models/gemma4.py"
MODULE = "vllm/model_executor/models/gemma4_ple_nvfp4.py"


def _overlay():
    return [o for o in load_overlays(Catalog.locate(SHIPPED_OVERLAYS.parent)) if o.manifest.id == OID]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The factory's ct-nvfp4-ple tensors (vLLM's names: the model. prefix Gemma4ForCausalLM strips) and its
    dequantized reference table."""
    from safetensors.torch import load_file

    from testing.checkpoints import build_checkpoint

    info = build_checkpoint("ct-nvfp4-ple", tmp_path_factory.mktemp("ple") / "ckpt")
    tensors = load_file(str(info.path / "model.safetensors"))
    ref = load_file(str(info.reference_path / "model.safetensors"))["model.embed_tokens_per_layer.weight"]
    return {k.removeprefix("model."): v for k, v in tensors.items()}, ref


def _load_weights(root, monkeypatch):
    """Gemma4Model.load_weights from `root`'s gemma4.py, with the overlay's module (when written) importable."""
    vlog = types.ModuleType("vllm.logger")
    vlog.init_logger = lambda name: logging.getLogger(name)
    for name in ("vllm", "vllm.model_executor", "vllm.model_executor.models"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.logger", vlog)
    if (root / MODULE).exists():
        spec = importlib.util.spec_from_file_location("vllm.model_executor.models.gemma4_ple_nvfp4", root / MODULE)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        monkeypatch.setitem(sys.modules, "vllm.model_executor.models.gemma4_ple_nvfp4", mod)
        monkeypatch.setattr(sys.modules["vllm.model_executor.models"], "gemma4_ple_nvfp4", mod, raising=False)

    def default_weight_loader(param, w):
        param.data.copy_(w)

    ns = {"torch": torch, "Iterable": object, "default_weight_loader": default_weight_loader,
          "maybe_remap_kv_scale_name": lambda name, params: name, "is_pp_missing_parameter": lambda n, m: False}
    code = "from __future__ import annotations\n" + extract_def((root / GEMMA4).read_text(), "Gemma4Model.load_weights")
    return run_extracted(code, ns)["load_weights"]


class _Model(torch.nn.Module):
    """What Gemma4Model.load_weights reads: its parameters (the PLE table as VocabParallelEmbedding makes it, with a
    weight_loader), config.num_experts, quant_config."""

    def __init__(self, shape, dtype, other):
        super().__init__()
        self.embed_tokens_per_layer = torch.nn.Module()
        w = torch.nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)
        w.weight_loader = lambda p, loaded: p.data.copy_(loaded)   # TP=1: the whole vocab is this rank's shard
        self.embed_tokens_per_layer.weight = w
        for i, (name, t) in enumerate(other.items()):
            self.register_parameter(f"p{i}", torch.nn.Parameter(torch.zeros_like(t), requires_grad=False))
            setattr(self, f"_name{i}", name)
        self.config = types.SimpleNamespace(num_experts=0)
        self.quant_config = None

    def named_parameters(self, *a, **kw):   # the checkpoint's other tensors under their own names
        for name, p in super().named_parameters(*a, **kw):
            yield (getattr(self, f"_name{name[1:]}") if name.startswith("p") and name[1:].isdigit() else name), p


@pytest.mark.network
@pytest.mark.parametrize("version", ["0.19.1", "0.20.0"])
def test_patched_loader_loads_the_nvfp4_per_layer_embedding_dequantized(version, vllm_root, monkeypatch, caplog,
                                                                         checkpoint):
    tensors, ref = checkpoint
    ple = {k: v for k, v in tensors.items() if k.startswith("embed_tokens_per_layer.")}
    assert set(ple) == {f"embed_tokens_per_layer.{p}" for p in
                        ("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale")}
    other = {k: v for k, v in tensors.items() if k.startswith("per_layer_model_projection")}
    root = vllm_root(version)
    pristine = _load_weights(root, monkeypatch)
    # the first NVFP4 tensor in the checkpoint's (sorted) order is not a parameter of vLLM's plain embedding
    with pytest.raises(KeyError, match=r"embed_tokens_per_layer\.(input_global_scale|weight_packed)"):
        pristine(_Model(ref.shape, torch.bfloat16, other), iter(ple.items()))
    ovs = _overlay()
    apply(ovs, root)
    patched = _load_weights(root, monkeypatch)
    model = _Model(ref.shape, torch.bfloat16, other)
    with caplog.at_level(logging.INFO):
        loaded = patched(model, iter([*ple.items(), *other.items()]))
    assert "embed_tokens_per_layer.weight" in loaded and "per_layer_model_projection.weight" in loaded
    # the reference is float32 (exact); the overlay dequantizes into the model dtype, bfloat16 here
    torch.testing.assert_close(model.embed_tokens_per_layer.weight.data, ref.to(torch.bfloat16), rtol=0, atol=0)
    assert any("dequantized to torch.bfloat16 at load" in r.getMessage() for r in caplog.records)
    revert(ovs, ovs, root)
    assert not (root / MODULE).exists()


@pytest.mark.network
@pytest.mark.parametrize("version, expected", [("0.19.1", "pending"), ("0.20.0", "pending"), ("0.22.0", "pending"),
                                               ("0.26.0", "not-applicable")])
def test_statuses_on_releases(version, expected):
    assert status_on_release(version, Catalog.locate(SHIPPED_OVERLAYS.parent), [OID]).overlays[0].status == expected


def test_dequantize_matches_the_factory_reference_for_every_code_and_several_scales():
    from testing.checkpoints import dequantize_nvfp4, pack_fp4

    spec = importlib.util.spec_from_file_location("ple_module_under_test", SHIPPED_OVERLAYS / OID / "files" /
                                                  "gemma4_ple_nvfp4.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("vllm", types.ModuleType("vllm"))
    vlog = types.ModuleType("vllm.logger")
    vlog.init_logger = lambda name: logging.getLogger(name)
    sys.modules.setdefault("vllm.logger", vlog)
    spec.loader.exec_module(mod)
    codes = torch.arange(16, dtype=torch.uint8).repeat(3, 4)            # [3, 64]: every E2M1 code
    packed = pack_fp4(codes)
    scale = torch.tensor([0.5, 1.0, 2.0, 448.0]).repeat(3, 1).to(torch.float8_e4m3fn)
    gscale = torch.tensor([3.0])
    mod.ROWS_PER_CHUNK = 2   # chunk boundaries inside the table
    got = mod.dequantize(packed, scale, gscale, torch.float32)
    torch.testing.assert_close(got, dequantize_nvfp4(packed, scale, gscale), rtol=0, atol=0)
