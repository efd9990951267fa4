"""Synthetic ELF files with a `.nv_fatbin` section, built from the documented header layout
(manager/engines/fatbin.py's docstring), for the parser's unit tests and the audit's CLI tests."""

from __future__ import annotations

import io
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

MAGIC = 0xBA55ED50


@dataclass(frozen=True)
class FakeEntry:
    kind: str  # "sass" | "ptx"
    sm: int
    flags: int = 0x11
    payload: bytes = b""
    compressed_size: int = 0
    uncompressed_size: int = 0


def cubin(tu: str | None) -> bytes:
    """A stand-in cubin: an ELF magic and, when `tu` is given, one nvcc-style internal symbol."""
    body = b"\x7fELF\x02\x01\x01\x33" + b"\0" * 56
    if tu:
        body += b"\0_ZN55_INTERNAL_1a2b3c4d_%d_%s_7672d19f4cuda3std6ignoreE\0" % (len(tu), tu.encode())
    return body


def entry(e: FakeEntry) -> bytes:
    kind = 2 if e.kind == "sass" else 1
    header = struct.pack("<HHIQIIHHIIIQQQ", kind, 0x0101, 64, len(e.payload), e.compressed_size, 0, 7, 1, e.sm,
                         0, 0, e.flags, 0, e.uncompressed_size)
    return header + e.payload


def container(entries: list[FakeEntry]) -> bytes:
    body = b"".join(entry(e) for e in entries)
    return struct.pack("<IHHQ", MAGIC, 1, 16, len(body)) + body


def pad8(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 8)


def elf(section: bytes | None, name: str = ".nv_fatbin") -> bytes:
    """A minimal ELF64 LE file: null section, `name` holding `section` (if any), .shstrtab."""
    shstr = b"\0" + name.encode() + b"\0.shstrtab\0"
    data_off = 64
    body = pad8(section or b"")
    str_off = data_off + len(body)
    sh_off = str_off + len(pad8(shstr))
    secs = [struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)]
    if section is not None:
        secs.append(struct.pack("<IIQQQQIIQQ", 1, 1, 2, 0, data_off, len(section), 0, 0, 8, 0))
    secs.append(struct.pack("<IIQQQQIIQQ", len(name) + 2, 3, 0, 0, str_off, len(shstr), 0, 0, 1, 0))
    head = bytearray(64)
    head[:8] = b"\x7fELF\x02\x01\x01\x00"
    struct.pack_into("<Q", head, 0x28, sh_off)
    struct.pack_into("<HHH", head, 0x3A, 64, len(secs), len(secs) - 1)
    struct.pack_into("<H", head, 0x34, 64)
    return bytes(head) + body + pad8(shstr) + b"".join(secs)


def fatbin_elf(tus: list[tuple[str | None, list[FakeEntry]]]) -> bytes:
    """An ELF whose `.nv_fatbin` holds one container per (tu name, entries); SASS entries
    without a payload get a stand-in cubin naming the TU."""
    parts = []
    for name, entries in tus:
        filled = [FakeEntry(e.kind, e.sm, e.flags, cubin(name) if e.kind == "sass" and not e.payload else e.payload,
                            e.compressed_size, e.uncompressed_size) for e in entries]
        parts.append(pad8(container(filled)))
    return elf(b"".join(parts))


def sass(*sms: int) -> list[FakeEntry]:
    return [FakeEntry("sass", sm) for sm in sms]


def wheel(path: Path, members: dict[str, bytes], name: str = "fake_engine-1.0") -> Path:
    """A zip with `members` and a `<name>.dist-info/WHEEL`, as `pip` would see a wheel."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: false\nTag: py3-none-any\n")
        for arc, data in members.items():
            zf.writestr(arc, data)
    return path


def engine_so(sm_core: tuple[int, ...]) -> bytes:
    """A fake vllm/_C.abi3.so: the needed core TUs with SASS for `sm_core`, Marlin sm75+ only,
    flash-attn style sm80 TU."""
    return fatbin_elf([
        ("cache_kernels_cu", sass(*sm_core)),
        ("layernorm_kernels_cu", sass(*sm_core)),
        ("marlin_cu", sass(75, 80)),
        ("selective_scan_fwd_cu", sass(80)),
    ])


def buffer(data: bytes) -> io.BytesIO:
    return io.BytesIO(data)
