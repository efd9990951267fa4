"""Issue 28 point 13: inputs deeper than a recursive parser's stack are one line, not exit 3:
a target CPython compiles but libcst cannot walk (a 600-term sum, a list nested 180 deep, on the
real vLLM 0.20.0 cuda.py), and a 1200-long `requires` chain in a catalog."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from manager.catalog import Catalog
from manager.errors import OverlayError
from manager.overlays import apply, load_overlays, select, status
from tests.helpers.catalogs import CUDA_PY, DYNAMO, shipped_catalog_dir, tree_hashes

VERSION = "0.20.0"


@pytest.fixture(scope="module")
def catalog_dir(tmp_path_factory) -> Path:
    return shipped_catalog_dir(tmp_path_factory.mktemp("catalog"), ids=(DYNAMO,))


@pytest.mark.parametrize("deep", ["X = " + " + ".join(["1"] * 600) + "\n", "Y = " + "[" * 180 + "]" * 180 + "\n"],
                         ids=["600-term-sum", "list-180-deep"])
def test_a_target_too_deep_for_libcst_is_an_error_naming_it_and_nothing_is_written(vllm_root, catalog_dir, deep):
    root = vllm_root(VERSION)
    target = root / CUDA_PY
    target.write_bytes(target.read_bytes() + deep.encode())
    compile(target.read_text(), CUDA_PY, "exec")  # valid Python
    every = select(load_overlays(Catalog(catalog_dir)), [DYNAMO])
    report = status(every, root, use_ledger=False)  # the inspection walks less deep: no crash either way
    (t,) = report.overlays[0].targets
    assert t.status in ("pending", "error"), t
    if t.status == "error":
        assert "nested too deeply" in t.detail
    before = tree_hashes(root)
    with pytest.raises(OverlayError, match=f"{CUDA_PY}.*nested too deeply"):
        apply(every, root)
    assert tree_hashes(root, without_state=True) == {k: v for k, v in before.items() if not k.startswith(".overlay-manager")}


def test_a_1200_long_requires_chain_loads_in_order(tmp_path):
    from tests.overlays.test_manifest import VALID

    n = 1200
    for i in range(n):
        d = tmp_path / "overlays" / f"o{i:04d}"
        d.mkdir(parents=True)
        (d / "snip.py").write_text("y = 1\n")
        data = dict(VALID, id=f"o{i:04d}")
        if i < n - 1:  # o0000 needs o0001 needs ... : visiting o0000 first walks the whole chain
            data["requires"] = [f"o{i + 1:04d}"]
        (d / "overlay.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    got = load_overlays(Catalog(tmp_path))
    assert [o.id for o in got] == [f"o{i:04d}" for i in reversed(range(n))]


def test_a_requires_cycle_is_named_with_its_members(tmp_path):
    from tests.overlays.test_manifest import VALID

    for i, req in ((0, 1), (1, 2), (2, 1)):
        d = tmp_path / "overlays" / f"c{i}"
        d.mkdir(parents=True)
        (d / "snip.py").write_text("y = 1\n")
        (d / "overlay.yaml").write_text(yaml.safe_dump(dict(VALID, id=f"c{i}", requires=[f"c{req}"]), sort_keys=False))
    with pytest.raises(OverlayError, match="overlay requires cycle: c1 -> c2 -> c1"):
        load_overlays(Catalog(tmp_path))
