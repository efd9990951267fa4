"""benchmarks/engine_gpu.py phase r (issue 32 point 3): the route edit vs the registered CUSTOM backend, planned and
summarised without a GPU (the scripts are loaded by path)."""

from __future__ import annotations

import importlib.metadata
import shutil

from tests.helpers import BENCHMARKS
from tests.helpers.scripts import load_script

egpu = load_script("engine_gpu", "under_test_r")
prep = load_script("engine_gpu_prepare", "under_test_r")


def test_phase_r_plans_three_arms_eager_and_graphs_on_the_h256_checkpoint(tmp_path):
    runs = egpu.plan(tmp_path, {"r"})
    assert [r["name"] for r in runs] == [f"r-{m}-{a}" for m in ("eager", "graphs") for a in ("off", "edit", "plugin")]
    for r in runs:
        assert r["model"] == str(tmp_path / "ckpt" / "dense-h256") and r["timing"] and r["short"]
        assert r["eager"] == r["name"].startswith("r-eager")
        plugin = r["name"].endswith("plugin")
        assert r["root"] == ("plugin" if plugin else "full") and r["plugin"] == plugin
        assert r["d512"] == ("off" if r["name"].endswith("off") else "force")
    # the plugin arm's tree: the full root's overlays without the attention overlay (so no edit routes)
    assert set(egpu.ROOTS["plugin"]) == set(egpu.ROOTS["full"]) - {"sm70-d512-attention"}
    assert all(r["phase"] != "r" for r in egpu.plan(tmp_path, {"b", "f"}))


def test_only_the_plugin_arm_asks_for_the_custom_backend_and_every_arm_has_room_for_the_prefill(tmp_path):
    by = {r["name"]: r for r in egpu.plan(tmp_path, {"r"})}
    plug = egpu.engine_flags(egpu.llm_kwargs(by["r-graphs-plugin"]))
    assert plug[plug.index("--attention-backend") + 1] == "CUSTOM"
    assert "--attention-backend" not in egpu.engine_flags(egpu.llm_kwargs(by["r-graphs-edit"]))
    for spec in by.values():
        kw = egpu.llm_kwargs(spec)
        assert kw["max_model_len"] > egpu.R_PREFILL and kw["max_num_batched_tokens"] >= egpu.R_PREFILL
        assert kw["enforce_eager"] == spec["eager"] and ("compilation_config" in kw) != spec["eager"]


def test_the_plugin_arm_gets_an_installed_entry_point_first_on_its_pythonpath(tmp_path):
    work = tmp_path / "w"
    (work / "project" / "benchmarks").mkdir(parents=True)
    shutil.copy2(BENCHMARKS / "sm70_backend_plugin.py", work / "project" / egpu.PLUGIN_FILE)
    base = {"PYTHONPATH": "/a:/b", "X": "1"}
    assert egpu.route_cost_env({"name": "r-eager-edit"}, work, base) is base
    env = egpu.route_cost_env({"name": "r-eager-plugin", "plugin": True}, work, base)
    site = work / "plugin-site"
    assert env["PYTHONPATH"].split(":") == [str(site), "/a", "/b"] and env["X"] == "1"
    (ep,) = [e for d in importlib.metadata.distributions(path=[str(site)]) for e in d.entry_points]
    assert ep.group == "vllm.general_plugins" and ep.value == "sm70_backend_plugin:register"
    assert "benchmarks/sm70_backend_plugin.py" in prep.PROJECT_FILES   # the project piece carries it to the GPU


def _run(start, decode4, decode16, prefill, tokens):
    steps = [{"token": t, "logprob": -0.1, "top": [(t, -0.1)]} for t in tokens]
    return {"start_s": start, "short": [{"tokens": tokens, "steps": steps}],
            "timing": {"decode b4": {"decode_ms_per_step": decode4, "step_interval_ms_median": decode4 + 0.1},
                       "decode b16": {"decode_ms_per_step": decode16},
                       "prefill 1x4096": {"seconds_median": prefill}}}


def test_summary_gives_each_arm_its_ratios_to_off_and_whether_its_tokens_match():
    res = {"r-graphs-off": _run(30.0, 2.0, 4.0, 0.5, [5, 6, 7]),
           "r-graphs-edit": _run(31.0, 1.0, 3.0, 0.25, [5, 6, 7]),
           "r-graphs-plugin": _run(33.0, 1.1, 3.0, 0.25, [5, 6, 8])}
    s = egpu.summarize(res)["r-graphs"]
    assert s["edit"]["decode b4"] == {"decode_ms_per_step": 1.0, "ratio_to_off": 0.5, "step_interval_ms_median": 1.1}
    assert s["plugin"]["decode b16"]["ratio_to_off"] == 0.75 and s["plugin"]["prefill 1x4096"]["ratio_to_off"] == 0.5
    assert s["edit"]["tokens_identical_to_off"] is True and s["plugin"]["tokens_identical_to_off"] is False
    assert s["plugin"]["start_s"] == 33.0 and "tokens_identical_to_off" not in s["off"]
    assert "r-eager" not in egpu.summarize(res)   # no eager runs, no eager row


def test_the_phase_list_accepts_r(tmp_path, capsys):
    m = tmp_path / "m.json"
    m.write_text('{"groups": {}}')
    capsys.readouterr()
    rc = egpu.main(["run", "--manifest", str(m), "--work", str(tmp_path), "--out", str(tmp_path / "o"),
                    "--phases", "r,q"])
    err = capsys.readouterr().err
    assert rc == 1 and "unknown phase(s) q " in err and "w, r)" in err
