"""The three Python overlays on real vLLM releases from PyPI (issue 2, point 10).

Per release: status before apply (the matrix below, cross-checked against facts read
from the release's own sources), status after apply, apply twice byte-identical,
apply -> revert restores the original bytes, every patched file compiles, a
hand-edited block is `modified` and refused, and a v1 -> v2 sentinel upgrade.
Plus the CLI contract (`status --json` shape, `apply --dry-run`, exit codes).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from manager.errors import OverlayError
from manager.overlays import apply, load_overlays, revert, status, status_on_release
from tests.helpers.catalogs import (
    CONVERTOR,
    CONVERTOR_PY,
    CUDA_PY,
    DYNAMO,
    GEMMA4,
    OVERLAY_IDS,
    PR40886,
    RELEASES,
    SNIPPET_REVISION_LINE,
    bump_version,
    edit_one_char_after_sentinel,
    file_hashes,
    shipped_catalog,
    slim_root,
    targets_of,
    tree_hashes,
)
from tests.helpers.cli import overlay_process

# Observed status of each overlay on each pristine release (the closing note's matrix).
EXPECTED_BEFORE = {
    "0.19.0": {PR40886: "pending", CONVERTOR: "pending", DYNAMO: "pending"},
    "0.19.1": {PR40886: "pending", CONVERTOR: "pending", DYNAMO: "pending"},
    "0.20.0": {PR40886: "pending", CONVERTOR: "pending", DYNAMO: "pending"},
    "0.26.0": {PR40886: "upstream", CONVERTOR: "pending", DYNAMO: "pending"},
    "0.30.0": {PR40886: "upstream", CONVERTOR: "upstream", DYNAMO: "pending"},
    "0.31.0": {PR40886: "superseded", CONVERTOR: "upstream", DYNAMO: "pending"},
    "0.33.0": {PR40886: "superseded", CONVERTOR: "upstream", DYNAMO: "pending"},
}
TARGET = {PR40886: GEMMA4, CONVERTOR: CONVERTOR_PY, DYNAMO: CUDA_PY}

assert sorted(EXPECTED_BEFORE) == sorted(RELEASES)


def _after(before: dict[str, str]) -> dict[str, str]:
    return {oid: ("applied" if st == "pending" else st) for oid, st in before.items()}


def _pending_targets(version: str) -> list[str]:
    return sorted(TARGET[o] for o, st in EXPECTED_BEFORE[version].items() if st == "pending")


def _statuses(report) -> dict[str, str]:
    return {o.id: o.status for o in report.overlays}


def _target_statuses(report) -> dict[str, list[tuple[str, str]]]:
    return {o.id: [(t.path, t.status) for t in o.targets] for o in report.overlays}


@pytest.fixture(scope="module")
def catalog(tmp_path_factory):
    return shipped_catalog(tmp_path_factory.mktemp("catalog"))


@pytest.fixture(scope="module")
def overlays(catalog):
    found = load_overlays(catalog)
    assert [o.id for o in found] == sorted(OVERLAY_IDS)
    return found


@pytest.fixture(scope="module")
def catalog_v2(tmp_path_factory):
    return shipped_catalog(tmp_path_factory.mktemp("catalog-v2"), variants={i: bump_version() for i in OVERLAY_IDS})


# --- facts read from the release sources, independently of the engine -----------------------


def _ast_of(root: Path, rel: str) -> ast.Module:
    return ast.parse((root / rel).read_text())


def _find(node: ast.AST, *path: str) -> ast.AST | None:
    for part in path:
        hits = [
            n for n in ast.walk(node)
            if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name == part and n is not node
        ]
        if len(hits) != 1:
            return None
        node = hits[0]
    return node


def _assigned_names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _cache_decorated(mod: ast.Module) -> list[str]:
    out = []
    for n in ast.walk(mod):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in n.decorator_list:
                f = d.func if isinstance(d, ast.Call) else d
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                if name in ("cache", "lru_cache"):
                    out.append(n.name)
    return out


def _expected_from_sources(root: Path) -> dict[str, str]:
    """What each overlay's status must be, derived from plain facts of the sources."""
    gem = _ast_of(root, GEMMA4)
    conv = _ast_of(root, CONVERTOR_PY)
    cuda = _ast_of(root, CUDA_PY)
    out = {}
    # PR 40886: native when Gemma4Model.load_weights maps the underscore-suffix expert keys
    # (*_packed / *_scale); superseded when _weight_iterator is gone.
    model_lw = _find(gem, "Gemma4Model", "load_weights")
    native = model_lw is not None and "underscore_suffix_expert_params_mapping" in _assigned_names(model_lw)
    iterator = _find(gem, "Gemma4ForCausalLM", "load_weights", "_weight_iterator")
    out[PR40886] = "upstream" if native else "superseded" if iterator is None else "pending"
    # convertor: native when the Gemma4 convertor (or the base one, for heterogeneous configs)
    # builds per-layer hf configs.
    g4 = _find(conv, "Gemma4ModelArchConfigConvertor")
    base = _find(conv, "ModelArchConfigConvertorBase", "get_per_layer_hf_configs")
    native = (g4 is not None and _find(g4, "get_per_layer_hf_configs") is not None) or (
        base is not None and "is_heterogeneous" in ast.unparse(base)
    )
    out[CONVERTOR] = "upstream" if native else "pending"
    out[DYNAMO] = "pending" if _cache_decorated(cuda) else "not-applicable"
    return out


@pytest.mark.parametrize("version", RELEASES)
def test_expected_matrix_follows_from_the_release_sources(version, pristine_release):
    assert _expected_from_sources(pristine_release(version)) == EXPECTED_BEFORE[version]


@pytest.mark.parametrize("version", RELEASES)
def test_status_before_apply_matches_the_matrix(version, catalog):
    report = status_on_release(version, catalog)
    assert report.package_version == version
    assert _statuses(report) == EXPECTED_BEFORE[version]
    # one target each, carrying the overlay's status, with a detail that says why
    for o in report.overlays:
        assert [(t.path, t.status) for t in o.targets] == [(TARGET[o.id], EXPECTED_BEFORE[version][o.id])]
        assert o.targets[0].detail
    if EXPECTED_BEFORE[version][PR40886] == "superseded":
        assert "_weight_iterator not found" in report.by_id(PR40886).targets[0].detail
    if EXPECTED_BEFORE[version][PR40886] == "upstream":
        assert "native fix found" in report.by_id(PR40886).targets[0].detail


# --- apply / re-apply / revert on a writable copy ------------------------------------------


@pytest.fixture(scope="module", params=RELEASES)
def applied(request, tmp_path_factory, overlays):
    """A release copy with the overlays applied twice; records bytes at each step."""
    from manager.releases import copy_release

    version = request.param
    root = copy_release(version, tmp_path_factory.mktemp(f"site-{version}"))
    tree_before = tree_hashes(root, without_state=True)
    targets = targets_of(overlays)
    original = {rel: (root / rel).read_bytes() for rel in targets}
    before = status(overlays, root)
    first = apply(overlays, root)
    after_first = {rel: (root / rel).read_bytes() for rel in targets}
    second = apply(overlays, root)
    after_second = {rel: (root / rel).read_bytes() for rel in targets}
    tree_after = tree_hashes(root, without_state=True)
    return {
        "tree_before": tree_before, "tree_after": tree_after,
        "version": version, "root": root, "original": original, "before": before, "first": first,
        "after_first": after_first, "second": second, "after_second": after_second,
    }


def test_apply_changes_exactly_the_pending_targets(applied):
    v = applied["version"]
    assert _statuses(applied["before"]) == EXPECTED_BEFORE[v]
    changed = sorted(c.path for c in applied["first"].changes)
    assert changed == _pending_targets(v)
    for rel, data in applied["after_first"].items():
        assert (data != applied["original"][rel]) == (rel in changed), rel


def test_apply_touches_no_other_file_of_the_real_tree(applied):
    before, after = applied["tree_before"], applied["tree_after"]
    assert len(before) > 1000  # the whole release, not a slim copy
    assert sorted(before) == sorted(after)
    changed = sorted(rel for rel in before if before[rel] != after[rel])
    assert changed == _pending_targets(applied["version"])


def test_status_after_apply_is_applied_where_pending(applied, overlays):
    v = applied["version"]
    assert _statuses(applied["first"].statuses) == _after(EXPECTED_BEFORE[v])
    # the same from the ledger (fast path) and from parsing the files
    fast = status(overlays, applied["root"])
    parsed = status(overlays, applied["root"], use_ledger=False)
    assert fast.source == "ledger" and parsed.source == "sources"
    assert _statuses(fast) == _statuses(parsed) == _after(EXPECTED_BEFORE[v])
    assert _target_statuses(fast) == _target_statuses(parsed)


def test_superseded_overlay_is_skipped_with_its_reason(applied):
    skipped = dict(applied["first"].skipped)
    if EXPECTED_BEFORE[applied["version"]][PR40886] == "superseded":
        assert list(skipped) == [PR40886]
        assert skipped[PR40886].startswith("superseded:")
    else:
        assert skipped == {}


def test_apply_twice_is_byte_identical(applied, overlays):
    assert applied["second"].changes == ()
    assert applied["after_second"] == applied["after_first"]
    # and without the ledger: the edits themselves see their blocks and write nothing
    root = applied["root"]
    ledger = root / ".overlay-manager" / "ledger.json"
    saved = ledger.read_bytes()
    try:
        ledger.unlink()
        third = apply(overlays, root)
        assert third.changes == () and not third.fast_path
        assert {rel: (root / rel).read_bytes() for rel in applied["after_first"]} == applied["after_first"]
    finally:
        ledger.write_bytes(saved)


def test_every_patched_file_compiles_and_carries_our_sentinels(applied, overlays):
    v = applied["version"]
    version_of = {o.id: o.manifest.sentinel_version for o in overlays}
    for rel in _pending_targets(v):
        text = applied["after_first"][rel].decode()
        compile(text, rel, "exec", dont_inherit=True)
        owner = next(o for o, t in TARGET.items() if t == rel)
        assert f"# overlay:{owner} v{version_of[owner]} " in text
    # the inserted branches sit above the float branch they must precede
    if EXPECTED_BEFORE[v][PR40886] == "pending":
        text = applied["after_first"][GEMMA4].decode()
        assert text.index('if "moe.gate_up_proj_packed" in name') < text.index('if "moe.gate_up_proj" in name')


@pytest.mark.parametrize("version", RELEASES)
def test_apply_then_revert_restores_the_original_bytes(version, tmp_path, overlays):
    root = slim_root(version, tmp_path)
    targets = targets_of(overlays)
    original = file_hashes(root, targets)
    result = apply(overlays, root)
    assert result.changed
    assert file_hashes(root, targets) != original
    reverted = revert(overlays, overlays, root)
    assert sorted(c.path for c in reverted.changes) == _pending_targets(version)
    assert file_hashes(root, targets) == original
    assert _statuses(status(overlays, root)) == EXPECTED_BEFORE[version]


@pytest.mark.parametrize("version", RELEASES)
def test_hand_edited_block_is_modified_and_apply_refuses(version, tmp_path, overlays):
    root = slim_root(version, tmp_path)
    apply(overlays, root)
    pending = [o for o, st in EXPECTED_BEFORE[version].items() if st == "pending"]
    for oid in pending:
        p = root / TARGET[oid]
        p.write_text(edit_one_char_after_sentinel(p.read_text(), oid))
    edited = file_hashes(root, targets_of(overlays))
    report = status(overlays, root)
    want = {o: ("modified" if o in pending else st) for o, st in EXPECTED_BEFORE[version].items()}
    assert _statuses(report) == want
    assert report.failing
    for oid in pending:
        assert re.search(r"\bedited\b", report.by_id(oid).targets[0].detail)
    with pytest.raises(OverlayError, match=r"overlay \S+: vllm/\S+\.py: modified: "):
        apply(overlays, root)
    assert file_hashes(root, targets_of(overlays)) == edited
    # revert refuses too: the file no longer has the hash apply recorded
    with pytest.raises(OverlayError, match="revert refused: .* changed since overlay apply"):
        revert(overlays, overlays, root)
    assert file_hashes(root, targets_of(overlays)) == edited


def test_edited_dict_cache_decorator_is_modified(tmp_path, overlays):
    root = slim_root("0.20.0", tmp_path)
    apply(overlays, root)
    p = root / CUDA_PY
    text = p.read_text()
    assert text.count("@_overlay_dict_cache(maxsize=8)") == 1
    p.write_text(text.replace("@_overlay_dict_cache(maxsize=8)", "@_overlay_dict_cache(maxsize=9)"))
    st = status(overlays, root).by_id(DYNAMO)
    assert st.status == "modified"
    assert "decorator on _cuda_device_count_stateless was edited" in st.targets[0].detail


@pytest.mark.parametrize("version", RELEASES)
def test_v1_to_v2_sentinel_upgrade_replaces_the_block(version, tmp_path, overlays, catalog_v2):
    root = slim_root(version, tmp_path)
    targets = targets_of(overlays)
    original = file_hashes(root, targets)
    apply(overlays, root)
    v1 = {rel: (root / rel).read_text() for rel in _pending_targets(version)}
    overlays_v2 = load_overlays(catalog_v2)
    old = {o.id: o.manifest.sentinel_version for o in overlays}
    new = {o.id: o.manifest.sentinel_version for o in overlays_v2}
    assert all(new[i] == old[i] + 1 for i in OVERLAY_IDS)

    before = status(overlays_v2, root)
    assert _statuses(before) == EXPECTED_BEFORE[version]  # an older block under a newer catalog: work pending
    result = apply(overlays_v2, root)
    assert sorted(c.path for c in result.changes) == _pending_targets(version)
    assert _statuses(result.statuses) == _after(EXPECTED_BEFORE[version])

    pending = [o for o, st in EXPECTED_BEFORE[version].items() if st == "pending"]
    for oid in pending:
        text, was = (root / TARGET[oid]).read_text(), v1[TARGET[oid]]
        compile(text, TARGET[oid], "exec", dont_inherit=True)
        assert f"overlay:{oid} v{old[oid]} " not in text
        manifest = next(o for o in overlays_v2 if o.id == oid).manifest
        for edit in manifest.edits:
            if edit.kind == "insert":
                # exactly one block per edit, the new snippet, the old block gone (not duplicated)
                assert len(re.findall(rf"# overlay:{oid} v{new[oid]} {edit.name} ", text)) == 1
                first_code = next(
                    line.strip() for line in was.split(f"overlay:{oid} v{old[oid]} {edit.name} ", 1)[1].splitlines()[1:]
                    if line.strip() and not line.strip().startswith("#")
                    and "__import__(" not in line  # OVERLAY_TRACE guard lines name the version
                )
                assert text.count(first_code) == was.count(first_code)
        inserts = sum(1 for e in manifest.edits if e.kind == "insert")
        assert text.count(SNIPPET_REVISION_LINE) == inserts
        if oid == DYNAMO:
            assert text.count(f"# overlay:{DYNAMO} v{new[oid]} dict-caches-helper ") == 1
            assert text.count("def _overlay_dict_cache(") == 1
            assert text.count(f"# overlay:{DYNAMO} v{new[oid]} dict-caches ") == was.count(
                f"# overlay:{DYNAMO} v{old[oid]} dict-caches "
            ) > 0

    again = apply(overlays_v2, root)
    assert again.changes == ()
    revert(overlays_v2, overlays_v2, root)
    assert file_hashes(root, targets) == original


# --- CLI ------------------------------------------------------------------------------------


def test_cli_status_json_has_the_documented_shape(vllm_root, catalog):
    root = vllm_root("0.26.0")
    proc = overlay_process("--catalog", str(catalog.root), "status", "--root", str(root), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["root"] == str(root.resolve())
    assert data["package_version"] == "0.26.0"
    assert [o["id"] for o in data["overlays"]] == sorted(OVERLAY_IDS)
    for o in data["overlays"]:
        assert {"id", "status", "targets"} <= set(o)
        assert o["status"] == EXPECTED_BEFORE["0.26.0"][o["id"]]
        assert len(o["targets"]) == 1
        t = o["targets"][0]
        assert {"path", "status", "detail"} <= set(t)
        assert t["path"] == TARGET[o["id"]] and t["status"] == o["status"] and isinstance(t["detail"], str)


def test_cli_apply_dry_run_exits_1_when_pending_and_changes_nothing(tmp_path, catalog, cli_run):
    root = slim_root("0.20.0", tmp_path)
    original = file_hashes(root, TARGET.values())
    rc, out, err = cli_run("--catalog", str(catalog.root), "apply", "--root", str(root), "--dry-run")
    assert rc == 1, err
    assert "would " in err
    assert file_hashes(root, TARGET.values()) == original
    assert not (root / ".overlay-manager" / "ledger.json").exists()

    rc, _, err = cli_run("--catalog", str(catalog.root), "apply", "--root", str(root))
    assert rc == 0, err
    assert file_hashes(root, TARGET.values()) != original
    rc, _, err = cli_run("--catalog", str(catalog.root), "apply", "--root", str(root), "--dry-run")
    assert rc == 0, err  # nothing pending any more
    rc, out, _ = cli_run("--catalog", str(catalog.root), "status", "--root", str(root), "--json")
    assert rc == 0 and {o["status"] for o in json.loads(out)["overlays"]} == {"applied"}


def test_cli_status_exits_1_on_modified(tmp_path, catalog, cli_run):
    root = slim_root("0.20.0", tmp_path)
    rc, _, err = cli_run("--catalog", str(catalog.root), "apply", "--root", str(root))
    assert rc == 0, err
    p = root / CONVERTOR_PY
    p.write_text(edit_one_char_after_sentinel(p.read_text(), CONVERTOR, "head-size-compat"))
    rc, out, _ = cli_run("--catalog", str(catalog.root), "status", "--root", str(root), "--json")
    assert rc == 1
    assert {o["id"]: o["status"] for o in json.loads(out)["overlays"]}[CONVERTOR] == "modified"
    rc, _, err = cli_run("--catalog", str(catalog.root), "apply", "--root", str(root))
    assert rc == 1 and "modified" in err


def test_cli_status_exits_1_on_drift(tmp_path, catalog, cli_run):
    root = slim_root("0.20.0", tmp_path)
    p = root / GEMMA4
    text = p.read_text()
    anchor = 'if "moe.gate_up_proj" in name and weight.dim() == 3:'
    assert text.count(anchor) == 1
    p.write_text(text.replace(anchor, 'if "moe.gate_up_proj" in name and weight.ndim == 3:'))
    rc, out, _ = cli_run("--catalog", str(catalog.root), "status", PR40886, "--root", str(root), "--json")
    assert rc == 1
    [o] = json.loads(out)["overlays"]
    assert o["status"] == "drift" and "anchor not found" in o["targets"][0]["detail"]
    rc, _, err = cli_run("--catalog", str(catalog.root), "apply", "--root", str(root), "--dry-run")
    assert rc == 1 and "drift" in err


def test_cli_superseded_is_not_a_failure_unless_named(tmp_path, catalog, cli_run):
    root = slim_root("0.31.0", tmp_path)
    rc, _, err = cli_run("--catalog", str(catalog.root), "status", "--root", str(root))
    assert rc == 0, err
    rc, _, err = cli_run("--catalog", str(catalog.root), "apply", "--root", str(root))
    assert rc == 0, err
    assert "skipped" in err and PR40886 in err
    rc, _, err = cli_run("--catalog", str(catalog.root), "apply", PR40886, "--root", str(root))
    assert rc == 1 and "superseded" in err


def test_revert_of_one_overlay_leaves_the_others_applied(tmp_path, overlays):
    root = slim_root("0.20.0", tmp_path)
    original = file_hashes(root, TARGET.values())
    apply(overlays, root)
    applied_bytes = file_hashes(root, TARGET.values())
    conv = [o for o in overlays if o.id == CONVERTOR]
    result = revert(conv, overlays, root)
    assert [c.path for c in result.changes] == [CONVERTOR_PY]
    now = file_hashes(root, TARGET.values())
    assert now[CONVERTOR_PY] == original[CONVERTOR_PY]
    assert now[GEMMA4] == applied_bytes[GEMMA4] and now[CUDA_PY] == applied_bytes[CUDA_PY]
    assert _statuses(status(overlays, root)) == {PR40886: "applied", CONVERTOR: "pending", DYNAMO: "applied"}
    # re-apply brings back the same bytes; a full revert then restores every original
    apply(overlays, root)
    assert file_hashes(root, TARGET.values()) == applied_bytes
    revert(overlays, overlays, root)
    assert file_hashes(root, TARGET.values()) == original


def test_apply_keeps_file_modes_and_drops_stale_bytecode(tmp_path, overlays):
    import py_compile
    import stat

    root = slim_root("0.20.0", tmp_path)
    pycs = {}
    for rel in TARGET.values():
        (root / rel).chmod(0o640)
        pycs[rel] = Path(py_compile.compile(str(root / rel), doraise=True))
        assert pycs[rel].exists()
    untouched = Path(py_compile.compile(str(root / GEMMA4), cfile=str(root / "vllm/model_executor/models/__pycache__/other.cpython-311.pyc")))
    apply(overlays, root)
    for rel in TARGET.values():
        assert stat.S_IMODE((root / rel).stat().st_mode) == 0o640, rel
        assert not pycs[rel].exists(), rel  # stale bytecode of a patched module is gone
    assert untouched.exists()  # other modules' bytecode stays


def test_dict_cache_helper_is_defined_before_its_first_use(applied):
    """Decorators run at import time: the helper must be bound above every decorated def."""
    tree = ast.parse(applied["after_first"][CUDA_PY].decode())
    [helper] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_overlay_dict_cache"]
    uses = [
        d.lineno
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        for d in n.decorator_list
        if "_overlay_dict_cache" in ast.unparse(d)
    ]
    assert uses and helper.end_lineno < min(uses)
    # module level, after the imports it follows
    first_def = next(i for i, n in enumerate(tree.body) if isinstance(n, (ast.FunctionDef, ast.ClassDef)))
    assert tree.body[first_def] is helper


def test_cli_diff_is_the_patch_apply_writes(tmp_path, catalog, cli_run):
    """`overlay diff` applied with `git apply` to a second pristine copy gives apply's bytes."""
    import shutil
    import subprocess

    if shutil.which("git") is None:
        pytest.skip("git not installed")
    a, b = slim_root("0.20.0", tmp_path / "a"), slim_root("0.20.0", tmp_path / "b")
    rc, diff_text, err = cli_run("--catalog", str(catalog.root), "diff", "--root", str(a))
    assert rc == 0, err
    assert diff_text.count("\n+++ b/") + diff_text.startswith("+++ b/") == 3
    assert file_hashes(a, TARGET.values()) == file_hashes(b, TARGET.values())  # diff wrote nothing
    (tmp_path / "p.diff").write_text(diff_text)
    subprocess.run(["git", "apply", str(tmp_path / "p.diff")], cwd=b, check=True, capture_output=True)
    rc, _, err = cli_run("--catalog", str(catalog.root), "apply", "--root", str(a))
    assert rc == 0, err
    assert file_hashes(a, TARGET.values()) == file_hashes(b, TARGET.values())


def _reinstall(root, pristine, rel):
    (root / rel).write_bytes((pristine / rel).read_bytes())


def test_a_deleted_block_is_modified_and_apply_refuses_until_the_file_is_reinstalled(
    tmp_path, catalog, overlays, pristine_release, cli_run
):
    root = slim_root("0.20.0", tmp_path)
    original = file_hashes(root, TARGET.values())
    apply(overlays, root)
    p = root / CONVERTOR_PY
    good = p.read_text()
    # remove the kv-heads method block (sentinel line and method) by hand
    marker = re.search(rf"^[ \t]*# overlay:{CONVERTOR} v\d+ kv-heads-compat .*\n", good, re.M)
    assert marker is not None
    end = good.index("return super().get_total_num_kv_heads()\n", marker.end()) + len("return super().get_total_num_kv_heads()\n")
    p.write_text(good[: marker.start()] + good[end:])
    edited = file_hashes(root, TARGET.values())
    rc, out, _ = cli_run("--catalog", str(catalog.root), "status", "--root", str(root), "--json")
    assert rc == 1
    st = {o["id"]: o for o in json.loads(out)["overlays"]}[CONVERTOR]
    assert st["status"] == "modified" and "changed since" in st["targets"][0]["detail"]
    assert "kv-heads-compat: anchor found once" in st["targets"][0]["detail"]
    with pytest.raises(OverlayError, match="modified"):
        apply(overlays, root)
    assert file_hashes(root, TARGET.values()) == edited  # nothing written
    # the user reinstalls the file: the ledger's original bytes again -> pending -> same bytes as before
    _reinstall(root, pristine_release("0.20.0"), CONVERTOR_PY)
    result = apply(overlays, root)
    assert [c.path for c in result.changes] == [CONVERTOR_PY]
    assert p.read_text() == good
    revert(overlays, overlays, root)
    assert file_hashes(root, TARGET.values()) == original


def test_a_deleted_sentinel_line_never_leads_to_a_second_copy_of_the_block(
    tmp_path, catalog, overlays, pristine_release
):
    root = slim_root("0.20.0", tmp_path)
    apply(overlays, root)
    p = root / GEMMA4
    patched = p.read_text()
    stripped = re.sub(rf"^[ \t]*# overlay:{PR40886} v\d+ .*\n", "", patched, flags=re.M)
    assert stripped != patched
    p.write_text(stripped)
    report = status(overlays, root)
    assert report.by_id(PR40886).status == "modified"
    with pytest.raises(OverlayError, match="changed since"):
        apply(overlays, root)
    assert p.read_text() == stripped
    assert p.read_text().count('if "moe.gate_up_proj_packed" in name') == 1
