"""gemma4-mtp-per-layer (issue 11, point 3): the Gemma-4 MTP drafter under transformers >= 5.15.

On the real 0.22.0 and 0.27.1 sources, with a real transformers (>= 5.15) Gemma4AssistantConfig:
unpatched, Gemma4MTPModelArchConfigConvertor.get_head_size / get_total_num_kv_heads and the head-size
code of Gemma4MTPDecoderLayer.__init__ raise AmbiguousGlobalPerLayerAttributeError; patched they give
the values a pre-5.15 flat config gives. Status on the real 0.20.0-0.28.0 sdists; fits() needs it only
for a gemma4_mtp drafter on those releases.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from manager.catalog import Catalog
from manager.fits import build_index, fits
from manager.overlays import apply, load_overlays, status_on_release
from manager.profiles import load_profiles
from tests.helpers import REPO_ROOT
from tests.helpers.catalogs import CONVERTOR, CONVERTOR_PY, shipped_catalog, slim_root
from tests.overlays.shipped.extracted import convertor_class, extract_def, run_extracted

transformers = pytest.importorskip("transformers")

MTP = "gemma4-mtp-per-layer"
MTP_PY = "vllm/model_executor/models/gemma4_mtp.py"
STATUS = {"0.20.0": "not-applicable", "0.22.0": "pending", "0.24.0": "pending", "0.27.1": "pending", "0.28.0": "upstream",
          "0.33.0": "upstream"}
LAYER_TYPES = ["sliding_attention"] * 3 + ["full_attention"]


def assistant_config():
    """A real transformers Gemma4AssistantConfig: 26B-A4B-style attention shapes, one full layer of four."""
    from transformers import Gemma4AssistantConfig

    text = dict(hidden_size=1024, num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=8,
                num_global_key_value_heads=2, head_dim=256, global_head_dim=512, layer_types=LAYER_TYPES,
                sliding_window=1024, attention_k_eq_v=True, hidden_size_per_layer_input=0,
                vocab_size_per_layer_input=0, enable_moe_block=False, use_double_wide_mlp=False,
                num_kv_shared_layers=4)
    cfg = Gemma4AssistantConfig(backbone_hidden_size=2816, text_config=text)
    return cfg, cfg.text_config


def flat_text():
    return SimpleNamespace(head_dim=256, global_head_dim=512, num_key_value_heads=8, num_global_key_value_heads=2,
                           num_attention_heads=16, hidden_size=1024, layer_types=LAYER_TYPES, attention_k_eq_v=True)


def _patched(version: str, tmp: Path) -> Path:
    root = slim_root(version, tmp / f"site-{version}", (CONVERTOR_PY, MTP_PY))
    overlays = load_overlays(shipped_catalog(tmp / f"cat-{version}", ids=[CONVERTOR, MTP]))
    res = apply(overlays, root)
    assert res.statuses.by_id(MTP).status == "applied"
    return root


def _layer_head_code(source: str) -> Callable[[Any, int], dict[str, Any]]:
    """The statements of Gemma4MTPDecoderLayer.__init__ that pick the layer's head size and KV heads
    (everything after super().__init__ up to building the attention module), run on a config."""
    init = ast.parse(extract_def(source, "Gemma4MTPDecoderLayer.__init__")).body[0]
    keep = []
    for stmt in init.body:  # type: ignore[attr-defined]
        code = ast.unparse(stmt)
        if "Gemma4MTPAttention(" in code:
            break
        if code.startswith(("super()", "self.")):
            continue
        keep.append(code)
    ns: dict[str, Any] = {}
    if "def _overlay_gemma4_mtp_compat(" in source:
        run_extracted(extract_def(source, "_overlay_gemma4_mtp_compat"), ns)

    def run(config, layer: int) -> dict[str, Any]:
        local = dict(ns, config=config, prefix=f"model.layers.{layer}", extract_layer_index=lambda p: int(p.split(".")[-1]))
        return run_extracted("\n".join(keep), local)

    return run


@pytest.fixture(scope="module", params=["0.22.0", "0.27.1"])
def sources(request, pristine_release, tmp_path_factory):
    v = request.param
    pristine = pristine_release(v)
    root = _patched(v, tmp_path_factory.mktemp("mtp"))
    utils = (pristine / "vllm/config/utils.py").read_text()
    return {
        "conv": convertor_class((root / CONVERTOR_PY).read_text(), utils, "Gemma4MTPModelArchConfigConvertor"),
        "conv_unpatched": convertor_class((pristine / CONVERTOR_PY).read_text(), utils, "Gemma4MTPModelArchConfigConvertor"),
        "layer": _layer_head_code((root / MTP_PY).read_text()),
        "layer_unpatched": _layer_head_code((pristine / MTP_PY).read_text()),
    }


def test_transformers_assistant_text_config_is_heterogeneous():
    from packaging.version import Version

    assert Version(transformers.__version__) >= Version("5.15")
    _, text = assistant_config()
    assert text.is_heterogeneous and [text.per_layer_config[i].head_dim for i in range(4)] == [256, 256, 256, 512]


def test_unpatched_mtp_convertor_and_layer_raise(sources):
    from transformers.integrations.heterogeneity.configuration_utils import AmbiguousGlobalPerLayerAttributeError

    cfg, text = assistant_config()
    with pytest.raises(AmbiguousGlobalPerLayerAttributeError, match="head_dim"):
        sources["conv_unpatched"](cfg, text).get_head_size()
    cfg, text = assistant_config()
    with pytest.raises(AmbiguousGlobalPerLayerAttributeError, match="head_dim"):
        sources["layer_unpatched"](text, 3)


def test_patched_mtp_convertor_answers_as_a_flat_config_does(sources):
    cfg, text = assistant_config()
    conv = sources["conv"](cfg, text)
    flat = flat_text()
    want = sources["conv_unpatched"](flat, flat)
    assert (conv.get_head_size(), conv.get_total_num_kv_heads()) == (want.get_head_size(), want.get_total_num_kv_heads()) == (256, 8)
    assert text.global_head_dim == 512 and text.num_global_key_value_heads == 2


def _shape(ns: dict[str, Any]) -> tuple[int, int]:
    # 0.27.1 picks num_kv_heads per layer (K=V layers: the global count); 0.22.0 passes
    # config.num_key_value_heads straight to the attention module
    return ns["head_dim"], ns.get("num_kv_heads", ns["config"].num_key_value_heads)


def test_patched_mtp_layer_picks_the_per_layer_head_size_and_kv_heads(sources):
    for layer, head in ((0, 256), (3, 512)):
        _, text = assistant_config()
        got = _shape(sources["layer"](text, layer))
        want = _shape(sources["layer_unpatched"](flat_text(), layer))
        assert got == want and got[0] == head


@pytest.mark.parametrize("version", sorted(STATUS))
def test_status_on_real_releases(version, pristine_release):
    src = pristine_release(version) / MTP_PY
    native = src.is_file() and ("gemma4_layer_config(" in src.read_text() or "config.per_layer_config[" in src.read_text())
    assert native == (STATUS[version] == "upstream")
    assert status_on_release(version, Catalog(REPO_ROOT), ids=[MTP]).by_id(MTP).status == STATUS[version]


def test_fits_needs_it_for_the_mtp_drafter_on_0_27_1_only():
    P = load_profiles(Catalog(REPO_ROOT))
    idx = build_index(Catalog(REPO_ROOT))
    kw = dict(model="gemma-4-26b-a4b", hardware="rtx-3090", gpus=2, overlay_index=idx)
    with_drafter = fits(P, engine="vllm-0.27.1", drafter="gemma-4-26b-a4b-assistant", **kw)
    assert MTP in with_drafter.overlays and CONVERTOR in with_drafter.overlays
    assert MTP not in fits(P, engine="vllm-0.27.1", **kw).overlays
    assert MTP not in fits(P, engine="vllm-0.28.0", drafter="gemma-4-26b-a4b-assistant", **kw).overlays
