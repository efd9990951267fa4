"""libcst matchers for the engine, without building the whole generated `libcst.matchers` package.

Sentinels and decorator shapes are detected with libcst's matchers (the house rule). Importing
`libcst.matchers` builds its ~175 generated matcher dataclasses with large typing Unions: about
0.18 s on the 2-CPU box, a fifth of a first `overlay apply` without a prepared plan, for the six
matcher classes the engine uses. Here libcst's own matching machinery
(`libcst.matchers._matcher_base`: `matches`, `MatchRegex`, `DoNotCare`, `BaseMatcherNode`) is
loaded on its own, and each matcher class is derived from its libcst node as libcst's generator
derives it: one field per public node field plus `metadata`, every default `DoNotCare()`
(tests/overlays/edits/test_edit_kinds.py checks the rule against every generated class, and `matches` on both).
`matches` compares a node with a matcher by class name and fields, so these classes and the
generated ones are interchangeable.

When `libcst.matchers` is already imported, or its private layout is not what this expects
(another libcst), the generated package is used. Any other name falls through to it as well.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys

_BASE = "libcst.matchers._matcher_base"
_MACHINERY = ("matches", "MatchRegex", "DoNotCare")  # from _matcher_base itself
_CLASSES = ("Attribute", "Comment", "EmptyLine", "Expr", "Name", "SimpleString")
_cache: dict[str, object] = {}


def full():
    """`libcst.matchers` itself, imported without a signature docstring for each of its classes.

    For a class without a docstring, `dataclasses` writes one from `str(inspect.signature(cls))`,
    which formats every annotation (~20% of this import), and nothing reads those docstrings. For
    this one import `inspect.signature` returns an empty signature, so each class's docstring is
    its name + "()". (It must not raise: Python 3.11.2's dataclasses, Debian 12's python3, does
    not catch the error; 3.11.7 does.) The function is put back before the import returns.
    Already imported (a test process, a caller that imported it first): nothing is patched."""
    if "libcst.matchers" in sys.modules:
        return sys.modules["libcst.matchers"]
    import inspect

    real = inspect.signature

    def no_signature(*args, **kwargs):
        return inspect.Signature()

    inspect.signature = no_signature  # type: ignore[assignment]
    try:
        import libcst.matchers
    finally:
        inspect.signature = real
    return libcst.matchers


def _base():
    """libcst's matcher machinery module, loaded from its file when the package is not imported.
    Registered under its own name, so a later `import libcst.matchers` reuses it (one
    BaseMatcherNode, one DoNotCare)."""
    if _BASE in sys.modules:
        return sys.modules[_BASE]
    import libcst

    path = os.path.join(os.path.dirname(libcst.__file__), "matchers", "_matcher_base.py")
    spec = importlib.util.spec_from_file_location(_BASE, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: no module spec")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[_BASE] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[_BASE]
        raise
    return mod


def derived(name: str, base) -> type:
    """The matcher class for libcst node `name`, as libcst's generator writes it."""
    import libcst as cst

    node = getattr(cst, name)
    fields = [f.name for f in dataclasses.fields(node) if not f.name.startswith("_")] + ["metadata"]
    cls = dataclasses.make_dataclass(
        name, [(f, object, dataclasses.field(default=base.DoNotCare())) for f in fields],
        bases=(base.BaseMatcherNode,), frozen=True, eq=False, namespace={"__doc__": f"{name}()"})
    cls.__module__ = __name__
    return cls


def _lean() -> dict[str, object]:
    if not _cache:
        names = (*_MACHINERY, *_CLASSES)
        try:
            if "libcst.matchers" in sys.modules:  # already paid for: use it
                _cache.update({n: getattr(sys.modules["libcst.matchers"], n) for n in names})
            else:
                base = _base()
                _cache.update({n: getattr(base, n) for n in _MACHINERY})
                _cache.update({c: derived(c, base) for c in _CLASSES})
        except (ImportError, AttributeError, TypeError, OSError):
            _cache.clear()
            gen = full()
            _cache.update({n: getattr(gen, n) for n in names})
    return _cache


def __getattr__(name: str):
    lean = _lean()
    if name in lean:
        return lean[name]
    return getattr(full(), name)
