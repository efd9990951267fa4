"""safetensors headers: 8-byte little-endian length N, then N bytes of JSON. Nothing else is read.

Format (https://github.com/huggingface/safetensors, README "Format"): the JSON maps tensor
names to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the byte after
the header), plus an optional "__metadata__" string map. Offsets must tile the data region
without holes or overlaps, and end - begin must equal the element count times the dtype size.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field

from ..errors import InspectError
from ..jsonread import parse_json
from .source import Source

# Bits per element of every safetensors dtype (safetensors 0.6+ adds F4/F6/E8M0 sub-byte types).
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "C64": 64,
    "F64": 64, "I64": 64, "U64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}
MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit (N_MAX_HEADER)


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # offset in the data region
    end: int
    file: str = ""
    nbytes: int = 0  # end - begin (set by parse_header)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Shard:
    file: str
    header_len: int  # N (the JSON part)
    data_bytes: int  # end of the last tensor
    file_size: int | None
    tensors: tuple[TensorEntry, ...]
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def data_start(self) -> int:
        return 8 + self.header_len

    @property
    def truncated(self) -> bool:
        """The file is shorter than its header says (an interrupted download, or a header-only file)."""
        return self.file_size is not None and self.file_size < self.data_start + self.data_bytes


def expected_nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    return (math.prod(shape) * DTYPE_BITS[dtype] + 7) // 8


def parse_header(file: str, raw: bytes, *, where: str, file_size: int | None = None) -> Shard:
    """Validate one header's JSON text (already read) and return its tensors, sorted by offset."""
    obj = parse_json(raw, f"{where}: header", InspectError)  # bounded by the caller (MAX_HEADER_BYTES)
    if not isinstance(obj, dict):
        raise InspectError(f"{where}: header: {type(obj).__name__}: must be a JSON object")
    meta = obj.pop("__metadata__", None) or {}
    if not isinstance(meta, dict):
        raise InspectError(f"{where}: __metadata__: {type(meta).__name__}: must be a string map")
    tensors: list[TensorEntry] = []
    for name, info in obj.items():
        if not isinstance(info, dict):
            raise InspectError(f"{where}: {name}: {type(info).__name__}: a tensor entry must be an object")
        dtype, shape, offs = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in DTYPE_BITS:
            raise InspectError(f"{where}: {name}.dtype: {dtype!r}: unknown safetensors dtype")
        if type(shape) is not list or not all(type(d) is int and d >= 0 for d in shape):
            raise InspectError(f"{where}: {name}.shape: {shape!r}: must be a list of non-negative integers")
        if (not isinstance(offs, list) or len(offs) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs)
                or offs[0] < 0 or offs[1] < offs[0]):
            raise InspectError(f"{where}: {name}.data_offsets: {offs!r}: must be [begin, end] with 0 <= begin <= end")
        need = expected_nbytes(dtype, tuple(shape))
        if offs[1] - offs[0] != need:
            raise InspectError(f"{where}: {name}.data_offsets: {offs}: {offs[1] - offs[0]} bytes, "
                               f"but {dtype} x {shape} needs {need}")
        tensors.append(TensorEntry(name, dtype, tuple(shape), offs[0], offs[1], file, offs[1] - offs[0]))
    tensors.sort(key=lambda t: (t.begin, t.end))
    pos = 0
    for t in tensors:
        if t.begin != pos:
            what = "overlaps the previous tensor" if t.begin < pos else f"leaves a hole of {t.begin - pos} bytes"
            raise InspectError(f"{where}: {t.name}.data_offsets: [{t.begin}, {t.end}]: {what}")
        pos = t.end
    return Shard(file, len(raw), pos, file_size, tuple(tensors), {str(k): str(v) for k, v in meta.items()})


def read_shard(source: Source, file: str) -> Shard:
    """Read exactly 8 + N bytes of `file` from `source` and parse them."""
    where = source.where(file)
    size = source.size(file)
    head = source.read(file, 0, 8)
    if len(head) < 8:
        raise InspectError(f"{where}: {len(head)} bytes: not a safetensors file (the header length needs 8)")
    (n,) = struct.unpack("<Q", head)
    if n > MAX_HEADER_BYTES:
        raise InspectError(
            f"{where}: header length {n}: over the {MAX_HEADER_BYTES}-byte limit (not a safetensors file?)"
        )
    if size is not None and 8 + n > size:
        raise InspectError(f"{where}: header length {n}: the file has only {size} bytes")
    raw = source.read(file, 8, n)
    if len(raw) < n:
        raise InspectError(f"{where}: header length {n}: only {len(raw)} bytes could be read")
    return parse_header(file, raw, where=where, file_size=size)


def header_bytes(tensors: dict[str, dict[str, object]], metadata: dict[str, str] | None = None) -> bytes:
    """Encode a header (8-byte length + JSON, padded with spaces to 8 bytes as the library does)."""
    obj: dict[str, object] = {}
    if metadata:
        obj["__metadata__"] = metadata
    obj.update(tensors)
    text = json.dumps(obj, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text
