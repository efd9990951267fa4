"""`overlay upstream check|report` end to end: a catalog (the repository's engine profiles plus
test overlays), a local GitHub server over a real git history, exit codes and JSON shape."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from tests.helpers import REPO_ROOT
from tests.helpers.cli import overlay_process
from tests.helpers.fake_github import FakeGitHub, build_upstream_repo, git, pull_json

REPO = "vllm-project/vllm"


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    up = build_upstream_repo(tmp_path_factory.mktemp("up"))
    git(up.path, "tag", "v0.19.0", up.commits["c1"])  # released before the merge
    git(up.path, "tag", "v0.33.0", up.commits["c3"])  # released after the merge
    return up


def manifest(oid: str, pr: int, state: str, merge: str | None = None) -> dict:
    up = {"repo": REPO, "pr": pr, "state": state, "head_commit": "f" * 40}
    if merge:
        up["merge_commit"] = merge
    return {
        "id": oid, "title": f"test overlay {oid}", "summary": "for the upstream CLI tests",
        "upstream": up, "vendored_on": "2026-11-01", "versions": ">=0.19",
        "targets": ["vllm/model_executor/models/gemma4.py"],
        "drop_when": f"PR #{pr} merged and the engine pin contains its merge commit",
        "sentinel_version": 1,
    }


@pytest.fixture(scope="module")
def catalog(tmp_path_factory, upstream):
    root = tmp_path_factory.mktemp("catalog")
    shutil.copytree(REPO_ROOT / "profiles", root / "profiles")
    # a commit-pinned engine (the shipped engines are all stock releases): stock 0.20.0 with its commit as the pin
    fork = yaml.safe_load((REPO_ROOT / "profiles/engines/vllm-0.20.0.yaml").read_text())
    fork.update(id="vllm-fork-test", fork=True, upstream_ref="b8160878f", image="example.invalid/vllm-fork:test")
    (root / "profiles/engines/vllm-fork-test.yaml").write_text(yaml.safe_dump(fork, sort_keys=False))
    for m in (manifest("fix-open", 1, "open"), manifest("fix-merged", 3, "merged", upstream.merge)):
        d = root / "overlays" / m["id"]
        d.mkdir(parents=True)
        (d / "overlay.yaml").write_text(yaml.safe_dump(m, sort_keys=False))
    return root


@pytest.fixture
def gh(upstream):
    with FakeGitHub() as fake:
        fake.repos[REPO] = upstream.path
        fake.pulls[(REPO, 1)] = pull_json(REPO, 1, "open")
        fake.pulls[(REPO, 3)] = pull_json(REPO, 3, "merged", merge_commit=upstream.merge)
        yield fake


def overlay(catalog, *args, cache=None):
    extra = ["--cache", str(cache)] if cache is not None else []
    return overlay_process("--catalog", str(catalog), "upstream", *args, *extra, env={"PYTHONWARNINGS": "ignore"})


ENGINES = ["--engine", "vllm-0.19.0", "--engine", "vllm-0.33.0", "--no-probe"]


def test_check_json_gives_a_verdict_per_overlay_and_engine(catalog, gh, tmp_path):
    p = overlay(catalog, "check", *ENGINES, "--api-url", gh.url, "--json", cache=tmp_path / "c")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    got = {(r["overlay"], r["engine"]): r["verdict"] for r in data["results"]}
    assert got == {("fix-open", "vllm-0.19.0"): "keep", ("fix-open", "vllm-0.33.0"): "keep",
                   ("fix-merged", "vllm-0.19.0"): "waiting", ("fix-merged", "vllm-0.33.0"): "drop"}
    drop = next(r for r in data["results"] if r["verdict"] == "drop")
    assert any("...v0.33.0: ahead" in e and "compare API" in e for e in drop["evidence"])


def test_fail_on_drop_exits_1_and_names_the_result(catalog, gh, tmp_path):
    p = overlay(catalog, "check", *ENGINES, "--api-url", gh.url, "--fail-on", "drop,drift", cache=tmp_path / "c")
    assert p.returncode == 1
    assert "fix-merged@vllm-0.33.0=drop" in p.stderr
    assert "4 result(s): 2 keep, 1 waiting, 1 drop" in p.stderr
    ok = overlay(catalog, "check", "fix-open", *ENGINES, "--api-url", gh.url, "--fail-on", "drop,drift",
                 cache=tmp_path / "c")
    assert ok.returncode == 0, ok.stderr


def test_offline_without_cache_is_unknown_and_says_so(catalog, gh, tmp_path):
    p = overlay(catalog, "check", *ENGINES, "--offline", "--api-url", gh.url, "--json", cache=tmp_path / "empty")
    assert p.returncode == 0, p.stderr
    results = json.loads(p.stdout)["results"]
    assert {r["verdict"] for r in results} == {"unknown"} and gh.requests == []
    assert all(any("offline; nothing cached" in e for e in r["evidence"]) for r in results)


def test_git_dir_option_uses_the_local_clone(catalog, gh, upstream, tmp_path):
    p = overlay(catalog, "check", "fix-merged", *ENGINES, "--api-url", gh.url, "--git-dir", str(upstream.path),
                "--json", cache=tmp_path / "c")
    assert p.returncode == 0, p.stderr
    results = json.loads(p.stdout)["results"]
    assert [r["verdict"] for r in results] == ["waiting", "drop"]
    assert all(any("(local clone)" in e for e in r["evidence"]) for r in results)
    assert not [path for path, _ in gh.requests if "/compare/" in path]


def test_unknown_engine_or_overlay_is_a_one_line_error(catalog, gh, tmp_path):
    p = overlay(catalog, "check", "--engine", "vllm-9.9", "--no-probe", "--offline", cache=tmp_path / "c")
    assert p.returncode == 1 and "engine 'vllm-9.9' is not in the catalog" in p.stderr
    p = overlay(catalog, "check", "nope", "--no-probe", "--offline", cache=tmp_path / "c")
    assert p.returncode == 1 and "overlay 'nope' is not in the catalog" in p.stderr
    p = overlay(catalog, "check", "--fail-on", "dorp", "--no-probe", "--offline", cache=tmp_path / "c")
    assert p.returncode == 1 and "unknown verdict 'dorp'" in p.stderr


def test_report_writes_markdown_once_then_identical_offline(catalog, gh, tmp_path):
    cache = tmp_path / "c"
    assert overlay(catalog, "check", *ENGINES, "--api-url", gh.url, cache=cache).returncode == 0
    out = tmp_path / "UPSTREAM.md"
    args = ["report", "--format", "markdown", *ENGINES, "--offline", "--api-url", gh.url, "-o", str(out)]
    first = overlay(catalog, *args, cache=cache)
    assert first.returncode == 0, first.stderr
    assert "create" in first.stderr
    text = out.read_text()
    again = overlay(catalog, *args, cache=cache)
    assert "identical" in again.stderr and out.read_text() == text
    assert "| `fix-merged` | [vllm-project/vllm#3](https://github.com/vllm-project/vllm/pull/3) | merged" in text
    assert "**waiting**: `vllm-0.19.0`<br>**drop**: `vllm-0.33.0`" in text


def test_report_json_format(catalog, gh, tmp_path):
    p = overlay(catalog, "report", "--format", "json", *ENGINES, "--api-url", gh.url, cache=tmp_path / "c")
    data = json.loads(p.stdout)
    assert {o["overlay"] for o in data["overlays"]} == {"fix-open", "fix-merged"}
    assert len(data["results"]) == 4


def test_probe_report_from_overlay_verify_output_is_evidence(catalog, gh, tmp_path):
    verify = {"image": "example.invalid/vllm-fork:test", "vllm": "0.20.0", "overlays": {"fix-open": "upstream"},
              "status": {"root": "/usr/lib/python3/site-packages", "package_version": "0.20.0", "overlays": [
                  {"id": "fix-open", "status": "upstream", "targets": [
                      {"path": "vllm/model_executor/models/gemma4.py", "status": "upstream",
                       "detail": "native fix found (underscore-suffix mapping)"}]},
                  {"id": "fix-merged", "status": "drift", "targets": [
                      {"path": "vllm/model_executor/models/gemma4.py", "status": "drift",
                       "detail": "anchor not found in Gemma4Model.load_weights"}]}]}}
    report = tmp_path / "verify.json"
    report.write_text(json.dumps(verify))
    p = overlay(catalog, "check", "--engine", "vllm-fork-test", "--probe-report", f"vllm-fork-test={report}",
                "--api-url", gh.url, "--json", cache=tmp_path / "c")
    assert p.returncode == 0, p.stderr
    got = {r["overlay"]: r for r in json.loads(p.stdout)["results"]}
    assert got["fix-open"]["verdict"] == "drop" and got["fix-merged"]["verdict"] == "drift"
    assert any("image example.invalid/vllm-fork:test (overlay verify output" in e and "native fix found" in e
               for e in got["fix-open"]["evidence"])
    bad = overlay(catalog, "check", "--probe-report", "vllm-fork-test", "--offline", cache=tmp_path / "c")
    assert bad.returncode == 1 and "--probe-report 'vllm-fork-test': expected ENGINE=FILE" in bad.stderr
