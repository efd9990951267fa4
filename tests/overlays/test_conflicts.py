"""Overlay conflicts (issue 28): two overlays of one apply editing one place of one file are
refused naming both, unless `requires` orders them."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from manager.catalog import Catalog
from manager.errors import OverlayError
from manager.overlays import apply, load_overlays, select
from tests.overlays.test_manifest import VALID


def _catalog(tmp_path: Path, b_requires: list[str]) -> Catalog:
    for oid, name, requires in (("fix-a", "y", []), ("fix-b", "z", b_requires)):
        d = tmp_path / "cat" / "overlays" / oid
        d.mkdir(parents=True)
        (d / "snip.py").write_text(f"{name} = 1\n")
        data = copy.deepcopy(VALID)
        data.update(id=oid, requires=requires)
        data["probes"] = [{"target": "vllm/x.py", "scope": "f", "defines": name + "_upstream"}]
        (d / "overlay.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return Catalog(tmp_path / "cat")


def _root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "x.py").write_text("def f():\n    x = 1\n    return x\n")
    info = root / "vllm-0.20.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.20.0\n\n")
    return root


def test_two_unordered_overlays_inserting_at_one_anchor_are_refused_naming_both(tmp_path):
    root = _root(tmp_path)
    before = (root / "vllm" / "x.py").read_bytes()
    with pytest.raises(OverlayError, match=r"overlays fix-a and fix-b both edit vllm/x.py \(at 'f' 'return x'\)"):
        apply(load_overlays(_catalog(tmp_path, [])), root)
    assert (root / "vllm" / "x.py").read_bytes() == before
    assert not (root / ".overlay-manager" / "ledger.json").exists()


def test_requires_orders_them_and_both_apply(tmp_path):
    root = _root(tmp_path)
    result = apply(load_overlays(_catalog(tmp_path, ["fix-a"])), root)
    text = (root / "vllm" / "x.py").read_text()
    assert "y = 1" in text and "z = 1" in text
    assert {o.id: o.status for o in result.statuses.overlays} == {"fix-a": "applied", "fix-b": "applied"}


def test_an_overlay_editing_the_spot_an_earlier_runs_overlay_edited_is_refused_naming_both(tmp_path):
    root = _root(tmp_path)
    every = load_overlays(_catalog(tmp_path, []))
    apply(select(every, ["fix-a"]), root, explicit=True)  # the earlier run: A alone, recorded in the ledger
    before = (root / "vllm" / "x.py").read_bytes()
    ledger = (root / ".overlay-manager" / "ledger.json").read_bytes()
    with pytest.raises(OverlayError, match=r"overlays fix-a \(applied earlier\) and fix-b both edit vllm/x.py "
                                           r"\(at 'f' 'return x'\)"):
        apply(select(every, ["fix-b"]), root, explicit=True)
    assert (root / "vllm" / "x.py").read_bytes() == before
    assert (root / ".overlay-manager" / "ledger.json").read_bytes() == ledger
    with pytest.raises(OverlayError, match=r"fix-a \(applied earlier\) and fix-b"):  # the whole catalog: same
        apply(every, root)


def test_an_earlier_runs_overlay_the_new_one_requires_is_no_conflict(tmp_path):
    root = _root(tmp_path)
    every = load_overlays(_catalog(tmp_path, ["fix-a"]))
    apply(select(every, ["fix-a"]), root, explicit=True)
    result = apply(select(every, ["fix-b"]), root, explicit=True)
    text = (root / "vllm" / "x.py").read_text()
    assert "y = 1" in text and "z = 1" in text
    assert {o.id: o.status for o in result.statuses.overlays} == {"fix-a": "applied", "fix-b": "applied"}


def test_a_requires_chain_through_an_overlay_on_another_file_orders_an_earlier_one(tmp_path):
    """fix-b requires fix-c (another file only) which requires fix-a; fix-c and fix-a applied earlier:
    fix-a is ordered before fix-b through fix-c, which this apply does not write."""
    cat = _catalog(tmp_path, ["fix-c"])
    d = tmp_path / "cat" / "overlays" / "fix-c"
    d.mkdir()
    (d / "snip.py").write_text("w = 1\n")
    data = copy.deepcopy(VALID)
    data.update(id="fix-c", requires=["fix-a"], targets=["vllm/other.py"])
    data["probes"] = [{"target": "vllm/other.py", "scope": "f", "defines": "w_upstream"}]
    (d / "overlay.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    root = _root(tmp_path)
    (root / "vllm" / "other.py").write_text("def f():\n    x = 1\n    return x\n")
    every = load_overlays(cat)
    apply(select(every, ["fix-c"]), root, explicit=True)  # brings fix-a
    apply(select(every, ["fix-b"]), root, explicit=True)
    assert "z = 1" in (root / "vllm" / "x.py").read_text() and "w = 1" in (root / "vllm" / "other.py").read_text()
