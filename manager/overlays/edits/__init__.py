"""Edit kinds: reusable, separately tested building blocks the overlay engine drives."""

from __future__ import annotations

from collections.abc import Callable

from .base import Edit, EditContext, EditFailed, EditState, Inspection
from .dictcache import DictCache
from .python import DictEntry, InsertStatements, PythonEdit, SetValue
from .release import ReleaseFile
from .text import NewFile, TextEdit, TextInsert

_PYTHON: dict[str, Callable[..., Edit]] = {
    "insert": InsertStatements, "dict-entry": DictEntry, "set-value": SetValue, "dict-cache": DictCache
}
_TEXT: dict[str, Callable[..., Edit]] = {"new-file": NewFile, "text-insert": TextInsert, "release-file": ReleaseFile}


def make_edit(spec, ctx: EditContext, target: str) -> Edit:
    """Instantiate the edit kind for one manifest edit on one target file."""
    if spec.kind in _PYTHON:
        if not target.endswith(".py"):
            raise EditFailed(f"edit {spec.name}: {spec.kind} needs a .py target, got {target}")
        return _PYTHON[spec.kind](spec, ctx)
    return _TEXT[spec.kind](spec, ctx, target)


__all__ = [
    "DictCache",
    "DictEntry",
    "Edit",
    "EditContext",
    "EditFailed",
    "EditState",
    "InsertStatements",
    "Inspection",
    "NewFile",
    "PythonEdit",
    "ReleaseFile",
    "SetValue",
    "TextEdit",
    "TextInsert",
    "make_edit",
]
