"""Profiles: the shipped catalog, schema errors (file, key path, value), cross-checks."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from manager.catalog import Catalog
from manager.errors import ProfileError
from manager.profiles import load_profiles, load_profiles_dir, validate_path
from tests.helpers import REPO_ROOT

SHIPPED = REPO_ROOT / "profiles"

STOCK = ["0.19.0", "0.20.0", "0.22.0", "0.26.0", "0.27.1", "0.28.0", "0.30.0", "0.33.0"]


@pytest.fixture(scope="module")
def profiles():
    return load_profiles(Catalog(REPO_ROOT))


@pytest.fixture
def tmp_profiles(tmp_path: Path) -> Path:
    dest = tmp_path / "profiles"
    shutil.copytree(SHIPPED, dest)
    return dest


def _edit(path: Path, fn) -> None:
    data = yaml.safe_load(path.read_text())
    fn(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def test_catalog_has_every_required_id(profiles):
    assert {"gemma-4-26b-a4b", "gemma-4-31b", "gemma-4-12b", "gemma-4-e2b", "gemma-4-e4b"} <= set(profiles.models)
    assert {"awq", "autoround-int4-mixed", "nvfp4", "bf16"} <= set(profiles.models["gemma-4-26b-a4b"].weights)
    for mid in ("gemma-4-31b", "gemma-4-12b"):
        assert {"bf16", "nvfp4"} <= set(profiles.models[mid].weights)
    assert {"v100-sxm2-16gb", "v100-sxm2-32gb", "v100-pcie-16gb", "rtx-3090", "rtx-4090", "rtx-5090",
            "a100-40gb", "a100-80gb", "h100-80gb", "h200"} <= set(profiles.hardware)
    assert {f"vllm-{v}" for v in STOCK} | {"vllm-0.19.1-sm70"} <= set(profiles.engines)
    assert {"gemma-4-26b-a4b-assistant", "gemma-4-31b-assistant"} <= set(profiles.drafters)


@pytest.mark.parametrize("version", STOCK)
def test_stock_engine_image_and_ref_name_the_release(profiles, version):
    e = profiles.engines[f"vllm-{version}"]
    assert e.image == f"vllm/vllm-openai:v{version}"
    assert e.vllm_version == version and e.upstream_ref == f"v{version}"
    assert e.upstream_repo == "vllm-project/vllm"
    assert e.python_version == "3.12"
    assert "transformers_version" in e.sources


def test_v100_engine_is_stock_0_19_1_built_locally_and_fully_sourced(profiles):
    e = profiles.engines["vllm-0.19.1-sm70"]
    assert not e.fork and e.upstream_ref == "v0.19.1" and e.min_sm == 7.0 == e.target_sm
    assert e.image == "overlay-manager/vllm-v100:0.19.1-cu128" and e.image_recipe == "vllm-v100"
    assert (e.python_version, e.cuda_version) == ("3.12", "12.8") and 7.0 in e.cuda_arch_list
    assert e.unverified == []
    assert "no registry" in e.sources["image"] or "not pushed" in e.sources["image"]
    assert "docs/audit.md" in e.sources["cuda_arch_list/min_sm"]
    for text in [*e.sources.values(), e.image]:
        assert "PLACEHOLDER" not in text.upper()


def test_no_profile_cites_a_machine_path(profiles):
    """Sources name a release file, a public URL or a shipped doc/test: never a path on some machine."""
    for kind in ("engines", "hardware", "models", "drafters"):
        for pid, prof in getattr(profiles, kind).items():
            texts = [*prof.sources.values(), *(b.source for b in getattr(prof, "attention", []))]
            for w in getattr(prof, "weights", {}).values():
                texts += [*w.sources.values(), *(kb.source for kb in w.known_broken)]
            for t in texts:
                assert "/work/" not in t and "shared/facts" not in t, (kind, pid, t)


def test_seed_architecture_facts_of_26b_a4b(profiles):
    m = profiles.models["gemma-4-26b-a4b"]
    full = [g for g in m.layer_groups if g.kind == "full"]
    sliding = [g for g in m.layer_groups if g.kind == "sliding"]
    assert [(g.count, g.kv_heads, g.head_dim, g.k_eq_v) for g in full] == [(5, 2, 512, True)]
    assert [(g.count, g.kv_heads, g.head_dim, g.window) for g in sliding] == [(25, 8, 256, 1024)]
    assert m.moe.experts == 128 and m.moe.top_k == 8 and m.moe.expert_intermediate_size == 704
    assert m.weights["autoround-int4-mixed"].group_size == 128


def test_31b_has_four_global_kv_heads_not_sixteen(profiles):
    full = [g for g in profiles.models["gemma-4-31b"].layer_groups if g.kind == "full"][0]
    assert (full.count, full.kv_heads, full.head_dim) == (10, 4, 512)


def test_every_unverified_or_sourced_profile_carries_notes(profiles):
    # Facts we could not verify are marked; hardware records where its numbers come from.
    for hw in profiles.hardware.values():
        assert hw.sources, hw.id
    assert "architecture" in profiles.models["gemma-4-e4b"].sources


@pytest.mark.parametrize("version", ["0.20.0", "0.33.0"])
def test_k_eq_v_cache_copies_match_the_release_model_code(profiles, pristine_release, version):
    """The engine fact (two stored copies) is read from that release's gemma4.py."""
    src = (pristine_release(version) / "vllm/model_executor/models/gemma4.py").read_text()
    # K weights are loaded into both the K and the V slots of qkv_proj; attention stores both.
    two_copies = "V == K automatically" in src and "self.attn(q, k, v)" in src
    assert profiles.engines[f"vllm-{version}"].k_eq_v_cache_copies == (2 if two_copies else 1)


def test_unknown_key_is_reported_with_file_and_path(tmp_profiles):
    f = tmp_profiles / "hardware" / "rtx-3090.yaml"
    _edit(f, lambda d: d.update(vram_gbs=24))
    with pytest.raises(ProfileError) as exc:
        load_profiles_dir(tmp_profiles)
    assert f"{f}: vram_gbs: 24: unknown key" in str(exc.value)


def test_wrong_type_in_nested_layer_group_names_the_key_path(tmp_profiles):
    f = tmp_profiles / "models" / "gemma-4-31b.yaml"
    _edit(f, lambda d: d["layer_groups"][1].update(kv_heads="four"))
    with pytest.raises(ProfileError) as exc:
        load_profiles_dir(tmp_profiles)
    assert f"{f}: layer_groups[1].kv_heads: 'four':" in str(exc.value)


def test_malformed_yaml_is_reported_with_its_line(tmp_profiles):
    f = tmp_profiles / "engines" / "vllm-0.33.0.yaml"
    f.write_text("id: vllm-0.33.0\nimage: [unclosed\n")
    with pytest.raises(ProfileError) as exc:
        load_profiles_dir(tmp_profiles)
    assert str(f) in str(exc.value) and "malformed YAML" in str(exc.value)


def test_all_errors_are_reported_not_only_the_first(tmp_profiles):
    _edit(tmp_profiles / "hardware" / "h200.yaml", lambda d: d.update(sm="nine"))
    _edit(tmp_profiles / "models" / "gemma-4-12b.yaml", lambda d: d.update(default_weights="int3"))
    _edit(tmp_profiles / "drafters" / "gemma-4-31b-assistant.yaml", lambda d: d.update(models=["gemma-5"]))
    with pytest.raises(ProfileError) as exc:
        load_profiles_dir(tmp_profiles)
    msg = str(exc.value)
    assert msg.startswith("4 profile problems")
    # the drafter change also breaks the model's back-reference: reported too
    assert "gemma-4-31b.yaml: drafters[0]: 'gemma-4-31b-assistant': drafter does not list model" in msg
    assert "h200.yaml: sm: 'nine':" in msg
    assert "gemma-4-12b.yaml: default_weights: 'int3': no such weight variant" in msg
    assert "gemma-4-31b-assistant.yaml: models[0]: 'gemma-5': unknown model" in msg


def test_dangling_drafter_reference_names_file_and_key(tmp_profiles):
    (tmp_profiles / "drafters" / "gemma-4-26b-a4b-assistant.yaml").unlink()
    with pytest.raises(ProfileError) as exc:
        load_profiles_dir(tmp_profiles)
    assert "gemma-4-26b-a4b.yaml: drafters[0]: 'gemma-4-26b-a4b-assistant': unknown drafter" in str(exc.value)


def test_id_must_match_file_name(tmp_profiles):
    _edit(tmp_profiles / "hardware" / "rtx-4090.yaml", lambda d: d.update(id="rtx-4080"))
    with pytest.raises(ProfileError, match=r"rtx-4090.yaml: id: 'rtx-4080': must match the file name"):
        load_profiles_dir(tmp_profiles)


def test_stock_engine_with_a_mismatched_ref_is_rejected(tmp_profiles):
    _edit(tmp_profiles / "engines" / "vllm-0.28.0.yaml", lambda d: d.update(upstream_ref="v0.27.1"))
    with pytest.raises(ProfileError, match=r"upstream_ref must be v0.28.0"):
        load_profiles_dir(tmp_profiles)


def test_layer_groups_must_add_up_to_num_layers(tmp_profiles):
    _edit(tmp_profiles / "models" / "gemma-4-12b.yaml", lambda d: d["layer_groups"][0].update(count=41))
    with pytest.raises(ProfileError, match=r"layer_groups count to 49, num_layers is 48"):
        load_profiles_dir(tmp_profiles)


def test_validate_path_accepts_a_single_file_and_a_catalog_root(tmp_profiles):
    one = validate_path(tmp_profiles / "hardware" / "h200.yaml")
    assert list(one.hardware) == ["h200"]
    whole = validate_path(tmp_profiles.parent)
    assert len(whole.engines) == len(list((tmp_profiles / "engines").glob("*.yaml")))
