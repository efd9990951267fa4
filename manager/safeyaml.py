"""YAML for the catalog's hand-written files (manifests, profiles, the deployment registry).

`load(text)` is yaml.safe_load (libyaml when present) that refuses duplicate mapping keys (safe_load
keeps the last value without a word) and aliases: an anchor used twice
lets a few hundred bytes expand into gigabytes of lists ("billion laughs": > 60 s and 6 GB for a
manifest before this), and the catalog's files never need them. An invalid date (`2026-02-30`)
is a YAML error naming the value and its line instead of a bare ValueError. Errors are
yaml.YAMLError subclasses with a problem_mark, so every caller's existing YAML error line applies.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError, SafeConstructor

_Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_Base):  # type: ignore[misc, valid-type]
    pass


def _timestamp(loader: Any, node: yaml.ScalarNode) -> Any:
    try:
        return SafeConstructor.construct_yaml_timestamp(loader, node)
    except ValueError as exc:
        raise ConstructorError(None, None, f"invalid date {node.value!r} ({exc})", node.start_mark) from None


_Loader.add_constructor("tag:yaml.org,2002:timestamp", _timestamp)


def _refuse_aliases(root: yaml.Node) -> None:
    """A node reached twice was referenced by an alias (the composer shares the anchored node)."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            raise ConstructorError(
                None, None, "YAML aliases (*name) are refused in catalog files (anchors can expand "
                "exponentially); write the value out", node.start_mark,
            )
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys: set[tuple[str, str]] = set()
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode):
                    if (k.tag, k.value) in keys:  # yaml.safe_load would keep the last value silently
                        raise ConstructorError(None, None, f"duplicate key {k.value!r}", k.start_mark)
                    keys.add((k.tag, k.value))
                stack.extend((k, v))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)


def load(text: str) -> Any:
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_aliases(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()
