"""The deployment registry: strict schema, one-line errors naming file and key, the seed deployments."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from manager.catalog import Catalog
from manager.compose.registry import load_registry, parse_registry
from manager.errors import ComposeError

BASE = {
    "model": "gemma-4-26b-a4b", "weights": "awq", "engine": "vllm-0.20.0", "hardware": "rtx-3090",
    "gpus": 2, "tp": 2, "ctx": 32768, "port": 8100,
}
P = Path("compose/deployments.yaml")


def parse(**over):
    body = {**BASE, **over}
    body = {k: v for k, v in body.items() if v is not None}
    return parse_registry({"deployments": {"demo": body}}, P)


def test_a_valid_entry_parses_with_defaults() -> None:
    dep = parse().get("demo")
    assert dep.slug == "demo" and dep.status == "experimental" and dep.max_seqs == 8 and dep.drafter is None


@pytest.mark.parametrize(
    "over,needle",
    [
        ({"privileged": True}, "deployments.demo.privileged: Extra inputs are not permitted"),
        ({"tp": 3}, "gpus=2 is not a multiple of tp=3"),
        ({"port": 80}, "deployments.demo.port"),
        ({"model_dir": "../etc"}, "deployments.demo.model_dir"),
        ({"model_dir": "/abs/path"}, "relative path"),
        ({"served_name": "a\nb"}, "control character"),
        ({"status": "prod"}, "deployments.demo.status"),
        ({"env": {"BAD NAME": "x"}}, "not a valid variable name"),
        ({"shm_size": "lots"}, "shm_size"),
        ({"port": None}, "deployments.demo.port: Field required"),
    ],
)
def test_invalid_entries_fail_with_one_line_naming_file_and_key(over: dict, needle: str) -> None:
    with pytest.raises(ComposeError) as exc:
        parse(**over)
    msg = str(exc.value)
    assert needle in msg and str(P) in msg and "\n" not in msg


@pytest.mark.parametrize("slug", ["Upper", "-lead", "has space", "a" * 64, "x:y"])
def test_slugs_outside_the_file_and_service_name_alphabet_are_rejected(slug: str) -> None:
    with pytest.raises(ComposeError, match="slug"):
        parse_registry({"deployments": {slug: dict(BASE)}}, P)


def test_unknown_top_level_key_and_missing_deployments_are_errors() -> None:
    with pytest.raises(ComposeError, match="unknown top-level key 'extra'"):
        parse_registry({"deployments": {}, "extra": 1}, P)
    with pytest.raises(ComposeError, match="'deployments:' mapping"):
        parse_registry([], P)


def test_unknown_slug_lists_the_known_ones() -> None:
    with pytest.raises(ComposeError, match=r"no deployment 'nope' \(known: demo\)"):
        parse().get("nope")


def test_invalid_yaml_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "compose").mkdir()
    (tmp_path / "compose" / "deployments.yaml").write_text("deployments: [unclosed\n")
    with pytest.raises(ComposeError, match="invalid YAML") as exc:
        load_registry(Catalog.locate(tmp_path))
    assert "\n" not in str(exc.value)


def test_shipped_registry_holds_the_seed_deployments() -> None:
    reg = load_registry(Catalog.locate())
    by_port = {d.port: d for d in reg.deployments.values()}
    for port, tp, hw in [(8040, 1, "rtx-3090"), (8041, 2, "rtx-3090"), (8042, 2, "rtx-3090")]:
        assert by_port[port].tp == tp and by_port[port].hardware == hw and by_port[port].model == "gemma-4-26b-a4b"
    assert by_port[8042].weights == "awq"
    # the V100 deployments that can start (issue 24): both on the audited 0.19.1 engine, experimental
    v100 = {(d.model, d.hardware, d.tp, d.weights) for d in reg.deployments.values()
            if d.hardware.startswith("v100") and d.status == "experimental"}
    assert v100 == {("gemma-4-26b-a4b", "v100-sxm2-16gb", 2, "awq"), ("gemma-4-12b", "v100-sxm2-16gb", 2, "bf16"),
                    ("gemma-4-12b", "v100-sxm2-32gb", 1, "bf16"),
                    ("gemma-4-26b-a4b", "v100-sxm2-16gb", 2, "nvfp4")}   # through sm70-w4-gemm (issue 29)
    for d in reg.deployments.values():
        if d.hardware.startswith("v100"):
            assert d.engine == "vllm-0.19.1-sm70" and d.kv_dtype == "float16"
            if d.status == "experimental":
                assert d.note.startswith("built from wheels whose binaries carry sm_70 code (audited); "
                                         "not yet run on a V100 by this project")
    raw = yaml.safe_load(reg.path.read_text())
    assert set(raw["deployments"]) == set(reg.deployments)
