"""Issue 28, manifests a careless or hostile hand writes: duplicate keys, a boolean where a
version number belongs, target paths in more than one spelling, a FIFO for overlay.yaml."""

from __future__ import annotations

import os

import pytest
import yaml

from manager.errors import OverlayError
from manager.overlays import load_manifest
from tests.helpers.fifos import error_without_blocking
from tests.overlays.test_manifest import VALID, _with, _write


def test_a_duplicate_key_is_refused_naming_the_key_and_its_line(tmp_path):
    raw = yaml.safe_dump(VALID, sort_keys=False) + "sentinel_version: 7\n"
    p = _write(tmp_path, None, raw=raw)
    with pytest.raises(OverlayError, match=r"overlay.yaml: line \d+: invalid YAML: duplicate key 'sentinel_version'"):
        load_manifest(p)


def test_a_duplicate_key_in_a_nested_mapping_is_refused(tmp_path):
    raw = yaml.safe_dump(VALID, sort_keys=False).replace("  pr: 123\n", "  pr: 123\n  pr: 456\n")
    assert "pr: 456" in raw
    with pytest.raises(OverlayError, match="duplicate key 'pr'"):
        load_manifest(_write(tmp_path, None, raw=raw))


def test_sentinel_version_true_is_not_read_as_1(tmp_path):
    with pytest.raises(OverlayError, match="sentinel_version"):
        load_manifest(_write(tmp_path, _with(sentinel_version=True)))


@pytest.mark.parametrize("alias", ["vllm/./x.py", "./vllm/x.py", "vllm//x.py", "vllm/x.py/"])
def test_a_target_not_in_normal_form_is_refused(tmp_path, alias):
    data = _with(targets=[alias])
    data["probes"][0]["target"] = alias
    with pytest.raises(OverlayError, match="targets"):
        load_manifest(_write(tmp_path, data))


def test_a_target_listed_twice_is_refused(tmp_path):
    with pytest.raises(OverlayError, match="listed twice"):
        load_manifest(_write(tmp_path, _with(targets=["vllm/x.py", "vllm/x.py"], edits__0__target="vllm/x.py")))


def test_an_overlay_yaml_that_is_a_fifo_is_one_line_and_never_blocks(tmp_path):
    d = tmp_path / "overlays" / "demo-fix"
    d.mkdir(parents=True)
    os.mkfifo(d / "overlay.yaml")
    exc = error_without_blocking(lambda: load_manifest(d / "overlay.yaml"), d / "overlay.yaml")
    assert isinstance(exc, OverlayError) and "FIFO" in str(exc)
