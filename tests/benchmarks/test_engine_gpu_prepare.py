"""The CPU side of the H200 engine run: wheel stripping, parts, the carry plan, receive/install, the run plan.

benchmarks/engine_gpu_prepare.py and benchmarks/engine_gpu.py are scripts; they are loaded by path.
Nothing here downloads: the one test on the real vLLM wheel runs only when it is already cached.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.helpers import BENCHMARKS

MIB = 1 << 20


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", BENCHMARKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


prep = _load("engine_gpu_prepare")
egpu = _load("engine_gpu")


def _fake_wheel(path: Path, fa2: bool = True, fa3: bool = True) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("vllm/__init__.py", "__version__ = '0.20.0'\n")
        z.writestr("vllm/_C.abi3.so", b"\x7fELF" + b"c" * 1000)
        z.writestr("vllm/vllm_flash_attn/__init__.py", "")
        if fa2:
            z.writestr(prep.FA2, b"2" * 5000)
        if fa3:
            z.writestr(prep.FA3, b"3" * 3000)
        z.writestr("vllm-0.20.0.dist-info/METADATA", "Name: vllm\nVersion: 0.20.0\n")
    return path


# --- the wheel ---------------------------------------------------------------------------------


def test_stripped_wheel_lacks_fa2_but_keeps_fa3_and_the_dist_info(tmp_path):
    info = prep.strip_vllm_wheel(_fake_wheel(tmp_path / "v.whl"), tmp_path / "tree")
    assert not (tmp_path / "tree" / prep.FA2).exists()
    assert (tmp_path / "tree" / prep.FA3).read_bytes() == b"3" * 3000
    assert (tmp_path / "tree" / "vllm-0.20.0.dist-info" / "METADATA").exists()
    assert info["dropped"] == [prep.FA2] and info["dropped_bytes"] == 5000 and info["files"] == 5


def test_a_wheel_without_fa3_is_refused_since_registry_inspection_needs_one_fa_library(tmp_path):
    with pytest.raises(prep.PrepareError, match="_vllm_fa3_C.abi3.so missing"):
        prep.strip_vllm_wheel(_fake_wheel(tmp_path / "v.whl", fa3=False), tmp_path / "tree")
    assert not (tmp_path / "tree").exists()


def test_a_wheel_without_fa2_is_refused_as_the_wrong_wheel(tmp_path):
    with pytest.raises(prep.PrepareError, match="_vllm_fa2_C.abi3.so not in the wheel"):
        prep.strip_vllm_wheel(_fake_wheel(tmp_path / "v.whl", fa2=False), tmp_path / "tree")


# --- dependency list ---------------------------------------------------------------------------


def test_dependency_wheels_are_pinned_once_each_and_cover_the_overlay_tool():
    prep.check_one_version_each(prep.DEPENDENCY_WHEELS)
    names = {s.split("==")[0] for s in prep.DEPENDENCY_WHEELS}
    assert {"pydantic", "pydantic-core", "libcst", "compressed-tensors", "pycountry"} <= names
    libcst = next(s for s in prep.DEPENDENCY_WHEELS if s.startswith("libcst=="))
    assert tuple(int(x) for x in libcst.split("==")[1].split(".")[:2]) >= (1, 8)
    assert "manylinux_2_28_x86_64" in prep.PLATFORMS   # libcst >= 1.8 has only manylinux_2_28 cp312 wheels
    assert not names & {"torch", "transformers", "triton", "numpy", "vllm"}   # the image's own


@pytest.mark.parametrize("specs, msg", [
    (("pydantic==2.12.5", "Pydantic==2.11.0"), "listed twice"),
    (("libcst",), "not pinned"),
])
def test_two_versions_or_an_unpinned_name_are_refused(specs, msg):
    with pytest.raises(prep.PrepareError, match=msg):
        prep.check_one_version_each(specs)


# --- parts and the carry plan ------------------------------------------------------------------


def test_split_parts_are_at_most_the_part_size_and_join_back_to_the_same_bytes(tmp_path):
    data = bytes(range(256)) * 4099          # 1,049,344 bytes: 4 parts of 300,000 + a tail
    src = tmp_path / "blob"
    src.write_bytes(data)
    parts = prep.split_file(src, 300_000, tmp_path / "parts", "blob")
    assert [p.size for p in parts] == [300_000, 300_000, 300_000, 149_344]
    assert [p.index for p in parts] == [0, 1, 2, 3]
    work = tmp_path / "work"
    (work / "in").mkdir(parents=True)
    for p in parts:
        (work / "in" / p.name).write_bytes((tmp_path / "parts" / p.name).read_bytes())
    manifest = {"groups": {"blob": {"parts": [p.name for p in parts], "sha256": hashlib.sha256(data).hexdigest()}}}
    assert egpu._join(manifest, work, "blob").read_bytes() == data


def test_a_corrupt_part_stops_the_join(tmp_path):
    src = tmp_path / "blob"
    src.write_bytes(b"x" * 1000)
    parts = prep.split_file(src, 400, tmp_path / "in", "blob")
    (tmp_path / "in" / parts[1].name).write_bytes(b"y" * 400)
    manifest = {"groups": {"blob": {"parts": [p.name for p in parts], "sha256": hashlib.sha256(b"x" * 1000).hexdigest()}}}
    with pytest.raises(SystemExit, match="blob does not match its sha256"):
        egpu._join(manifest, tmp_path, "blob")


def _pieces(sizes):
    return [prep.Piece(f"p{i}", s, "0" * 64, f"g{i}") for i, s in enumerate(sizes)]


def test_carry_plan_keeps_every_call_within_the_limit_with_the_fixed_bytes(tmp_path):
    sizes = [55 * MIB, 55 * MIB, 50 * MIB, 42 * MIB, 3 * MIB, 2 * MIB, 1 * MIB]
    plan = prep.plan_calls(_pieces(sizes), 60 * MIB, fixed=2 * MIB)
    placed = [n for call in plan.calls for n in call]
    assert sorted(placed) == sorted(f"p{i}" for i in range(len(sizes)))   # every piece exactly once
    assert all(s <= 60 * MIB for s in plan.sizes)
    assert plan.calls[0] == ("p0", "p4")          # largest first; small pieces fill the gaps
    assert len(plan.calls) == 4                   # 208 MiB of pieces: the fewest 58-MiB calls


def test_a_piece_larger_than_one_call_is_an_error_naming_it():
    with pytest.raises(prep.PrepareError, match=r"p1: 59.0 MiB does not fit a call"):
        prep.plan_calls(_pieces([1 * MIB, 59 * MIB]), 60 * MIB, fixed=2 * MIB)


def test_call_commands_receive_each_call_and_only_the_last_runs():
    cmds = [prep.call_command(n, n == 3, ".gpu") for n in (1, 2, 3)]
    assert cmds[0] == "bash .gpu/common/engine_gpu.sh receive .gpu/call1"
    assert "run" not in cmds[1].split("receive")[1]
    assert cmds[2].endswith("&& bash .gpu/common/engine_gpu.sh run")


@pytest.mark.parametrize("args", [["--part-mib", "70"], ["--part-mib", "50", "--call-mib", "40"]])
def test_prepare_refuses_parts_or_calls_over_the_device_limit(tmp_path, args, capsys):
    assert prep.main(["--out", str(tmp_path / "o"), *args]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "need 1 <= part <= call <= 64" in err[0]
    assert not (tmp_path / "o").exists()


def test_real_wheel_carry_plan_fits_the_device_limits(tmp_path):
    """On the cached stripped vLLM (prepared once by the script): parts <= 55 MiB, calls <= 64 MiB."""
    packed = prep.cache_root() / f"vllm-{prep.VLLM_VERSION}-nofa2.tar.xz"
    if not packed.exists():
        pytest.skip("the stripped vLLM wheel is not cached (run benchmarks/engine_gpu_prepare.py once)")
    meta = json.loads(packed.with_suffix(".json").read_text())
    assert meta["dropped"] == [prep.FA2] and meta["dropped_bytes"] > 150 * MIB
    with tarfile.open(packed) as t:
        names = set(t.getnames())
    assert prep.FA3 in names and prep.FA2 not in names and "vllm/_C.abi3.so" in names
    parts = prep.split_file(packed, 55 * MIB, tmp_path, "vllm")
    assert all(p.size <= 55 * MIB for p in parts)
    plan = prep.plan_calls(parts + _pieces([45 * MIB]), 60 * MIB, fixed=2 * MIB)
    assert all(s <= 64 * MIB for s in plan.sizes)


# --- GPU side without a GPU: receive, install, plan, compare -----------------------------------


def _manifest(tmp_path: Path) -> tuple[dict, Path]:
    """A two-group manifest (a tar.xz project and a split 'vllm') staged like the prepare script does."""
    src = tmp_path / "src"
    (src / "vllm").mkdir(parents=True)
    (src / "vllm" / "__init__.py").write_text("x = 1\n")
    packed = prep.pack_dir(src, tmp_path / "vllm.tar.xz")
    proj = tmp_path / "proj"
    (proj / "manager").mkdir(parents=True)
    (proj / "manager" / "__init__.py").write_text("")
    ppacked = prep.pack_dir(proj, tmp_path / "project.tar.xz")
    stage = tmp_path / "stage"
    pieces = prep.split_file(packed, 100, stage, "vllm") + prep.split_file(ppacked, 10_000, stage, "project")
    groups = {g: {"kind": "tar.xz", "sha256": prep.sha256_file(p), "parts": [x.name for x in pieces if x.group == g]}
              for g, p in (("vllm", packed), ("project", ppacked))}
    doc = {"pieces": [{"name": p.name, "size": p.size, "sha256": p.sha256, "group": p.group, "index": p.index}
                      for p in pieces], "groups": groups}
    return doc, stage


def test_receive_checks_each_piece_and_is_idempotent(tmp_path):
    doc, stage = _manifest(tmp_path)
    bad = tmp_path / "bad"
    bad.mkdir()
    first = doc["pieces"][0]["name"]
    (bad / first).write_bytes(b"not it")
    (bad / "stranger.bin").write_bytes(b"?")
    rep = egpu.receive(doc, tmp_path / "w", bad)
    assert sorted(rep["rejected"]) == sorted([f"{first}: sha256 mismatch", "stranger.bin: not in the manifest"])
    assert not (tmp_path / "w" / "in" / first).exists()
    rep = egpu.receive(doc, tmp_path / "w", stage)
    assert rep["missing"] == [] and not rep["rejected"]
    assert egpu.receive(doc, tmp_path / "w", stage)["missing"] == []


def test_install_unpacks_complete_groups_once_and_waits_for_missing_parts(tmp_path):
    doc, stage = _manifest(tmp_path)
    work = tmp_path / "w"
    partial = tmp_path / "partial"
    partial.mkdir()
    for p in doc["groups"]["project"]["parts"]:
        (partial / p).write_bytes((stage / p).read_bytes())
    egpu.receive(doc, work, partial)
    rep = egpu.install(doc, work, dry=True)
    assert rep["vllm"].startswith("waiting for") and rep["project"].startswith("installed in")
    assert (work / "project" / "manager" / "__init__.py").exists() and not (work / "vllm").exists()
    egpu.receive(doc, work, stage)
    monkey_roots = egpu.ROOTS
    try:
        egpu.ROOTS = {"stock": ()}
        rep = egpu.install(doc, work, dry=True)
    finally:
        egpu.ROOTS = monkey_roots
    assert rep["project"] == "installed earlier" and rep["vllm"].startswith("installed in")
    assert (work / "roots" / "stock" / "vllm" / "__init__.py").read_text() == "x = 1\n"


def test_run_plan_covers_both_ab_tables_with_cuda_graphs_on_for_the_route(tmp_path):
    runs = {r["name"]: r for r in egpu.plan(tmp_path, {"a", "b", "c"})}
    for g in (32, 16):
        assert runs[f"a-g{g}-unpatched"]["root"] == "base" and runs[f"a-g{g}-unpatched"]["expect_error"]
        assert runs[f"a-g{g}-patched"]["root"] == "pr40886"
        assert runs[f"a-g{g}-reference"]["model"].endswith("dequantized")
    assert "vllm-pr40886-gemma4-awq-moe-keys" not in egpu.ROOTS["base"]
    assert set(egpu.ROOTS["full"]) >= {"dynamo-dict-caches", "sm70-d512-attention"}
    for model in ("dense", "moe"):
        for mode in ("off", "force"):
            r = runs[f"b-{model}-{mode}"]
            assert r["eager"] is False and r["d512"] == mode and r["root"] == "full"
    assert runs["b-dense-force"]["long"] and runs["b-dense-force"]["throughput"]
    assert not runs["b-moe-force"]["throughput"]
    assert egpu.LONG_PROMPT >= 16384 and egpu.LONG_PROMPT > 4 * egpu.CHUNK   # several chunks


def _rec(tokens, lps):
    return {"tokens": tokens, "steps": [{"token": t, "logprob": lp} for t, lp in zip(tokens, lps)]}


def test_compare_counts_agreeing_tokens_and_the_worst_logprob_gap_before_divergence():
    a = [_rec([5, 6, 7], [-1.0, -2.0, -3.0]), _rec([1, 2], [-0.5, -0.5])]
    b = [_rec([5, 6, 9], [-1.01, -2.5, -0.1]), _rec([1, 2], [-0.5, -0.48])]
    c = egpu.compare(a, b)
    assert c["tokens_equal"] == 4 and c["tokens"] == 5 and not c["identical"]
    assert c["first_divergence"] == [2, None]
    assert c["max_abs_logprob_diff"] == pytest.approx(0.5)   # step 1 of the first prompt; step 2 diverged


def test_each_reference_scores_runs_that_come_before_it_in_the_plan(tmp_path):
    names = [r["name"] for r in egpu.plan(tmp_path, {"a", "b"})]
    for spec in egpu.plan(tmp_path, {"a", "b"}):
        for scored in spec.get("score", []):
            assert names.index(scored) < names.index(spec["name"])
    runs = {r["name"]: r for r in egpu.plan(tmp_path, {"a", "b"})}
    assert runs["a-g32-reference"]["score"] == ["a-g32-patched", "a-g32-dequant"]
    assert runs["a-g32-reference16"]["dtype"] == "float16" and runs["a-g32-reference16"]["score"] == \
        runs["a-g32-reference"]["score"]
    # the same-weights baseline: the dequantized checkpoint through the same engine (unquantized path)
    assert runs["a-g32-dequant"]["model"] == runs["a-g32-reference"]["model"]
    assert runs["a-g32-dequant"]["root"] == runs["a-g32-patched"]["root"] == "pr40886"
    assert runs["a-moe-baseline"]["root"] == "pr40886" and runs["a-moe-reference"]["score"] == ["a-moe-baseline"]
    assert runs["b-moe-reference"]["score"] == ["b-moe-off", "b-moe-force"]


def _scored(ref_lp, argmax, top):
    return {"ref_logprob": ref_lp, "ref_argmax": argmax, "ref_max_logprob": top}


def test_teacher_forced_compares_every_position_and_lists_argmax_mismatches_with_their_gap():
    run = {"short": [_rec([5, 6, 7], [-1.0, -2.0, -3.0])], "long": _rec([9], [-0.5])}
    sc = {"short": [_scored([-1.1, -2.0, -3.3], [5, 4, 7], [-1.1, -1.95, -3.3])], "long": [_scored([-0.5], [9], [-0.5])]}
    tf = egpu.teacher_forced(run, sc)
    assert tf["positions"] == 4 and tf["argmax_agree"] == 3
    assert tf["mismatches"] == [{"part": "short", "stream": 0, "step": 1, "engine": 6, "reference": 4,
                                 "ref_gap": pytest.approx(0.05)}]
    assert tf["max_abs_logprob_err"] == pytest.approx(0.3)


@pytest.mark.parametrize("err,gap,within", [(0.16, 0.01, True), (0.17, 0.01, False), (0.1, 0.2, False)])
def test_judge_allows_one_and_a_half_times_the_baseline_plus_slack_and_only_near_ties(err, gap, within):
    tf = {"max_abs_logprob_err": err, "mismatches": [{"ref_gap": gap}]}
    j = egpu.judge(tf, {"max_abs_logprob_err": 0.1})
    assert j["allowed"] == pytest.approx(1.5 * 0.1 + 0.01)
    assert j["within"] is within


def test_summary_judges_w4a16_against_the_same_weights_through_the_same_engine():
    pa = {"short": [_rec([5, 6, 7], [-1.0, -2.0, -3.0])]}
    dq = {"short": [_rec([5, 6, 7], [-1.0, -2.05, -3.0])]}
    scored = {"a-g32-patched": {"short": [_scored([-1.0, -2.3, -3.0], [5, 6, 7], [-1.0, -2.3, -3.0])]},
              "a-g32-dequant": {"short": [_scored([-1.0, -2.0, -3.0], [5, 6, 7], [-1.0, -2.0, -3.0])]}}
    s = egpu.summarize({"a-g32-patched": pa, "a-g32-dequant": dq, "a-g32-reference": {"scored": scored}})
    assert s["a-g32-vs-dequant-engine"]["identical"] and s["a-g32-vs-dequant-engine"]["max_abs_logprob_diff"] == \
        pytest.approx(0.05)
    tf = s["a-g32-teacher-forced"]
    assert tf["baseline_max_abs_logprob_err"] == pytest.approx(0.05)
    assert tf["allowed"] == pytest.approx(1.5 * 0.05 + 0.01) and tf["within"] is False   # 0.3 > 0.085
    assert "a-g32-teacher-forced-fp16ref" not in s   # no fp16 reference ran


def test_summary_judges_the_auto_decode_arm_against_the_dequantized_engine_and_compares_it_with_wmma():
    m = egpu.W4_MODELS[0]
    route = {"short": [_rec([5, 6, 7], [-1.0, -2.0, -3.0])]}
    dq = {"short": [_rec([5, 6, 7], [-1.0, -2.05, -3.0])]}
    auto = {"short": [_rec([5, 6, 8], [-1.0, -2.02, -3.5])], "markers": ["sm70 w4: W4A16 MoE decode ran"]}
    ok = [_scored([-1.0, -2.0, -3.0], [5, 6, 7], [-1.0, -2.0, -3.0])]
    scored = {f"w-{m}-route": {"short": ok}, f"w-{m}-dequant": {"short": ok},
              f"w-{m}-auto": {"short": [_scored([-1.0, -2.0, -3.9], [5, 6, 7], [-1.0, -2.0, -3.0])]}}
    s = egpu.summarize({f"w-{m}-route": route, f"w-{m}-dequant": dq, f"w-{m}-auto": auto,
                        f"w-{m}-reference": {"scored": scored}})
    cmp = s[f"w-{m}-auto-vs-wmma-decode"]
    assert (cmp["tokens_equal"], cmp["identical"], cmp["first_divergence"]) == (2, False, [2])
    assert cmp["markers_auto"] == ["sm70 w4: W4A16 MoE decode ran"]
    tf = s[f"w-{m}-auto-teacher-forced"]
    assert tf["baseline_max_abs_logprob_err"] == pytest.approx(0.05) and tf["within"] is False
    assert s[f"w-{m}-route-teacher-forced"]["within"] is True


def test_first_error_line_finds_the_root_cause_not_the_wrapper():
    log = ("(EngineCore_DP0 pid=77) Traceback (most recent call last):\n"
           "(EngineCore_DP0 pid=77)   File \"x.py\", line 3, in load\n"
           "(EngineCore_DP0 pid=77) KeyError: 'layers.0.moe.experts.0.down_proj_packed'\n"
           "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n")
    assert egpu.first_error_line(log) == "KeyError: 'layers.0.moe.experts.0.down_proj_packed'"
    assert egpu.first_error_line("all fine\n") is None


@pytest.mark.parametrize("argv, msg", [
    (["run", "--manifest", "{m}", "--work", "{w}", "--out", "{w}/o", "--phases", "a,z"], "unknown phase(s) z"),
    (["run", "--manifest", "{w}/nope.json", "--work", "{w}", "--out", "{w}/o"], "no such manifest"),
])
def test_engine_gpu_arguments_fail_with_one_line(tmp_path, argv, msg):
    m = tmp_path / "manifest.json"
    m.write_text(json.dumps({"pieces": [], "groups": {}}))
    argv = [a.format(m=m, w=tmp_path) for a in argv]
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "engine_gpu.py"), *argv], capture_output=True, text=True)
    assert proc.returncode == 1
    assert len(proc.stderr.strip().splitlines()) == 1 and msg in proc.stderr
    assert not (tmp_path / "o").exists()


def _meta_wheel(path: Path, name: str, requires: list[str]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}-1.0.dist-info/METADATA",
                   f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n" + "".join(f"Requires-Dist: {r}\n" for r in requires))
    return path


def test_requirements_neither_carried_nor_in_the_image_are_reported(tmp_path):
    """What broke the first H200 run: openai 3.x needs httpx2, which the image lacks."""
    a = _meta_wheel(tmp_path / "openai-3.57.0-py3-none-any.whl", "openai",
                    ["httpx2<3,>=2.12.0", "pydantic<3", "numpy", "foo; extra == 'x'", "pywin32; sys_platform == 'win32'"])
    b = _meta_wheel(tmp_path / "pydantic-2.12.5-py3-none-any.whl", "pydantic", ["typing-extensions>=4.14.1"])
    assert prep.unmet_requirements([a, b]) == ["openai-3.57.0-py3-none-any.whl: httpx2<3,>=2.12.0"]


def test_the_pinned_dependency_set_is_closed_over_the_image_when_cached():
    deps = prep.cache_root() / "deps"
    wheels = [p for s in prep.DEPENDENCY_WHEELS
              for p in deps.glob(f"{prep._wheel_name(s)}-{s.split('==')[1]}-*.whl")]
    if len(wheels) != len(prep.DEPENDENCY_WHEELS):
        pytest.skip("the dependency wheels are not all cached (run benchmarks/engine_gpu_prepare.py once)")
    assert prep.unmet_requirements(wheels) == []


# --- TP=N (issue 30 point 5; the two-H200 run is issue 31): the dry-run path, no GPU, no engine --------------


def test_prepare_and_the_gpu_side_name_the_same_tp2_kinds_and_the_factory_builds_them():
    from testing import checkpoints as factory

    tp2 = prep.checkpoint_kinds(2)
    assert tp2 == ("dense-tp2", "moe-tp2", "ct-w4a16-moe-tp2")
    assert set(tp2) <= set(factory.kinds())
    for tp in (1, 2):
        assert set(egpu.TP_CHECKPOINTS[tp].values()) == set(prep.checkpoint_kinds(tp))


def test_tp2_plan_starts_every_engine_at_tensor_parallel_size_2_on_the_tp2_kinds_after_its_tp1_twin(tmp_path):
    specs = egpu.plan(tmp_path, {"a", "b", "c"}, tp=2)
    names = [s["name"] for s in specs]
    runs = dict(zip(names, specs))
    engines = [s for s in specs if s.get("kind") != "reference"]
    for s in specs:
        assert Path(s["model"]).relative_to(tmp_path / "ckpt").parts[0].endswith("-tp2"), s["model"]
    for s in engines:
        flags = egpu.engine_flags(egpu.llm_kwargs(s))
        i = flags.index("--tensor-parallel-size")
        if s.get("twin_of"):
            assert flags[i + 1] == "1" and names.index(s["name"]) + 1 == names.index(s["twin_of"])
            assert not s["long"] and not s["throughput"] and s["short"]
        else:
            assert flags[i + 1] == "2" and s["tp"] == 2
    # every served TP=2 engine has its TP=1 twin; the runs expected to fail have none
    served = {s["name"] for s in engines if not s.get("twin_of") and not s.get("expect_error")}
    assert {s["twin_of"] for s in engines if s.get("twin_of")} == served
    assert {"a-g32-patched", "b-dense-force", "b-moe-off"} <= served
    assert "a-g32-unpatched-tp1" not in runs and "a-stock-dense-tp1" not in runs
    assert not any(n.startswith("a-g16") for n in names)   # the factory has no group-16 TP=2 kind
    assert runs["a-g32-patched"]["expect_trace"] == [egpu.AWQ]
    assert runs["b-dense-force"]["throughput"] and runs["b-dense-force"]["long"]


def test_tp1_plan_has_no_twins_and_runs_at_tensor_parallel_size_1_on_the_tp1_kinds(tmp_path):
    specs = egpu.plan(tmp_path, {"a", "b", "c", "f", "w"})
    assert not any(s.get("twin_of") for s in specs)
    assert {Path(s["model"]).relative_to(tmp_path / "ckpt").parts[0] for s in specs} == set(prep.CHECKPOINT_KINDS)
    flags = egpu.engine_flags(egpu.llm_kwargs(next(s for s in specs if s["name"] == "b-dense-off")))
    assert flags[flags.index("--tensor-parallel-size") + 1] == "1" and "--enforce-eager" not in flags
    assert "--no-enable-prefix-caching" in flags and "--enable-prefix-caching" not in flags


@pytest.mark.parametrize("smi, cvd, n", [
    (["GPU 0: NVIDIA H200 (UUID: GPU-a)", "GPU 1: NVIDIA H200 (UUID: GPU-b)"], None, 2),
    (["GPU 0: NVIDIA H200 (UUID: GPU-a)", "GPU 1: NVIDIA H200 (UUID: GPU-b)"], "1", 1),
    (["GPU 0: NVIDIA H200 (UUID: GPU-a)"], "0,1", 1),
    (None, "0,1", 2),
    (None, None, None),
])
def test_visible_gpus_counts_nvidia_smi_capped_by_cuda_visible_devices(smi, cvd, n):
    env = {} if cvd is None else {"CUDA_VISIBLE_DEVICES": cvd}
    assert egpu.visible_gpus(env, smi) == n


def _tp_manifest(tmp_path: Path, kinds) -> Path:
    doc, stage = _manifest(tmp_path)
    doc["info"] = {"checkpoints": {k: {} for k in kinds}}
    m = tmp_path / "manifest.json"
    m.write_text(json.dumps(doc))
    egpu.receive(doc, tmp_path / "w", stage)
    return m


@pytest.mark.parametrize("tp, cvd, kinds, msg", [
    ("3", "0,1,2", prep.CHECKPOINT_KINDS_TP[2], "--tp 3: no checkpoint kinds whose shapes divide by 3"),
    ("2", "0", prep.CHECKPOINT_KINDS_TP[2], "--tp 2: needs 2 visible GPU(s), this machine shows 1"),
    ("2", "0,1", prep.CHECKPOINT_KINDS_TP[1], "--tp 2 needs ct-w4a16-moe-tp2, dense-tp2, moe-tp2 (stage them"),
])
def test_a_wrong_tp_is_one_line_before_anything_is_installed(tmp_path, monkeypatch, capsys, tp, cvd, kinds, msg):
    m = _tp_manifest(tmp_path, kinds)
    monkeypatch.setattr(egpu, "_smi_lines", lambda: None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", cvd)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    capsys.readouterr()   # the receive above talks on stderr
    rc = egpu.main(["run", "--dry-run", "--manifest", str(m), "--work", str(tmp_path / "w"),
                    "--out", str(tmp_path / "o"), "--tp", tp])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and msg in err[0], err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before   # nothing installed
    assert not (tmp_path / "w" / "vllm").exists()


def test_a_real_tp2_run_on_a_machine_without_gpus_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    doc = {"info": {"checkpoints": {k: {} for k in prep.CHECKPOINT_KINDS_TP[2]}}}
    assert "needs 2 visible GPU(s), this machine shows 0" in egpu.check_tp(2, doc, dry=False, smi_lines=None)
    assert egpu.check_tp(2, doc, dry=True, smi_lines=None) is None   # a dry run has nothing to count
    assert egpu.check_tp(2, doc, dry=False, smi_lines=["GPU 0: a", "GPU 1: b"]) is None


def test_tp2_dry_run_installs_and_plans_every_engine_with_tensor_parallel_size_2(tmp_path, monkeypatch, capsys):
    m = _tp_manifest(tmp_path, prep.CHECKPOINT_KINDS_TP[2])
    monkeypatch.setattr(egpu, "_smi_lines", lambda: None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setattr(egpu, "ROOTS", {name: () for name in egpu.ROOTS})   # the fake vLLM tree takes no overlay
    capsys.readouterr()
    rc = egpu.main(["run", "--dry-run", "--manifest", str(m), "--work", str(tmp_path / "w"),
                    "--out", str(tmp_path / "o"), "--tp", "2", "--phases", "install,a,b"])
    err = capsys.readouterr().err
    assert rc == 0, err
    doc = json.loads((tmp_path / "o" / "results.json").read_text())
    assert doc["tp"] == 2 and set(doc["roots"]) == set(egpu.ROOTS) - {"w4", "plugin"}   # the roots a and b use
    runs = doc["runs"]
    assert [n for n in runs] == [s["name"] for s in egpu.plan(tmp_path / "w", {"a", "b"}, 2)]
    for name, r in runs.items():
        assert r["dry_run"]
        if r["engine_flags"]:
            tp = "1" if name.endswith("-tp1") else "2"
            f = r["engine_flags"]
            assert f[f.index("--tensor-parallel-size") + 1] == tp, (name, f)
            assert f"dry-run {name}: " in err and f"--tensor-parallel-size {tp}" in err
    assert runs["a-g32-patched"]["expect_trace"] == [egpu.AWQ] and runs["a-g32-patched"]["tp"] == 2
    assert err.count("--tensor-parallel-size 2") == sum(1 for r in runs.values() if r["tp"] == 2)


def test_trace_by_rank_wants_the_overlay_from_every_rank_pid():
    from manager.overlays.trace import read_trace

    line = "overlay-trace: {id} v1 awq-moe-branches pid={pid} module=vllm.model_executor.models.gemma4\n"
    log = ("(Worker_TP0 pid=101) INFO world_size=2 rank=0\n(Worker_TP1 pid=102) INFO world_size=2 rank=1\n"
           f"(Worker_TP0 pid=101) {line.format(id=egpu.AWQ, pid=101)}"
           f"{line.format(id='gemma4-convertor-per-layer', pid=100)}")
    one = egpu.trace_by_rank(log, 2, [egpu.AWQ], read_trace)
    assert one["ranks"] == {"Worker_TP0": 101, "Worker_TP1": 102}
    assert one["missing"] == {"Worker_TP1": [egpu.AWQ]} and not one["every_rank"]
    both = egpu.trace_by_rank(log + f"(Worker_TP1 pid=102) {line.format(id=egpu.AWQ, pid=102)}", 2, [egpu.AWQ],
                              read_trace)
    assert both["every_rank"] and both["missing"] == {}
    tp1 = egpu.trace_by_rank("(EngineCore_DP0 pid=7) x\n" + line.format(id=egpu.AWQ, pid=7), 1, [egpu.AWQ], read_trace)
    assert tp1["ranks"] == {"EngineCore_DP0": 7} and tp1["every_rank"]
    assert not egpu.trace_by_rank(line.format(id=egpu.AWQ, pid=7), 2, [egpu.AWQ], read_trace)["every_rank"]


def test_summary_compares_each_tp2_run_with_its_tp1_twin_and_carries_the_rank_trace():
    tp2 = {"short": [_rec([5, 6, 7], [-1.0, -2.0, -3.0])], "tp": 2, "trace": {"every_rank": True}}
    same = {"short": [_rec([5, 6, 7], [-1.0, -2.004, -3.0])], "twin_of": "a-g32-patched"}
    s = egpu.summarize({"a-g32-patched-tp1": same, "a-g32-patched": tp2})
    c = s["a-g32-patched-vs-tp1"]
    assert c["identical"] and c["max_abs_logprob_diff"] == pytest.approx(0.004) and c["within_tolerance"]
    assert c["tolerance"] == egpu.TOL_TP and s["a-g32-patched-trace"] == {"every_rank": True}
    off = dict(same, short=[_rec([5, 6, 9], [-1.0, -2.0, -3.0])])
    assert not egpu.summarize({"a-g32-patched-tp1": off, "a-g32-patched": tp2})["a-g32-patched-vs-tp1"][
        "within_tolerance"]


def test_prepare_at_tp2_stages_the_tp2_kinds_and_the_last_call_runs_at_tp2(tmp_path, monkeypatch):
    """prepare() end to end with the downloads and the factory replaced (the kinds it asks for are recorded)."""
    asked = []

    def fake_checkpoints(dest, kinds):
        asked.append(kinds)
        for k in kinds:
            (dest / k).mkdir(parents=True)
            (dest / k / "config.json").write_text("{}")
        return {k: {"reference": f"{k}"} for k in kinds}

    monkeypatch.setattr(prep, "cache_root", lambda: tmp_path / "cache")
    monkeypatch.setattr(prep, "fetch_vllm_wheel", lambda cache: _fake_wheel(tmp_path / "v.whl"))
    monkeypatch.setattr(prep, "fetch_dependency_wheels",
                        lambda cache: [_meta_wheel(tmp_path / "dep-1.0-py3-none-any.whl", "dep", [])])
    monkeypatch.setattr(prep, "build_checkpoints", fake_checkpoints)
    (tmp_path / "cache").mkdir()
    prep.prepare(tmp_path / "stage", 55, 60, None, checkpoints=True, kernels=False, tp=2)
    assert asked == [prep.CHECKPOINT_KINDS_TP[2]]
    doc = json.loads((tmp_path / "stage" / "common" / "manifest.json").read_text())
    assert doc["tp"] == 2 and set(doc["info"]["checkpoints"]) == set(prep.CHECKPOINT_KINDS_TP[2])
    assert doc["plan"]["commands"][-1].endswith("engine_gpu.sh run --tp 2")
    assert all("run" not in c.split("receive")[1] for c in doc["plan"]["commands"][:-1])
    assert egpu.check_tp(2, doc, dry=False, smi_lines=["GPU 0: a", "GPU 1: b"]) is None
    assert "stage them with engine_gpu_prepare.py --tp 1" in egpu.check_tp(1, doc, dry=False, smi_lines=["GPU 0: a"])


def test_prepare_refuses_a_tp_without_kinds_before_writing(tmp_path, capsys):
    assert prep.main(["--out", str(tmp_path / "o"), "--tp", "3"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--tp 3: no checkpoint kinds whose shapes divide by 3" in err[0]
    assert not (tmp_path / "o").exists()
    assert prep.call_command(2, True, ".gpu", 2) == ("bash .gpu/common/engine_gpu.sh receive .gpu/call2 && "
                                                   "bash .gpu/common/engine_gpu.sh run --tp 2")


def test_select_kinds_stages_a_named_subset_and_refuses_a_kind_of_another_tp_by_name():
    assert prep.select_kinds(1, ("dense-h256", "ct-nvfp4-moe")) == ("dense-h256", "ct-nvfp4-moe")
    assert prep.select_kinds(1, None) == prep.CHECKPOINT_KINDS
    with pytest.raises(prep.PrepareError, match="dense-tp2 not among the --tp 1 kinds"):
        prep.select_kinds(1, ("dense", "dense-tp2"))


def test_family_phase_forces_every_head_dim_pair_under_cuda_graphs_and_w4_phase_scores_route_against_dequantized(
        tmp_path):
    runs = {s["name"]: s for s in egpu.plan(tmp_path, {"f", "w"})}
    for model in egpu.FAMILY_MODELS:
        off, force, ref = (runs[f"f-{model}-{k}"] for k in ("off", "force", "reference"))
        assert (off["d512"], force["d512"], off["eager"], force["root"]) == ("off", "force", False, "full")
        assert ref["score"] == [f"f-{model}-off", f"f-{model}-force"]
    assert runs["f-dense-h256-force"]["long"] and not runs["f-moe-h128-force"]["long"]
    for model in egpu.W4_MODELS:
        route, dq, ref = (runs[f"w-{model}-{k}"] for k in ("route", "dequant", "reference"))
        assert route["w4"] == dq["w4"] == "force" and route["root"] == dq["root"] == "w4"
        assert Path(dq["model"]).name == "dequantized" and ref["model"] == dq["model"]
        auto = runs[f"w-{model}-auto"]
        assert (auto["w4"], auto["w4_decode"], auto["model"]) == ("force", "auto", route["model"])
        assert route["w4_decode"] == "wmma" and "w4_decode" not in dq
        assert ref["score"] == [f"w-{model}-route", f"w-{model}-dequant", f"w-{model}-auto"]


def test_judged_pair_judges_the_run_under_test_against_its_baseline_only_when_both_were_scored():
    def run(lps):
        return {"short": [{"tokens": [5] * len(lps), "steps": [{"token": 5, "logprob": x} for x in lps]}]}

    def scored(lps):
        return {"short": [{"ref_logprob": lps, "ref_argmax": [5] * len(lps), "ref_max_logprob": lps}]}

    s: dict = {}
    egpu.judged_pair(s, {"x-off": scored([-1.0, -2.0])}, "x-off", run([-1.1, -2.0]), "x-force", run([-1.0, -2.5]))
    assert s == {}   # the run under test was not scored
    sc = {"x-off": scored([-1.0, -2.0]), "x-force": scored([-1.0, -2.0])}
    egpu.judged_pair(s, sc, "x-off", run([-1.1, -2.0]), "x-force", run([-1.0, -2.5]))
    assert s["x-off-teacher-forced"]["max_abs_logprob_err"] == pytest.approx(0.1)
    assert s["x-force-teacher-forced"]["allowed"] == pytest.approx(1.5 * 0.1 + 0.01)
    assert s["x-force-teacher-forced"]["within"] is False   # 0.5 > 0.16
