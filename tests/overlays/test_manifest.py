"""Manifest schema: every error names the file, the key and the value; the CLI says it in one line."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from manager.catalog import Catalog
from manager.errors import OverlayError
from manager.overlays import load_manifest, load_overlays
from manager.overlays.manifest import manifest_digest
from tests.helpers import REPO_ROOT
from tests.helpers.catalogs import OVERLAY_IDS, tree_hashes
from tests.helpers.cli import overlay_process

VALID = {
    "id": "demo-fix",
    "title": "A demo fix",
    "summary": "Inserts one statement.",
    "upstream": {"repo": "vllm-project/vllm", "pr": 123, "state": "open", "head_commit": "abcdef1"},
    "vendored_on": "2026-11-29",
    "tested_on": [{"hardware": "v100-sxm2-16gb", "vllm": "0.20.0"}],
    "package": "vllm",
    "versions": ">=0.19.0,<0.30",
    "targets": ["vllm/x.py"],
    "drop_when": "never",
    "probes": [{"target": "vllm/x.py", "scope": "f", "defines": "y"}],
    "sentinel_version": 1,
    "edits": [{"kind": "insert", "name": "one", "scope": "f", "anchor": "return x", "code": "snip.py"}],
}


def _write(tmp_path: Path, data, dirname: str = "demo-fix", raw: str | None = None) -> Path:
    d = tmp_path / "overlays" / dirname
    d.mkdir(parents=True, exist_ok=True)
    (d / "snip.py").write_text("y = 1\n")
    p = d / "overlay.yaml"
    p.write_text(raw if raw is not None else yaml.safe_dump(data, sort_keys=False))
    return p


def _with(**changes):
    data = copy.deepcopy(VALID)
    for dotted, value in changes.items():
        node = data
        *parents, last = dotted.split("__")
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value is _DELETE:
            del node[last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return data


_DELETE = object()


def test_valid_manifest_loads(tmp_path):
    m = load_manifest(_write(tmp_path, VALID))
    assert m.id == "demo-fix" and m.edits[0].kind == "insert"
    assert m.applies_to_version("0.20.0") and not m.applies_to_version("0.31.0")


@pytest.mark.parametrize(
    "data, key, value",
    [
        (_with(colour="blue"), "colour", "'blue'"),  # unknown key
        (_with(upstream__reviewer="x"), "upstream.reviewer", "'x'"),  # unknown nested key
        (_with(sentinel_version="one"), "sentinel_version", "'one'"),  # wrong type
        (_with(targets="vllm/x.py"), "targets", "'vllm/x.py'"),  # wrong type (str, not list)
        (_with(upstream__pr=-4), "upstream.pr", "-4"),
        (_with(versions=">=0.19.0,<<0.30"), "versions", "'>=0.19.0,<<0.30'"),  # bad PEP 440 specifier
        (_with(versions="0.20"), "versions", "'0.20'"),
        (_with(upstream__state="merged"), "upstream", "merge_commit"),  # merged without merge_commit
        (_with(upstream__state="sideways"), "upstream.state", "'sideways'"),
        (_with(edits__0__kind="replace-all"), "edits[0]", "replace-all"),
        (_with(edits__0__position="around"), "edits[0].position", "'around'"),
        (_with(vendored_on="yesterday"), "vendored_on", "'yesterday'"),
        (_with(probes__0__defines=_DELETE), "probes[0]", "defines"),
        (_with(targets=["/etc/passwd"]), "targets", "/etc/passwd"),
        (_with(native_from="soon"), "native_from", "'soon'"),  # not a PEP 440 version
        (_with(native_from=0.28), "native_from", "0.28"),  # a YAML float, not a string
        (_with(needed_when={"moe": "sometimes"}), "needed_when.moe", "'sometimes'"),
    ],
    ids=[
        "unknown-key", "unknown-nested-key", "wrong-type-int", "wrong-type-list", "negative-pr",
        "bad-specifier", "bare-version-specifier", "merged-without-merge-commit", "bad-state",
        "unknown-edit-kind", "bad-position", "bad-date", "probe-without-condition", "absolute-target",
        "bad-native-from", "native-from-not-a-string", "moe-not-a-bool",
    ],
)
def test_schema_error_names_file_key_and_value(tmp_path, data, key, value):
    path = _write(tmp_path, data)
    with pytest.raises(OverlayError) as info:
        load_manifest(path)
    msg = str(info.value)
    assert str(path) in msg
    assert f": {key}" in msg, msg
    assert value in msg, msg


def test_bad_native_from_is_one_line_naming_file_key_and_value(tmp_path):
    path = _write(tmp_path, _with(native_from="0.2x"))
    with pytest.raises(OverlayError) as info:
        load_manifest(path)
    assert str(info.value) == f"{path}: native_from: Value error, not a PEP 440 version: '0.2x' (value: '0.2x')"


def test_shipped_native_from_is_the_release_drop_when_names():
    """Each shipped overlay's native_from is the vLLM release its drop_when gives for the native fix
    (the values fits() used to hard-code); a local workaround has none."""
    got = {}
    for mf in sorted((REPO_ROOT / "overlays").glob("*/overlay.yaml")):
        m = load_manifest(mf)
        got[m.id] = m.native_from
        if m.native_from is not None:
            assert f"vLLM >= {m.native_from}" in " ".join(m.drop_when.split()), m.id
    assert got == {
        "vllm-pr40886-gemma4-awq-moe-keys": "0.21.0", "vllm-pr40411-gemma4-mm-embedder-prenorm": "0.20.0", "gemma4-convertor-per-layer": "0.28.0",
        "gemma4-unified-port": "0.24.0", "gemma4-mtp-per-layer": "0.28.0", "gemma4-mtp-cpu-kv-sharing": "0.27.1",
        "dynamo-dict-caches": None, "sm70-d512-attention": None, "sm70-w4-gemm": None, "gemma4-ple-nvfp4-dequant": None,
    }


def test_id_must_equal_directory_name(tmp_path):
    path = _write(tmp_path, VALID, dirname="other-name")
    with pytest.raises(OverlayError) as info:
        load_manifest(path)
    msg = str(info.value)
    assert str(path) in msg and "id" in msg and "'demo-fix'" in msg and "'other-name'" in msg


def test_invalid_yaml_names_file_and_line(tmp_path):
    raw = "id: demo-fix\ntitle: [unclosed\nsummary: x\n"
    path = _write(tmp_path, None, raw=raw)
    with pytest.raises(OverlayError) as info:
        load_manifest(path)
    msg = str(info.value)
    assert str(path) in msg and "invalid YAML" in msg and "line" in msg


def test_top_level_not_a_mapping(tmp_path):
    path = _write(tmp_path, None, raw="- a\n- b\n")
    with pytest.raises(OverlayError, match="expected a mapping"):
        load_manifest(path)


def test_several_errors_in_one_catalog_are_reported_together(tmp_path):
    _write(tmp_path, _with(colour="blue"), dirname="demo-fix")
    other = _with(id="second-fix", sentinel_version=0)
    _write(tmp_path, other, dirname="second-fix")
    with pytest.raises(OverlayError) as info:
        load_overlays(Catalog(tmp_path))
    msg = str(info.value)
    assert "demo-fix/overlay.yaml: colour" in msg and "second-fix/overlay.yaml: sentinel_version" in msg


def test_requires_unknown_overlay_is_an_error(tmp_path):
    _write(tmp_path, _with(requires=["nope"]))
    with pytest.raises(OverlayError, match="requires: unknown overlay 'nope'"):
        load_overlays(Catalog(tmp_path))


def test_edit_target_must_be_listed(tmp_path):
    data = _with(edits__0__target="vllm/other.py")
    with pytest.raises(OverlayError, match=r"overlay.yaml: .*edit 'one': target 'vllm/other.py' is not listed"):
        load_manifest(_write(tmp_path, data))


def test_shipped_manifests_are_valid(tmp_path):
    for i in OVERLAY_IDS:
        m = load_manifest(REPO_ROOT / "overlays" / i / "overlay.yaml")
        assert m.id == i and m.sentinel_version >= 1 and m.targets


def test_manifest_digest_changes_with_a_snippet(tmp_path):
    path = _write(tmp_path, VALID)
    before = manifest_digest(path.parent)
    (path.parent / "snip.py").write_text("y = 2\n")
    assert manifest_digest(path.parent) != before


@pytest.mark.parametrize("command", [["list"], ["status"], ["apply"], ["apply", "--dry-run"], ["revert"]])
def test_cli_reports_a_bad_manifest_in_one_line_and_changes_nothing(tmp_path, vllm_root, command):
    root = vllm_root("0.20.0")
    path = _write(tmp_path / "cat", _with(versions="~=banana"))
    before = tree_hashes(root)
    cat_before = tree_hashes(tmp_path / "cat")
    args = ["--catalog", str(tmp_path / "cat"), *command]
    if command[0] != "list":
        args += ["--root", str(root)]
    proc = overlay_process(*args)
    assert proc.returncode == 1, proc
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error:") and "versions" in lines[0] and "banana" in lines[0]
    assert str(path) in proc.stderr.replace("\n", "")
    assert proc.stdout == ""
    assert tree_hashes(root) == before
    assert tree_hashes(tmp_path / "cat") == cat_before
