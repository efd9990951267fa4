"""The dict-cache edit's runtime helper, imported as the code it is (it is inserted from this source)."""

from __future__ import annotations

from manager.overlays.edits.dict_cache_helper import _overlay_dict_cache
from manager.overlays.edits.dictcache import HELPER_CODE, HELPER_NAME


def test_the_inserted_code_is_the_helper_file_function():
    assert HELPER_CODE.startswith(f"\ndef {HELPER_NAME}(fn=None, *, maxsize=None):\n")
    ns: dict = {}
    exec(HELPER_CODE, ns)  # self-contained: runs without this package
    assert ns[HELPER_NAME].__doc__ == _overlay_dict_cache.__doc__


def test_memoises_per_positional_and_keyword_arguments():
    calls = []

    @_overlay_dict_cache
    def f(*args, **kwargs):
        calls.append((args, kwargs))
        return len(calls)

    assert f(1) == f(1) == 1
    assert f(x=1) == 2 and f(x=1) == 2
    assert f((), (("x", 1),)) == 3  # not confused with f(x=1)
    assert f.cache_size() == 3
    f.cache_clear()
    assert f(1) == 4


def test_maxsize_bounds_the_cache_first_in_first_out_and_zero_caches_nothing():
    calls = []

    @_overlay_dict_cache(maxsize=2)
    def g(x):
        calls.append(x)
        return x

    for x in (1, 2, 1, 3, 1):
        g(x)
    assert calls == [1, 2, 3, 1]  # 1 evicted first when 3 came in, although it was used last
    assert g.cache_size() == 2

    @_overlay_dict_cache(maxsize=0)
    def h(x):
        calls.append(x)
        return x

    h(5), h(5)
    assert calls[-2:] == [5, 5] and h.cache_size() == 0
