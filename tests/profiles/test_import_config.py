"""import-config: model profiles from config.json, both Gemma-4 config forms, built with real transformers."""

from __future__ import annotations

import json

import pytest

from manager.catalog import Catalog
from manager.errors import ProfileError
from manager.profiles import import_config, load_profiles, profile_from_config
from manager.profiles.schema import ModelProfile
from tests.helpers import REPO_ROOT

transformers = pytest.importorskip("transformers")
from transformers import Gemma4Config, Gemma4TextConfig


# Public values (the public config.json of google/gemma-4-26B-A4B-it; tests/fixtures/hf-configs/README.md).
A4B = dict(hidden_size=2816, num_hidden_layers=30, num_attention_heads=16, num_key_value_heads=8, head_dim=256,
           sliding_window=1024, attention_k_eq_v=True, enable_moe_block=True, num_experts=128, top_k_experts=8,
           moe_intermediate_size=704, intermediate_size=2112, max_position_embeddings=262144, vocab_size=262144)
DENSE_31B = dict(hidden_size=5376, num_hidden_layers=60, num_attention_heads=32, num_key_value_heads=16,
                 head_dim=256, sliding_window=1024, attention_k_eq_v=True, max_position_embeddings=262144,
                 vocab_size=262144)


def _groups(prof: dict) -> list[tuple]:
    return sorted((g["kind"], g["count"], g["kv_heads"], g["head_dim"], g.get("window"), g.get("k_eq_v", False),
                   g.get("kv_shared", 0)) for g in prof["layer_groups"])


def _catalog_groups(mid: str) -> list[tuple]:
    m = load_profiles(Catalog(REPO_ROOT)).models[mid]
    return sorted((g.kind, g.count, g.kv_heads, g.head_dim, g.window, g.k_eq_v, g.kv_shared) for g in m.layer_groups)


def _per_layer_form(values: dict, global_head_dim: int, global_kv: int) -> dict:
    """transformers >= 5.15: the global values end up in per_layer_config."""
    text = Gemma4TextConfig(**values, global_head_dim=global_head_dim, num_global_key_value_heads=global_kv)
    cfg = Gemma4Config(text_config=text.to_dict()).to_dict()
    cfg["architectures"] = ["Gemma4ForConditionalGeneration"]
    return cfg


def _flat_form(values: dict, global_head_dim: int, global_kv: int) -> dict:
    """Pre-5.15 flat config.json: global_head_dim / num_global_key_value_heads next to head_dim."""
    n = values["num_hidden_layers"]
    text = {**values, "model_type": "gemma4_text", "global_head_dim": global_head_dim,
            "num_global_key_value_heads": global_kv,
            "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n)]}
    return {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"], "text_config": text,
            "vision_config": {}, "dtype": "bfloat16"}


def test_per_layer_form_really_moves_global_values(tmp_path):
    cfg = _per_layer_form(A4B, 512, 2)["text_config"]
    assert cfg.get("global_head_dim") is None and cfg["per_layer_config"]
    assert {v["head_dim"] for v in cfg["per_layer_config"].values()} == {512}


@pytest.mark.parametrize("form", [_per_layer_form, _flat_form], ids=["per-layer>=5.15", "flat<5.15"])
def test_26b_a4b_import_matches_the_catalog_layer_groups(tmp_path, form):
    path = tmp_path / "gemma-4-26b-a4b" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(form(A4B, 512, 2)))
    prof = import_config(path, size_gb=17.0)
    assert prof["id"] == "gemma-4-26b-a4b" and prof["family"] == "gemma4"
    assert _groups(prof) == _catalog_groups("gemma-4-26b-a4b")
    assert prof["moe"] == {"experts": 128, "top_k": 8, "expert_intermediate_size": 704}
    assert prof["multimodal"] is True
    ModelProfile.model_validate(prof)


@pytest.mark.parametrize("form", [_per_layer_form, _flat_form], ids=["per-layer>=5.15", "flat<5.15"])
def test_31b_dense_import_has_four_global_kv_heads(form):
    prof = profile_from_config(form(DENSE_31B, 512, 4), model_id="g31")
    assert _groups(prof) == _catalog_groups("gemma-4-31b")
    assert "moe" not in prof


def test_kv_shared_layers_are_counted_per_kind():
    values = dict(hidden_size=1024, num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                  sliding_window=512, num_kv_shared_layers=6, max_position_embeddings=32768, vocab_size=1000)
    prof = profile_from_config(_per_layer_form(values, 256, 2), model_id="tiny")
    by_kind = {g["kind"]: g for g in prof["layer_groups"]}
    # layers 6..11 reuse caches: 5 sliding (6,7,8,9,10) + 1 full (11)
    assert by_kind["sliding"]["kv_shared"] == 5 and by_kind["full"]["kv_shared"] == 1


def test_generic_decoder_without_layer_types_is_all_full_attention():
    cfg = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048,
           "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 128,
           "num_experts": 64, "num_experts_per_tok": 8, "moe_intermediate_size": 512, "vocab_size": 1000,
           "max_position_embeddings": 40960, "torch_dtype": "bfloat16"}
    prof = profile_from_config(cfg, model_id="q", size_gb=1.0)
    assert _groups(prof) == [("full", 4, 2, 128, None, False, 0)]
    assert prof["family"] == "qwen3_moe" and prof["moe"]["top_k"] == 8


def test_compressed_tensors_quantization_becomes_the_weight_variant():
    cfg = _flat_form(A4B, 512, 2)
    cfg["quantization_config"] = {"quant_method": "compressed-tensors", "format": "pack-quantized",
                                  "config_groups": {"group_0": {"weights": {"num_bits": 4, "group_size": 32}}}}
    prof = profile_from_config(cfg, model_id="awq", size_gb=17.0)
    (vid, w), = prof["weights"].items()
    assert w["format"] == "compressed-tensors" and w["bits"] == 4 and w["group_size"] == 32
    assert prof["default_weights"] == vid


def test_malformed_json_names_the_file(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{nope")
    with pytest.raises(ProfileError, match=r"config.json: line 1: malformed JSON"):
        import_config(bad)


def test_missing_required_key_names_it(tmp_path):
    with pytest.raises(ProfileError, match=r"num_attention_heads: missing"):
        profile_from_config({"hidden_size": 8, "num_hidden_layers": 1}, model_id="x")


def test_cli_import_config_writes_then_reports_identical(tmp_path, cli_run):
    src = tmp_path / "config.json"
    src.write_text(json.dumps(_per_layer_form(A4B, 512, 2)))
    out = tmp_path / "profiles" / "models" / "mine.yaml"
    r1 = cli_run("profiles", "import-config", str(src), "--id", "mine", "--size-gb", "17", "-o", str(out))
    assert r1.exit_code == 0, r1.output
    assert "create" in r1.output and out.is_file()
    r2 = cli_run("profiles", "import-config", str(src), "--id", "mine", "--size-gb", "17", "-o", str(out))
    assert "identical" in r2.output
    r3 = cli_run("profiles", "validate", str(out))
    assert r3.exit_code == 0, r3.output
