"""vllm-pr40411-gemma4-mm-embedder-prenorm (issue 24, point 3): the Gemma-4 multimodal embedder's norm order on 0.19.x.

On the real release sdists: status per release (pending on 0.19.0/0.19.1, `upstream` from 0.20.0, following
the release's own source); applied on 0.19.0 and 0.19.1 the file compiles, a second apply writes nothing and
revert restores every byte. Behaviour: `Gemma4MultimodalEmbedder` pulled out of the real 0.19.1 file runs on CPU
torch (vLLM's RMSNorm / ReplicatedLinear replaced by plain torch stand-ins with their semantics) against
transformers' own `Gemma4MultimodalEmbedder` with the same weights: unpatched it differs (the bug), patched it
equals transformers and 0.20.0's native class, with the same (weight) keys as before.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from manager.catalog import Catalog
from manager.overlays import apply, load_overlays, revert, status, status_on_release
from tests.helpers import REPO_ROOT
from tests.helpers.catalogs import file_hashes, shipped_catalog, slim_root
from tests.overlays.shipped.extracted import extract_def, run_extracted

EMB = "vllm-pr40411-gemma4-mm-embedder-prenorm"
MM_PY = "vllm/model_executor/models/gemma4_mm.py"
STATUS = {"0.19.0": "pending", "0.19.1": "pending", "0.20.0": "upstream", "0.22.0": "upstream"}


def _native(source: str) -> bool:
    """The release's own forward normalises the soft tokens before the projection."""
    fwd = extract_def(source, "Gemma4MultimodalEmbedder.forward")
    return "self.embedding_pre_projection_norm(inputs_embeds)" in fwd


@pytest.mark.parametrize("version", sorted(STATUS))
def test_status_on_real_releases_follows_the_release_source(version, pristine_release):
    native = _native((pristine_release(version) / MM_PY).read_text())
    assert native == (STATUS[version] == "upstream")
    rep = status_on_release(version, Catalog(REPO_ROOT), ids=[EMB])
    assert rep.by_id(EMB).status == STATUS[version]


@pytest.fixture(scope="module")
def overlays(tmp_path_factory):
    return load_overlays(shipped_catalog(tmp_path_factory.mktemp("cat"), ids=[EMB]))


@pytest.mark.parametrize("version", ["0.19.0", "0.19.1"])
def test_apply_compiles_is_idempotent_and_reverts_byte_exact(version, overlays, tmp_path):
    root = slim_root(version, tmp_path, rels=[MM_PY])
    original = file_hashes(root, [MM_PY])
    result = apply(overlays, root)
    assert [c.path for c in result.changes] == [MM_PY]
    assert result.statuses.by_id(EMB).status == "applied"
    text = (root / MM_PY).read_text()
    compile(text, MM_PY, "exec", dont_inherit=True)
    assert text.count(f"# overlay:{EMB} v1 pre-norm-module ") == 1
    assert text.count(f"# overlay:{EMB} v1 pre-norm-forward ") == 1
    assert apply(overlays, root).changes == ()
    assert status(overlays, root, use_ledger=False).by_id(EMB).status == "applied"
    revert(overlays, overlays, root)
    assert file_hashes(root, [MM_PY]) == original
    assert status(overlays, root).by_id(EMB).status == "pending"


# --- behaviour on CPU torch ------------------------------------------------------------------------

def _stand_ins():
    """vLLM's RMSNorm (has_weight=False: x * rsqrt(mean(x^2) + eps) in float32) and ReplicatedLinear
    (returns (output, bias)) as plain torch modules."""
    import torch
    from torch import nn

    class RMSNorm(nn.Module):
        def __init__(self, hidden_size, eps=1e-6, has_weight=True):
            super().__init__()
            assert not has_weight  # the embedder only uses the scale-free norm
            self.hidden_size, self.eps = hidden_size, eps

        def forward(self, x):
            assert x.shape[-1] == self.hidden_size, (x.shape, self.hidden_size)
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    class ReplicatedLinear(nn.Module):
        def __init__(self, input_size, output_size, bias=True):
            super().__init__()
            self.weight = nn.Parameter(torch.empty(output_size, input_size))
            assert not bias

        def forward(self, x):
            return nn.functional.linear(x, self.weight), None

    return RMSNorm, ReplicatedLinear


def _embedder_class(source: str):
    import torch
    from torch import nn

    RMSNorm, ReplicatedLinear = _stand_ins()
    ns = {"torch": torch, "nn": nn, "RMSNorm": RMSNorm, "ReplicatedLinear": ReplicatedLinear,
          "Gemma4VisionConfig": object, "Gemma4AudioConfig": object, "Gemma4TextConfig": object}
    return run_extracted(extract_def(source, "Gemma4MultimodalEmbedder"), ns)["Gemma4MultimodalEmbedder"]


@pytest.fixture(scope="module")
def classes(pristine_release, tmp_path_factory, overlays):
    pytest.importorskip("torch")
    pytest.importorskip("transformers.models.gemma4.modeling_gemma4")
    root = slim_root("0.19.1", tmp_path_factory.mktemp("site"), rels=[MM_PY])
    apply(overlays, root)
    return {
        "unpatched": _embedder_class((pristine_release("0.19.1") / MM_PY).read_text()),
        "patched": _embedder_class((root / MM_PY).read_text()),
        "native-0.20.0": _embedder_class((pristine_release("0.20.0") / MM_PY).read_text()),
    }


# vision: the tower's hidden_size (768 on the 26B-A4B); audio: output_proj_dims (1536) over hidden_size (1024)
TOWERS = {
    "vision": SimpleNamespace(hidden_size=48, rms_norm_eps=1e-6),
    "audio": SimpleNamespace(hidden_size=32, output_proj_dims=40, rms_norm_eps=1e-6),
}


@pytest.mark.parametrize("tower", sorted(TOWERS))
def test_patched_embedder_equals_transformers_and_0_20_0_and_unpatched_does_not(classes, tower):
    import torch
    from transformers.models.gemma4.modeling_gemma4 import Gemma4MultimodalEmbedder as HFEmbedder

    mm, text = TOWERS[tower], SimpleNamespace(hidden_size=64)
    width = getattr(mm, "output_proj_dims", None) or mm.hidden_size
    torch.manual_seed(0)
    ref = HFEmbedder(mm, text).eval()
    with torch.no_grad():
        ref.embedding_projection.weight.copy_(torch.randn(64, width) * 0.1)
    x = torch.randn(3, 7, width) * 5 + 1  # soft tokens far from unit RMS: the two orders differ
    with torch.no_grad():
        want = ref(x)
        got = {}
        for name, cls in classes.items():
            m = cls(mm, text).eval()
            assert set(m.state_dict()) == {"embedding_projection.weight"}  # the checkpoint keys are unchanged
            m.embedding_projection.weight.copy_(ref.embedding_projection.weight)
            out = m(x)
            assert out.shape == want.shape == (3, 7, 64)
            got[name] = out
    assert torch.allclose(got["patched"], want, atol=1e-5, rtol=1e-5)
    assert torch.allclose(got["native-0.20.0"], want, atol=1e-5, rtol=1e-5)
    assert torch.equal(got["patched"], got["native-0.20.0"])
    # 0.19.1 as shipped: projection first, then a unit-RMS norm over the text width (the bug)
    assert (got["unpatched"] - want).abs().max() > 0.1
    rms = got["unpatched"].pow(2).mean(-1).sqrt()
    assert torch.allclose(rms, torch.ones_like(rms), atol=1e-3)
