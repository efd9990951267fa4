"""The whole shipped catalog on vLLM 0.19.1, the V100 engine's release (issue 24, point 3).

On a full writable copy of the real 0.19.1 tree: every overlay's status before, apply of the whole catalog,
status after (from the ledger and from the sources), every patched or created file compiles, a second apply
writes nothing, revert leaves every file of the tree byte-identical. And the status table of
docs/overlays.md ("The catalog on the releases a V100 can run") is what `status` measures on each release.
"""

from __future__ import annotations

import re

import pytest

from manager.catalog import Catalog
from manager.overlays import apply, load_overlays, revert, status, status_on_release
from manager.releases import copy_release
from tests.helpers import REPO_ROOT
from tests.helpers.catalogs import tree_hashes

V100_RELEASE = "0.19.1"
DOC = REPO_ROOT / "docs" / "overlays.md"
SECTION = "## The catalog on the releases a V100 can run"
# Not applicable on 0.19.1, with the reason the doc gives: 0.19.1 has no gemma4_mtp / Gemma4Proposer.
NO_TARGET_ON_0_19_1 = {"gemma4-mtp-per-layer", "gemma4-mtp-cpu-kv-sharing"}


def _doc_table() -> tuple[list[str], dict[str, list[str]]]:
    text = DOC.read_text()
    assert SECTION in text
    rows = [l for l in text.split(SECTION, 1)[1].splitlines() if l.startswith("|")]
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    assert header[0] == "overlay"
    table = {}
    for line in rows[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        m = re.fullmatch(r"`([a-z0-9][a-z0-9._-]*)`", cells[0])
        if m is None:  # the next table (fixes not ported) starts
            break
        table[m[1]] = cells[1:]
    return header[1:], table


def test_doc_table_is_what_status_measures_on_each_release():
    versions, table = _doc_table()
    assert V100_RELEASE in versions and {"0.19.0", "0.20.0", "0.22.0"} <= set(versions)
    catalog = Catalog(REPO_ROOT)
    ids = sorted(o.id for o in load_overlays(catalog))
    assert sorted(table) == ids, "every shipped overlay has a row"
    for i, version in enumerate(versions):
        measured = {o.id: o.status for o in status_on_release(version, catalog).overlays}
        assert {oid: row[i] for oid, row in table.items()} == measured, version


@pytest.fixture(scope="module")
def v100_tree(tmp_path_factory):
    catalog = Catalog(REPO_ROOT)
    overlays = load_overlays(catalog)
    root = copy_release(V100_RELEASE, tmp_path_factory.mktemp("site-0.19.1"))
    before = tree_hashes(root, without_state=True)
    st_before = {o.id: o.status for o in status(overlays, root).overlays}
    result = apply(overlays, root)
    return {"root": root, "overlays": overlays, "before": before, "st_before": st_before, "result": result}


def test_every_overlay_is_pending_on_0_19_1_except_the_mtp_ones(v100_tree):
    st = v100_tree["st_before"]
    assert {o for o, s in st.items() if s == "not-applicable"} == NO_TARGET_ON_0_19_1
    assert {s for o, s in st.items() if o not in NO_TARGET_ON_0_19_1} == {"pending"}


def test_whole_catalog_applies_compiles_and_is_idempotent_on_0_19_1(v100_tree):
    root, overlays = v100_tree["root"], v100_tree["overlays"]
    applied = {o.id: o.status for o in v100_tree["result"].statuses.overlays}
    assert applied == {o: ("applied" if s == "pending" else s) for o, s in v100_tree["st_before"].items()}
    parsed = {o.id: o.status for o in status(overlays, root, use_ledger=False).overlays}
    assert parsed == applied
    changed = sorted(c.path for c in v100_tree["result"].changes)
    assert "vllm/model_executor/models/gemma4_unified.py" in changed  # created from the pinned 0.24.0 file
    for rel in changed:
        text = (root / rel).read_text()
        compile(text, rel, "exec", dont_inherit=True)
        assert "overlay:" in text
    after = tree_hashes(root, without_state=True)
    assert apply(overlays, root).changes == ()
    assert tree_hashes(root, without_state=True) == after


def test_revert_of_the_whole_catalog_restores_every_byte_of_0_19_1(v100_tree):
    root, overlays = v100_tree["root"], v100_tree["overlays"]
    revert(overlays, overlays, root)
    assert tree_hashes(root, without_state=True) == v100_tree["before"]
