"""gemma4-mtp-cpu-kv-sharing: the Gemma-4 MTP drafter must not write into the target's KV cache on CPU.

On the real 0.22.0-0.26.0 sources, Gemma4Proposer._setup_gemma4_kv_sharing sets the KV-sharing target on
the drafter's Attention layers only, after their CPU impls were built with none, and the CPU impl's forward
writes K/V whenever its own attribute is None. The patched function (run here on stand-in layers) sets the
impl's attribute too. Status on the real sdists; fits() needs it only on the CPU backend. The served A/B
(NaN-filled uninitialised memory: NaN logprobs without it, the target's reference with it) is in
tests/testing/test_real_engine_ab.py.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from manager.catalog import Catalog
from manager.fits.overlays import DeploymentFacts, matches
from manager.overlays import apply, load_overlays, status_on_release
from tests.helpers import REPO_ROOT
from tests.helpers.catalogs import shipped_catalog, slim_root
from tests.overlays.shipped.extracted import extract_def

KV = "gemma4-mtp-cpu-kv-sharing"
PROPOSER_PY = "vllm/v1/spec_decode/gemma4.py"
CPU_ATTN_PY = "vllm/v1/attention/backends/cpu_attn.py"
STATUS = {"0.20.0": "not-applicable", "0.22.0": "pending", "0.24.0": "pending", "0.26.0": "pending",
          "0.27.1": "upstream", "0.28.0": "upstream", "0.33.0": "upstream"}


def _patched(version: str, tmp: Path) -> Path:
    root = slim_root(version, tmp / f"site-{version}", (PROPOSER_PY, CPU_ATTN_PY))
    res = apply(load_overlays(shipped_catalog(tmp / f"cat-{version}", ids=[KV])), root)
    assert res.statuses.by_id(KV).status == "applied"
    return root


class _Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, msg: str, *args: Any) -> None:
        self.lines.append(msg % args)

    warning = info


def _setup(source: str):
    """Gemma4Proposer._setup_gemma4_kv_sharing of `source`, bound to a stand-in proposer whose drafter has one
    sliding and one full layer, each an Attention stand-in holding a CPU-impl stand-in built with no target."""
    ns: dict[str, Any] = {"defaultdict": defaultdict, "logger": _Log()}
    exec(compile(extract_def(source, "Gemma4Proposer._setup_gemma4_kv_sharing"), "<extracted>", "exec"), ns)
    target_types = ["sliding_attention", "full_attention"] * 3
    text = SimpleNamespace(layer_types=target_types, num_kv_shared_layers=0)
    draft = SimpleNamespace(layer_types=["sliding_attention", "full_attention"])
    layers = [SimpleNamespace(self_attn=SimpleNamespace(attn=SimpleNamespace(
        kv_sharing_target_layer_name=None, impl=SimpleNamespace(kv_sharing_target_layer_name=None)))) for _ in range(2)]
    proposer = SimpleNamespace(
        speculative_config=SimpleNamespace(draft_model_config=SimpleNamespace(
            hf_config=SimpleNamespace(get_text_config=lambda: draft))),
        vllm_config=SimpleNamespace(model_config=SimpleNamespace(hf_config=SimpleNamespace(get_text_config=lambda: text))),
        model=SimpleNamespace(model=SimpleNamespace(layers=layers)))
    names = {f"model.layers.{i}.self_attn.attn" for i in range(len(target_types))}
    ns["_setup_gemma4_kv_sharing"](proposer, names)
    return [layer.self_attn.attn for layer in layers]


@pytest.fixture(scope="module", params=["0.22.0", "0.26.0"])
def release(request, pristine_release, tmp_path_factory):
    v = request.param
    pristine = pristine_release(v)
    return v, pristine, _patched(v, tmp_path_factory.mktemp("kv"))


def test_unpatched_setup_leaves_the_cpu_impl_writing(release):
    _, pristine, _ = release
    attns = _setup((pristine / PROPOSER_PY).read_text())
    assert [a.kv_sharing_target_layer_name for a in attns] == ["model.layers.4.self_attn.attn",
                                                              "model.layers.5.self_attn.attn"]
    assert [a.impl.kv_sharing_target_layer_name for a in attns] == [None, None]
    # ... and the release's CPU impl writes K/V in its forward exactly when its own attribute is None
    forward = extract_def((pristine / CPU_ATTN_PY).read_text(), "CPUAttentionBackendImpl.forward")
    assert re.search(r"if \(\s*self\.kv_sharing_target_layer_name is None\s+and key is not None", forward)


def test_patched_setup_gives_the_impl_the_layers_target(release):
    _, _, root = release
    attns = _setup((root / PROPOSER_PY).read_text())
    assert [a.impl.kv_sharing_target_layer_name for a in attns] == [a.kv_sharing_target_layer_name for a in attns] \
        == ["model.layers.4.self_attn.attn", "model.layers.5.self_attn.attn"]


def test_patched_setup_tolerates_a_layer_without_an_impl(release):
    _, _, root = release
    source = (root / PROPOSER_PY).read_text()
    ns: dict[str, Any] = {"attn": SimpleNamespace(kv_sharing_target_layer_name=None), "target_layer_name": "t"}
    snippet = (REPO_ROOT / "overlays" / KV / "snippets" / "impl_kv_sharing.py").read_text()
    exec(compile(snippet, "<snippet>", "exec"), ns)   # no AttributeError: getattr(attn, "impl", None) is None
    assert "attn.impl.kv_sharing_target_layer_name = target_layer_name" in source


@pytest.mark.parametrize("version", sorted(STATUS))
def test_status_on_real_releases(version, pristine_release):
    src = pristine_release(version) / CPU_ATTN_PY
    forward = extract_def(src.read_text(), "CPUAttentionBackendImpl.forward")
    native = re.search(r"if is_encoder_attention:\s*ops\.cpu_attn_reshape_and_cache", forward) is not None
    assert native == (STATUS[version] == "upstream")
    assert status_on_release(version, Catalog(REPO_ROOT), ids=[KV]).by_id(KV).status == STATUS[version]


@pytest.mark.parametrize("device,drafter,needed", [("cpu", "gemma4_mtp", True), ("cuda", "gemma4_mtp", False),
                                                   ("cpu", None, False)])
def test_needed_only_on_the_cpu_backend_with_the_mtp_drafter(device, drafter, needed):
    from manager.overlays import load_manifest

    nw = load_manifest(REPO_ROOT / "overlays" / KV / "overlay.yaml").needed_when
    d = DeploymentFacts(family="gemma4", weight_format="bf16", quant_method=None, sm=0.0 if device == "cpu" else 7.0,
                        head_dims=(256, 512), transformers="5.24.0", moe=True, drafter_model_type=drafter, device=device)
    assert matches(nw, d) is needed
