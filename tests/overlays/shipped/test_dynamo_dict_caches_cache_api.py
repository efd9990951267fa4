"""dynamo-dict-caches keeps the functools cache API (issue 33 point 3): on the real vllm/platforms/cuda.py of 0.19.1
and 0.20.0, every dict cache the overlay installs answers cache_info(), cache_parameters(), cache_clear() and
__wrapped__ as the functools cache it replaced does, after the same calls.

The patched file's own helper and decorator expressions are executed (cuda.py itself needs CUDA kernels to import):
for each decorated function of the release, the unpatched decorator stack (functools) and the patched one (the
helper) wrap the same counting function.
"""

from __future__ import annotations

import ast
import functools

import pytest

from manager.overlays import apply, load_overlays
from tests.helpers.catalogs import CUDA_PY, DYNAMO, shipped_catalog, slim_root
from tests.overlays.shipped.extracted import extract_def, run_extracted

RELEASES = ("0.19.1", "0.20.0")
# the cache decorators of each release's cuda.py (0.20.0 adds `@lru_cache(maxsize=8)` on
# _cuda_device_count_stateless, which 0.19.1 does not cache there)
CACHES = {"0.19.1": 3, "0.20.0": 4}
CACHE_API = ("cache_info", "cache_parameters", "cache_clear", "__wrapped__")


@pytest.fixture(scope="module", params=RELEASES)
def sources(request, tmp_path_factory, pristine_release):
    version = request.param
    cat = shipped_catalog(tmp_path_factory.mktemp("cat"), ids=[DYNAMO])
    root = slim_root(version, tmp_path_factory.mktemp(f"site-{version}"))
    [overlay] = load_overlays(cat)
    result = apply([overlay], root)
    assert result.statuses.by_id(DYNAMO).status == "applied"
    return version, (pristine_release(version) / CUDA_PY).read_text(), (root / CUDA_PY).read_text()


def _cache_decorators(source: str) -> dict[str, str]:
    """qualname -> the source of its cache decorator (functools' or the overlay's)."""
    out = {}
    for node in ast.parse(source).body:
        defs = [(node.name, node)] if isinstance(node, ast.FunctionDef) else []
        if isinstance(node, ast.ClassDef):
            defs = [(f"{node.name}.{f.name}", f) for f in node.body if isinstance(f, ast.FunctionDef)]
        for q, f in defs:
            for d in f.decorator_list:
                text = ast.unparse(d)
                if "cache" in text and "nvml" not in text:
                    out[q] = text
    return out


def _wrapped(decorator: str, ns: dict, fn):
    return eval(decorator, ns)(fn)  # noqa: S307 - the release's / the patched file's own decorator expression


def test_every_installed_dict_cache_answers_the_functools_cache_api_like_the_cache_it_replaced(sources):
    version, unpatched, patched = sources
    before, after = _cache_decorators(unpatched), _cache_decorators(patched)
    assert sorted(before) == sorted(after) and len(before) == CACHES[version], version
    helper = run_extracted(extract_def(patched, "_overlay_dict_cache"), {})["_overlay_dict_cache"]
    ns_ref = {"cache": functools.cache, "lru_cache": functools.lru_cache, "functools": functools}
    ns_ours = {"_overlay_dict_cache": helper}
    # nine keys: the 9th evicts one from the maxsize=8 cache (FIFO: key 1, LRU: key 2), later calls hit keys both
    # still hold (the eviction order is the documented difference: the last test)
    calls = [(1,), (2,), (1,), (3,), (1,), (4,), (5,), (6,), (7,), (8,), (9,), (9,), (3,)]
    for q in before:
        assert after[q].startswith("_overlay_dict_cache"), (version, q, after[q])

        def raw(x):
            return x * 10

        ref, ours = _wrapped(before[q], ns_ref, raw), _wrapped(after[q], ns_ours, raw)
        for name in CACHE_API:
            assert hasattr(ours, name), (version, q, name)
        assert ours.__wrapped__ is raw and ref.__wrapped__ is raw
        assert ours.cache_parameters() == ref.cache_parameters(), (version, q)
        assert ours.cache_info() == ref.cache_info() == (0, 0, ref.cache_parameters()["maxsize"], 0)
        for i, args in enumerate(calls):
            assert ours(*args) == ref(*args)
            info, want = ours.cache_info(), ref.cache_info()
            # hits and misses as functools counts them, and the size
            assert (info.hits, info.misses, info.maxsize, info.currsize) == tuple(want), (version, q, i, info, want)
            assert type(info) is type(want)
        ours.cache_clear()
        ref.cache_clear()
        assert ours.cache_info() == ref.cache_info() == (0, 0, ref.cache_parameters()["maxsize"], 0)


def test_the_maxsize_8_cache_of_cuda_py_0_20_0_reports_its_bound(sources):
    version, _unpatched, patched = sources
    if version != "0.20.0":
        pytest.skip(f"{version}'s cuda.py has no bounded cache")
    helper = run_extracted(extract_def(patched, "_overlay_dict_cache"), {})["_overlay_dict_cache"]
    f = _wrapped(_cache_decorators(patched)["_cuda_device_count_stateless"], {"_overlay_dict_cache": helper},
                 lambda visible=None: len(visible or ""))
    assert f.cache_parameters() == {"maxsize": 8, "typed": False}
    for k in range(20):
        f(str(k))
    assert f.cache_info().currsize == 8 and f.cache_info().misses == 20, version


def test_the_bounded_dict_cache_evicts_first_in_first_out_where_lru_cache_keeps_the_recent_key(sources):
    """The documented difference (overlay.yaml's summary): the bound is kept, the recency order is not."""
    version, unpatched, patched = sources
    helper = run_extracted(extract_def(patched, "_overlay_dict_cache"), {})["_overlay_dict_cache"]
    ours, ref = helper(maxsize=2)(lambda x: x), functools.lru_cache(maxsize=2)(lambda x: x)
    for f in (ours, ref):
        for k in (1, 2, 1, 3, 1):
            f(k)
    assert tuple(ours.cache_info()) == (1, 4, 2, 2), version  # 3 evicted 1 (first in), so 1 missed again
    assert tuple(ref.cache_info()) == (2, 3, 2, 2)  # 3 evicted 2 (least recent), 1 hit
