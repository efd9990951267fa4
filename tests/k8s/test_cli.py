"""`overlay k8s render` on the command line: stdout, -o FILE, --all -o DIR, and hostile input (one line, exit 1,
nothing written)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO_ROOT

SLUG = "gemma4-26b-a4b-awq-3090-tp2"


def test_render_to_stdout_is_the_yaml_of_a_deployment_and_a_service(cli_run):
    res = cli_run("k8s", "render", SLUG)
    assert res.exit_code == 0, res.stderr
    assert [d["kind"] for d in yaml.safe_load_all(res.stdout)] == ["Deployment", "Service"]


def test_render_all_writes_one_file_per_deployment_then_reports_identical(cli_run, tmp_path):
    res = cli_run("k8s", "render", "--all", "--layout", "lws", "-o", str(tmp_path))
    assert res.exit_code == 0, res.stderr
    names = sorted(p.name for p in tmp_path.iterdir())
    assert SLUG + ".lws.yaml" in names and len(names) == 8
    again = cli_run("k8s", "render", "--all", "--layout", "lws", "-o", str(tmp_path))
    assert again.exit_code == 0 and again.stderr.count("identical") == 8


def _nothing_written(tmp_path: Path) -> bool:
    return not any(tmp_path.rglob("*"))


@pytest.mark.parametrize("args", [
    ("no-such-slug",),
    (SLUG, "--layout", "kustomize"),
    (SLUG, "--layout", "lws", "--nodes", "3"),
    (SLUG, "--nodes", "2"),
    (SLUG, "--bundle-image", "img; touch /tmp/pwned-by-k8s"),
    (SLUG, "--bundle-image", "img\nprivileged: true"),
    (SLUG, "--namespace", "Bad_Namespace"),
    (SLUG, "--models-claim", "../etc"),
    (SLUG, "--run-as-user", "0"),
    ("--all",),
    (),
    ("gemma4-12b-fp16-v100-tp2", "--layout", "helm-values"),
])
def test_bad_input_is_one_line_exit_1_and_nothing_written(cli_run, tmp_path, args):
    out = tmp_path / "out"
    out.mkdir()
    res = cli_run("k8s", "render", *args, "-o", str(out / "x.yaml")) if args and args[0] != "--all" else \
        cli_run("k8s", "render", *args)
    assert res.exit_code == 1, (res.stdout, res.stderr)
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert res.stderr.startswith("error:")
    assert _nothing_written(out)
    assert not Path("/tmp/pwned-by-k8s").exists()


def test_output_into_a_missing_directory_is_refused(cli_run, tmp_path):
    res = cli_run("k8s", "render", SLUG, "-o", str(tmp_path / "missing" / "x.yaml"))
    assert res.exit_code == 1 and "does not exist" in res.stderr
    assert _nothing_written(tmp_path)


PAYLOADS = ['x"\nprivileged: true\ny: "', "$(touch /tmp/pwned-by-k8s)", "'; touch /tmp/pwned-by-k8s; '",
            "{a: 1, hostNetwork: true}", "`id`"]


@pytest.fixture(scope="module")
def hostile_catalog(tmp_path_factory):
    cat = tmp_path_factory.mktemp("k8s-cat")
    for sub in ("overlays", "profiles"):
        os.symlink(REPO_ROOT / sub, cat / sub)
    (cat / "compose").mkdir()
    shutil.copy(REPO_ROOT / "compose" / "deployments.yaml", cat / "compose")
    return cat


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("field", ["note", "extra_args", "env_value"])
def test_hostile_registry_values_come_back_verbatim_or_are_refused(cli_run, hostile_catalog, field, payload):
    reg_path = hostile_catalog / "compose" / "deployments.yaml"
    original = reg_path.read_text()
    reg = yaml.safe_load(original)
    entry = reg["deployments"][SLUG]
    if field == "note":
        entry["note"] = payload
    elif field == "extra_args":
        entry["extra_args"] = ["--seed", payload]
    else:
        entry["env"] = {"SOME_VALUE": payload}
    reg_path.write_text(yaml.safe_dump(reg))
    try:
        res = cli_run("--catalog", str(hostile_catalog), "k8s", "render", SLUG)
    finally:
        reg_path.write_text(original)
    if res.exit_code == 1:
        assert len(res.stderr.strip().splitlines()) == 1
        return
    assert res.exit_code == 0, res.stderr
    dep, svc = yaml.safe_load_all(res.stdout)
    spec = dep["spec"]["template"]["spec"]
    assert set(spec) == {"securityContext", "terminationGracePeriodSeconds", "initContainers", "containers", "volumes"}
    (c,) = spec["containers"]
    if field == "extra_args":
        assert c["args"][-2:] == ["--seed", payload]
    if field == "env_value":
        assert {"name": "SOME_VALUE", "value": payload} in c["env"]
    assert not Path("/tmp/pwned-by-k8s").exists()
