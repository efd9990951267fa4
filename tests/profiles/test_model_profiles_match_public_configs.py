"""Every model profile is derived from its public config.json (issue 11).

tests/fixtures/hf-configs/<profile id>.json is the model's public config.json (see the README there for the
address, the date and which fields come from where). Each is imported through the real CLI
(`overlay profiles import-config`) and the derived architecture, layer groups, heads, head dims, window,
KV sharing and context must equal the catalog's profile: a hand-typed number that the public config
contradicts fails here.
"""

from __future__ import annotations


import pytest
import yaml

from manager.catalog import Catalog
from manager.fits import kv_bytes
from manager.profiles import load_profiles
from manager.profiles.schema import ModelProfile
from tests.helpers import REPO_ROOT, TEST_FIXTURES
from tests.helpers.cli import run_cli

FIXTURES = TEST_FIXTURES / "hf-configs"
CATALOG = load_profiles(Catalog(REPO_ROOT))

FIELDS = ("architecture", "family", "hidden_size", "num_layers", "num_attention_heads", "vocab_size",
          "intermediate_size", "max_context", "multimodal", "min_transformers")


def _groups(groups) -> list[tuple]:
    return sorted((g.kind, g.count, g.kv_heads, g.head_dim, g.window, g.k_eq_v, g.kv_shared) for g in groups)


def _imported(mid: str) -> ModelProfile:
    res = run_cli("--catalog", str(REPO_ROOT), "profiles", "import-config", str(FIXTURES / f"{mid}.json"), "--id", mid)
    assert res.exit_code == 0, res.output
    return ModelProfile.model_validate(yaml.safe_load(res.stdout))


def test_every_model_profile_has_a_fixture_and_every_fixture_a_profile():
    assert sorted(p.stem for p in FIXTURES.glob("*.json")) == sorted(CATALOG.models)
    readme = (FIXTURES / "README.md").read_text()
    for mid in CATALOG.models:
        assert f"| {mid} |" in readme, f"{mid}: the README must give its address and field sources"


@pytest.mark.parametrize("mid", sorted(CATALOG.models))
def test_profile_matches_its_public_config(mid):
    got, want = _imported(mid), CATALOG.models[mid]
    mismatches = {f: (getattr(got, f), getattr(want, f)) for f in FIELDS if getattr(got, f) != getattr(want, f)}
    assert not mismatches, f"{mid}: derived != profile: {mismatches}"
    assert _groups(got.layer_groups) == _groups(want.layer_groups)
    assert (got.moe is None) == (want.moe is None) and (got.moe is None or got.moe == want.moe)


def test_12b_is_gemma4_unified_with_one_global_kv_head():
    m = _imported("gemma-4-12b")
    assert (m.architecture, m.family) == ("Gemma4UnifiedForConditionalGeneration", "gemma4_unified")
    full = [g for g in m.layer_groups if g.kind == "full"]
    assert [(g.count, g.kv_heads, g.head_dim) for g in full] == [(8, 1, 512)]


def test_e2b_kv_bytes_per_token_is_6144_not_the_transformers_default():
    m = CATALOG.models["gemma-4-e2b"]
    # growing KV: 3 full layers that are not KV-shared x 1 head x 512 x (K, V) x 2 B
    assert kv_bytes(m, tp=1, dtype_bytes=2, k_eq_v_copies=2, ctx=1)[0] == 3 * 1 * 512 * 2 * 2 == 6_144
    assert (m.hidden_size, m.num_layers, m.intermediate_size) == (1536, 35, 6144)
