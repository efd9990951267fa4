"""`overlay inspect`: a checkpoint's config.json and safetensors headers (never its tensor data)."""

from __future__ import annotations

from .core import ClassBytes, Inspection, ShardInfo, TpSplit, WeightBytes, inspect_checkpoint
from .headers import DTYPE_BITS, Shard, TensorEntry, header_bytes, parse_header, read_shard
from .layout import EngineCheck, Failure, Finding
from .quant import QuantGroup, QuantScheme
from .source import HttpSource, LocalSource, Source, open_source
from .tensors import RULES, Placement, classify, rank_bytes

__all__ = [
    "DTYPE_BITS",
    "RULES",
    "ClassBytes",
    "EngineCheck",
    "Failure",
    "Finding",
    "HttpSource",
    "Inspection",
    "LocalSource",
    "Placement",
    "QuantGroup",
    "QuantScheme",
    "Shard",
    "ShardInfo",
    "Source",
    "TensorEntry",
    "TpSplit",
    "WeightBytes",
    "classify",
    "header_bytes",
    "inspect_checkpoint",
    "open_source",
    "parse_header",
    "rank_bytes",
    "read_shard",
]
