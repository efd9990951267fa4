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
    The functools cache API is kept: cache_info() (hits, misses, maxsize, currsize),
    cache_parameters(), cache_clear() (also resets the counts) and __wrapped__.
    """
    if fn is None:
        return lambda f: _overlay_dict_cache(f, maxsize=maxsize)
    import functools as _functools

    _cache = {}
    _stats = [0, 0]  # hits, misses
    _kwargs_mark = object()  # keeps f(x=1) apart from f((), (("x", 1),)), as functools does
    if maxsize is not None and maxsize < 0:  # functools treats a negative maxsize as 0
        maxsize = 0

    @_functools.wraps(fn)
    def _wrapper(*args, **kwargs):
        key = (*args, _kwargs_mark, *sorted(kwargs.items())) if kwargs else args
        if key in _cache:
            _stats[0] += 1
            return _cache[key]
        _stats[1] += 1
        value = fn(*args, **kwargs)
        if maxsize is not None:
            if maxsize == 0:  # lru_cache(maxsize=0) caches nothing
                return value
            if len(_cache) >= maxsize:
                _cache.pop(next(iter(_cache)))
        _cache[key] = value
        return value

    def cache_clear():
        _cache.clear()
        _stats[0] = _stats[1] = 0

    _wrapper.cache_clear = cache_clear
    _wrapper.cache_info = lambda: _functools._CacheInfo(_stats[0], _stats[1], maxsize, len(_cache))
    _wrapper.cache_parameters = lambda: {"maxsize": maxsize, "typed": False}
    _wrapper.cache_size = lambda: len(_cache)
    _wrapper.__wrapped__ = fn  # functools.wraps sets it too; said here as the API callers rely on
    return _wrapper
