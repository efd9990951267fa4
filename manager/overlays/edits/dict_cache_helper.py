"""The runtime helper the dict-cache edit inserts into a target module (manager.overlays.edits.dictcache).

The function below is inserted from this file's source, byte for byte, after the target's
imports; it is also imported by the tests, which check that it behaves as functools.cache /
lru_cache do. It must stay self-contained: it runs inside vLLM, where this package is absent.
"""


def _overlay_dict_cache(fn=None, *, maxsize=None):
    """Plain-dict memoisation in place of functools.cache / lru_cache.

    Same results, computed once per key (positional and keyword arguments), but
    written in Python so torch.compile / Dynamo can trace through it (the C-level
    _lru_cache_wrapper breaks CUDA-graph capture). With maxsize the oldest entry
    is evicted first (FIFO, not LRU): the bound is kept, the recency order is not.
    """
    if fn is None:
        return lambda f: _overlay_dict_cache(f, maxsize=maxsize)
    import functools as _functools

    _cache = {}
    _kwargs_mark = object()  # keeps f(x=1) apart from f((), (("x", 1),)), as functools does

    @_functools.wraps(fn)
    def _wrapper(*args, **kwargs):
        key = (*args, _kwargs_mark, *sorted(kwargs.items())) if kwargs else args
        if key in _cache:
            return _cache[key]
        value = fn(*args, **kwargs)
        if maxsize is not None:
            if maxsize <= 0:  # lru_cache(maxsize=0) caches nothing
                return value
            if len(_cache) >= maxsize:
                _cache.pop(next(iter(_cache)))
        _cache[key] = value
        return value

    _wrapper.cache_clear = _cache.clear
    _wrapper.cache_size = lambda: len(_cache)
    return _wrapper
