"""Behaviour of the patched code, not its text (issue 2, point 10, second bullet).

The patched functions are pulled out of real patched release files and exec'd:
(a) `_weight_iterator` of gemma4.py runs on torch CPU tensors with the compressed-tensors
    expert key shapes; a copy of the overlay inserted *after* its anchor is shown wrong;
(b) the Gemma-4 model-arch convertor runs against a real transformers Gemma4TextConfig
    with the 26B-A4B values; the unpatched class raises AmbiguousGlobalPerLayerAttributeError;
(c) `_overlay_dict_cache` from a patched cuda.py behaves like functools.cache / lru_cache.
"""

from __future__ import annotations

import ast
import functools
import re
import textwrap
from collections.abc import Callable
from types import SimpleNamespace

import pytest

from manager.overlays import apply, load_overlays
from tests.helpers.catalogs import (
    CONVERTOR,
    CONVERTOR_PY,
    CUDA_PY,
    DYNAMO,
    GEMMA4,
    PR40886,
    set_edit_field,
    shipped_catalog,
    slim_root,
)
from tests.overlays.shipped.extracted import convertor_class, extract_def, run_extracted

torch = pytest.importorskip("torch")


def _patched_source(tmp_path_factory, version: str, overlay_id: str, variants=None) -> str:
    """The target file of `overlay_id` after applying it (alone) to a real release."""
    cat = shipped_catalog(tmp_path_factory.mktemp("cat"), ids=[overlay_id], variants=variants)
    root = slim_root(version, tmp_path_factory.mktemp(f"site-{version}"))
    [overlay] = load_overlays(cat)
    result = apply([overlay], root)
    [change] = result.changes
    assert result.statuses.by_id(overlay_id).status == "applied"
    return (root / change.path).read_text()


# --- (a) PR 40886: _weight_iterator on real tensors -------------------------------------------

ITERATOR = "Gemma4ForCausalLM.load_weights._weight_iterator"
E, I, H, PACK, GS = 4, 16, 64, 8, 8  # experts, moe intermediate, hidden, int4 per int32, group size
FULL_LAYERS = [5, 11, 17, 23, 29]
LAYER_TYPES = ["full_attention" if i in FULL_LAYERS else "sliding_attention" for i in range(30)]


def _checkpoint() -> list[tuple[str, torch.Tensor]]:
    """Checkpoint-style tensors of one MoE layer (distinct values everywhere) plus a k_eq_v k_proj."""

    def ints(*shape):
        n = 1
        for s in shape:
            n *= s
        return torch.arange(n, dtype=torch.int32).reshape(shape)

    def halves(*shape):  # fp16 holds these integers exactly
        return (ints(*shape) % 2048).to(torch.float16)

    pre = "model.language_model.layers.0.experts."
    return [
        (pre + "gate_up_proj_packed", ints(E, 2 * I, H // PACK)),
        (pre + "gate_up_proj_scale", halves(E, 2 * I, H // GS)),
        (pre + "down_proj_packed", ints(E, H, I // PACK)),
        (pre + "down_proj_scale", halves(E, H, I // GS)),
        (pre + "gate_up_proj", ints(E, 2 * I, H).to(torch.float32)),
        ("model.language_model.layers.5.self_attn.k_proj.weight", ints(8, H).to(torch.float32)),
    ]


def _run_iterator(source: str, checkpoint) -> list[tuple[str, torch.Tensor]]:
    code = extract_def(source, ITERATOR)
    config = SimpleNamespace(layer_types=LAYER_TYPES, attention_k_eq_v=True)
    ns = run_extracted(code, {"re": re, "self": SimpleNamespace(config=config), "weights": list(checkpoint)})
    return list(ns["_weight_iterator"]())


def _expected_names() -> list[tuple[str, tuple[int, ...]]]:
    out = []
    m = "model.layers.0.moe.experts"
    for e in range(E):
        out += [(f"{m}.{e}.gate_proj.weight_packed", (I, H // PACK)), (f"{m}.{e}.up_proj.weight_packed", (I, H // PACK))]
    for e in range(E):
        out += [(f"{m}.{e}.gate_proj.weight_scale", (I, H // GS)), (f"{m}.{e}.up_proj.weight_scale", (I, H // GS))]
    out += [(f"{m}.{e}.down_proj.weight_packed", (H, I // PACK)) for e in range(E)]
    out += [(f"{m}.{e}.down_proj.weight_scale", (H, I // GS)) for e in range(E)]
    for e in range(E):
        out += [(f"{m}.{e}.gate_proj", (I, H)), (f"{m}.{e}.up_proj", (I, H))]
    out += [("model.layers.5.self_attn.k_proj.weight", (8, H)), ("model.layers.5.self_attn.v_proj.weight", (8, H))]
    return out


@pytest.fixture(scope="module", params=["0.19.0", "0.19.1", "0.20.0"])  # 0.19.1: the V100 engine (issue 24)
def gemma4_sources(request, tmp_path_factory, pristine_release):
    v = request.param
    return {
        "version": v,
        "unpatched": (pristine_release(v) / GEMMA4).read_text(),
        "patched": _patched_source(tmp_path_factory, v, PR40886),
        "after": _patched_source(
            tmp_path_factory, v, PR40886, variants={PR40886: set_edit_field("awq-moe-branches", "position", "after")}
        ),
    }


def test_patched_iterator_yields_per_expert_packed_and_scale_keys(gemma4_sources):
    ckpt = _checkpoint()
    got = _run_iterator(gemma4_sources["patched"], ckpt)
    assert [(n, tuple(t.shape)) for n, t in got] == _expected_names()


def test_patched_iterator_splits_gate_and_up_halves_and_keeps_dtypes(gemma4_sources):
    ckpt = dict(_checkpoint())
    got = dict(_run_iterator(gemma4_sources["patched"], ckpt.items()))
    pre, m = "model.language_model.layers.0.experts.", "model.layers.0.moe.experts"
    for kind in ("packed", "scale"):
        full = ckpt[f"{pre}gate_up_proj_{kind}"]
        down = ckpt[f"{pre}down_proj_{kind}"]
        for e in range(E):
            gate, up = got[f"{m}.{e}.gate_proj.weight_{kind}"], got[f"{m}.{e}.up_proj.weight_{kind}"]
            assert torch.equal(gate, full[e, :I, :]) and torch.equal(up, full[e, I:, :])
            assert torch.equal(got[f"{m}.{e}.down_proj.weight_{kind}"], down[e])
            assert gate.dtype == full.dtype and not torch.equal(gate, up)
    assert got[f"{m}.0.gate_proj.weight_packed"].dtype == torch.int32
    # the float branch and the k_eq_v duplication still work as before
    fused = ckpt[f"{pre}gate_up_proj"]
    assert torch.equal(got[f"{m}.3.up_proj"], fused[3, I:, :])
    k = got["model.layers.5.self_attn.k_proj.weight"]
    assert torch.equal(got["model.layers.5.self_attn.v_proj.weight"], k)


def test_unpatched_iterator_mangles_the_packed_keys(gemma4_sources):
    names = [n for n, _ in _run_iterator(gemma4_sources["unpatched"], _checkpoint())]
    # the float branch's substring test swallows "moe.gate_up_proj_packed": the bug the overlay fixes
    assert "model.layers.0.moe.experts.0.gate_proj_packed" in names
    assert not any("weight_packed" in n or "weight_scale" in n for n in names)


def test_branches_inserted_after_the_anchor_are_dead_code(gemma4_sources):
    after = gemma4_sources["after"]
    assert re.search(r"overlay:vllm-pr40886-gemma4-awq-moe-keys v\d+ awq-moe-branches", after)
    assert after.index('if "moe.gate_up_proj_packed" in name') > after.index('if "moe.gate_up_proj" in name')
    wrong = [(n, tuple(t.shape)) for n, t in _run_iterator(after, _checkpoint())]
    unpatched = [(n, tuple(t.shape)) for n, t in _run_iterator(gemma4_sources["unpatched"], _checkpoint())]
    assert wrong != _expected_names()
    # the float branch (the anchor) catches the fused packed/scale tensors first, as unpatched
    fused = 4 * E  # gate + up, packed + scale, per expert
    assert wrong[:fused] == unpatched[:fused]
    assert "model.layers.0.moe.experts.0.gate_proj_packed" in dict(wrong)
    assert not any(".gate_proj.weight_" in n or ".up_proj.weight_" in n for n, _ in wrong)
    right = [(n, tuple(t.shape)) for n, t in _run_iterator(gemma4_sources["patched"], _checkpoint())]
    assert right == _expected_names()


# --- (b) the Gemma-4 convertor against a real transformers Gemma4TextConfig --------------------

def _config_26b_a4b():
    from transformers import Gemma4Config

    text = dict(
        hidden_size=2816, num_hidden_layers=30, num_attention_heads=16,
        num_key_value_heads=8, num_global_key_value_heads=2, head_dim=256, global_head_dim=512,
        sliding_window=1024, layer_types=LAYER_TYPES, attention_k_eq_v=True,
        enable_moe_block=True, num_experts=128, top_k_experts=8, moe_intermediate_size=704,
        intermediate_size=2112,
    )
    hf_config = Gemma4Config(text_config=text)
    return hf_config, hf_config.get_text_config()


@pytest.fixture(scope="module", params=["0.19.1", "0.20.0", "0.26.0"])  # 0.19.1: the V100 engine (issue 24)
def convertors(request, tmp_path_factory, pristine_release):
    v = request.param
    pristine = pristine_release(v)
    utils = (pristine / "vllm/config/utils.py").read_text()
    return {
        "version": v,
        "patched": convertor_class(_patched_source(tmp_path_factory, v, CONVERTOR), utils, "Gemma4ModelArchConfigConvertor"),
        "unpatched": convertor_class((pristine / CONVERTOR_PY).read_text(), utils, "Gemma4ModelArchConfigConvertor"),
    }


def test_transformers_builds_a_heterogeneous_26b_a4b_config():
    import transformers
    from packaging.version import Version

    assert Version(transformers.__version__) >= Version("5.15")
    _, text = _config_26b_a4b()
    assert text.is_heterogeneous
    assert [text.per_layer_config[i].head_dim for i in (0, 5)] == [256, 512]
    assert [text.per_layer_config[i].num_key_value_heads for i in (0, 5)] == [8, 2]


def test_unpatched_convertor_raises_ambiguous_per_layer_attribute(convertors):
    from transformers.integrations.heterogeneity.configuration_utils import AmbiguousGlobalPerLayerAttributeError

    hf_config, text = _config_26b_a4b()
    conv = convertors["unpatched"](hf_config, text)
    with pytest.raises(AmbiguousGlobalPerLayerAttributeError, match="head_dim"):
        conv.get_head_size()
    with pytest.raises(AmbiguousGlobalPerLayerAttributeError, match="num_key_value_heads"):
        conv.get_total_num_kv_heads()


def test_patched_convertor_reads_the_global_and_sliding_values(convertors):
    hf_config, text = _config_26b_a4b()
    conv = convertors["patched"](hf_config, text)
    assert conv.get_head_size() == 512
    assert conv.get_total_num_kv_heads() == 8
    assert text.global_head_dim == 512 and text.num_global_key_value_heads == 2
    assert text.allow_global_per_layer_attribute_access is True
    assert text.head_dim == 256 and text.num_key_value_heads == 8
    # the per-layer view is untouched
    assert [text.per_layer_config[i].head_dim for i in FULL_LAYERS] == [512] * 5
    assert text.per_layer_config[0].head_dim == 256


def test_patched_convertor_kv_heads_work_before_head_size_is_asked(convertors):
    hf_config, text = _config_26b_a4b()
    assert convertors["patched"](hf_config, text).get_total_num_kv_heads() == 8
    assert text.num_global_key_value_heads == 2


def test_patched_convertor_leaves_a_homogeneous_config_alone(convertors):
    text = SimpleNamespace(head_dim=256, global_head_dim=512, num_key_value_heads=8, num_attention_heads=16,
                           hidden_size=2816, layer_types=LAYER_TYPES)
    conv = convertors["patched"](text, text)
    assert (conv.get_head_size(), conv.get_total_num_kv_heads()) == (512, 8)
    assert not hasattr(text, "allow_global_per_layer_attribute_access")
    # and the unpatched class gives the same answers there
    assert convertors["unpatched"](text, text).get_head_size() == 512


# --- (c) dict caches from a patched cuda.py -----------------------------------------------------


@pytest.fixture(scope="module")
def cuda_sources(tmp_path_factory, pristine_release):
    return {
        "unpatched": (pristine_release("0.20.0") / CUDA_PY).read_text(),
        "patched": _patched_source(tmp_path_factory, "0.20.0", DYNAMO),
    }


@pytest.fixture(scope="module")
def dict_cache(cuda_sources):
    return run_extracted(extract_def(cuda_sources["patched"], "_overlay_dict_cache"), {})["_overlay_dict_cache"]


def _decorators(source: str) -> dict[str, list[str]]:
    """qualname -> decorator sources, for every decorated function (methods as Class.name)."""
    out: dict[str, list[str]] = {}
    tree = ast.parse(source)
    for node in tree.body:
        defs = [(node.name, node)] if isinstance(node, ast.FunctionDef) else []
        if isinstance(node, ast.ClassDef):
            defs = [(f"{node.name}.{f.name}", f) for f in node.body if isinstance(f, ast.FunctionDef)]
        for q, f in defs:
            if f.decorator_list:
                out[q] = [ast.unparse(d) for d in f.decorator_list]
    return out


def test_patched_cuda_py_swaps_every_cache_decorator_and_keeps_the_bound(cuda_sources):
    before, after = _decorators(cuda_sources["unpatched"]), _decorators(cuda_sources["patched"])
    assert sorted(before) == sorted(after)
    swapped = 0
    for q, decs in before.items():
        want = []
        for d in decs:
            mm = re.fullmatch(r"(?:functools\.)?(cache|lru_cache)(?:\(maxsize=(\d+)\))?", d)
            if mm:
                swapped += 1
                want.append(f"_overlay_dict_cache(maxsize={mm.group(2)})" if mm.group(2) else "_overlay_dict_cache")
            else:
                want.append(d)
        assert after[q] == want, q
    assert swapped == 4
    assert after["_cuda_device_count_stateless"] == ["_overlay_dict_cache(maxsize=8)"]
    assert after["NvmlCudaPlatform.get_device_capability"] == ["classmethod", "_overlay_dict_cache", "with_nvml_context"]


def _counted(fn):
    calls = []

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        calls.append((args, kwargs))
        return fn(*args, **kwargs)

    wrapper.calls = calls
    return wrapper


CALLS = [((1,), {}), ((2,), {}), ((1,), {}), ((1,), {"y": 3}), ((1,), {"y": 3}), ((), {"x": 1}), ((2,), {}),
         ((), {"x": 1}), ((1, 2), {}), ((1,), {"y": 3, "z": 4})]


def _echo(*args, **kwargs):
    return ("value", args, tuple(sorted(kwargs.items())))


def test_dict_cache_returns_what_functools_cache_returns_once_per_key(dict_cache):
    ours_raw, ref_raw = _counted(_echo), _counted(_echo)
    ours, ref = dict_cache(ours_raw), functools.cache(ref_raw)
    assert [ours(*a, **k) for a, k in CALLS] == [ref(*a, **k) for a, k in CALLS]
    assert ours_raw.calls == ref_raw.calls  # computed once per key, the same keys
    assert len(ours_raw.calls) == 6
    assert ours.__name__ == "_echo" and ours.__wrapped__ is ours_raw


def test_dict_cache_keeps_keyword_and_positional_keys_apart(dict_cache):
    # f(x=1) and f((), (("x", 1),)) are different calls; functools separates them with a marker
    ours, ref = dict_cache(_counted(_echo)), functools.cache(_counted(_echo))
    calls = [((), {"x": 1}), (((), (("x", 1),)), {})]
    assert [ours(*a, **k) for a, k in calls] == [ref(*a, **k) for a, k in calls]


def test_dict_cache_on_a_classmethod_as_cuda_py_stacks_it(dict_cache, cuda_sources):
    """NvmlCudaPlatform.get_device_capability with its patched decorator stack and vLLM's own
    with_nvml_context (NVML stubbed): one NVML session and one computation per device id."""
    from typing import ParamSpec, TypeVar

    nvml = SimpleNamespace(inits=0)
    nvml.nvmlInit = lambda: setattr(nvml, "inits", nvml.inits + 1)
    nvml.nvmlShutdown = lambda: None
    ns = {"_overlay_dict_cache": dict_cache, "wraps": functools.wraps, "Callable": Callable,
          "_P": ParamSpec("_P"), "_R": TypeVar("_R"), "pynvml": nvml}
    run_extracted(extract_def(cuda_sources["patched"], "with_nvml_context"), ns)
    decs = _decorators(cuda_sources["patched"])["NvmlCudaPlatform.get_device_capability"]
    src = "class Platform:\n    calls = []\n" + "".join(f"    @{d}\n" for d in decs) + textwrap.indent(
        "def get_device_capability(cls, device_id=0):\n"
        "    cls.calls.append(device_id)\n"
        "    return (7, device_id, cls.__name__)\n",
        "    ",
    )
    P = run_extracted(src, ns)["Platform"]
    results = [P.get_device_capability(), P.get_device_capability(0), P.get_device_capability(1),
               P.get_device_capability(), P().get_device_capability(1)]
    assert results == [(7, 0, "Platform"), (7, 0, "Platform"), (7, 1, "Platform"), (7, 0, "Platform"), (7, 1, "Platform")]
    assert P.calls == [0, 0, 1]  # () and (0,) are different keys, as with functools.cache
    assert nvml.inits == 3
    P.get_device_capability.cache_clear()
    assert P.get_device_capability(1) == (7, 1, "Platform") and P.calls == [0, 0, 1, 1]


def test_dict_cache_cache_clear_forgets_every_key(dict_cache):
    raw = _counted(lambda x: x * 10)
    f = dict_cache(raw)
    assert [f(1), f(2), f(1)] == [10, 20, 10] and len(raw.calls) == 2
    assert f.cache_size() == 2
    f.cache_clear()
    assert f.cache_size() == 0
    assert f(1) == 10 and len(raw.calls) == 3


def test_dict_cache_maxsize_bound_holds(dict_cache):
    raw = _counted(lambda x: x * x)
    f = dict_cache(maxsize=2)(raw)
    assert [f(k) for k in (1, 2, 1, 3)] == [1, 4, 1, 9]
    assert len(raw.calls) == 3 and f.cache_size() == 2  # 3 evicted the oldest key, 1
    assert f(2) == 4 and len(raw.calls) == 3  # 2 still cached
    assert f(1) == 1 and len(raw.calls) == 4  # 1 was evicted: computed again
    for k in range(10, 30):
        f(k)
        assert f.cache_size() <= 2
    # the patched file keeps lru_cache(maxsize=8) as a bound of 8
    g_raw = _counted(lambda x: x)
    g = dict_cache(maxsize=8)(g_raw)
    for k in range(20):
        g(k)
    assert g.cache_size() == 8


def test_dict_cache_with_maxsize_zero_caches_nothing_like_lru_cache(dict_cache):
    raw, ref_raw = _counted(lambda x: x + 1), _counted(lambda x: x + 1)
    f, ref = dict_cache(maxsize=0)(raw), functools.lru_cache(maxsize=0)(ref_raw)
    assert [f(1), f(1)] == [ref(1), ref(1)] == [2, 2]
    assert len(raw.calls) == len(ref_raw.calls) == 2


ASSETS_PY = "vllm/assets/base.py"  # 0.20.0: a bare `@lru_cache` (functools' default bound: 128)


def test_dict_cache_keeps_the_default_bound_of_a_bare_lru_cache(tmp_path, dict_cache):
    """The targets list is data: the same edit on another real file. A bare @lru_cache is
    bounded at 128 entries by functools; the dict cache must keep that bound, not drop it."""

    def add_target(raw, odir):
        raw["targets"] = [CUDA_PY, ASSETS_PY]

    cat = shipped_catalog(tmp_path / "cat", ids=[DYNAMO], variants={DYNAMO: add_target})
    root = slim_root("0.20.0", tmp_path / "site", rels=[CUDA_PY, ASSETS_PY])
    before = (root / ASSETS_PY).read_text()
    assert _decorators(before)["get_vllm_public_assets"] == ["lru_cache"]
    result = apply(load_overlays(cat), root)
    assert sorted(c.path for c in result.changes) == sorted([CUDA_PY, ASSETS_PY])
    [dec] = _decorators((root / ASSETS_PY).read_text())["get_vllm_public_assets"]
    raw, ref_raw = _counted(lambda name: name.upper()), _counted(lambda name: name.upper())
    f = eval(dec, {"_overlay_dict_cache": dict_cache})(raw)
    ref = functools.lru_cache(ref_raw)
    for k in range(300):
        assert f(f"file{k}") == ref(f"file{k}")
    assert f.cache_size() == ref.cache_info().currsize == 128
