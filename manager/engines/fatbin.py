"""Read the CUDA architectures an ELF shared object carries, from its `.nv_fatbin` section.

Streaming and bounded: the ELF section table and each 16-byte container header / 64..N-byte
entry header are read with seek+read; payloads are skipped, except the few bytes needed to
name a translation unit (a cubin's `_INTERNAL_<hash>_<len>_<file>_cu_<hash>` symbols, the
names `cuobjdump --dump-elf-symbols` shows). Memory stays at a few MB whatever the file size
(libtorch_cuda.so is ~1 GB).

Layout (little-endian; measured on vLLM 0.19.1/0.20.0 and torch wheels from PyPI, the same
layout `cuobjdump` lists):

- container header, 16 bytes: u32 magic 0xBA55ED50, u16 version (1), u16 header size (16),
  u64 size of the entries that follow. An `.so` built without -rdc gets one container per
  translation unit (TU), concatenated (8-byte aligned) in the section.
- entry header, >= 64 bytes: u16 kind (1 = PTX, 2 = ELF/SASS), u16 (0x0101), u32 header size,
  u64 payload size, u32 compressed size, u32 (options offset), u16 minor, u16 major (code
  version), u32 SM number (70 = sm_70), u32 name offset, u32 name length, u64 flags,
  u64 (0), u64 uncompressed size. Flags: 0x1 64-bit, 0x2 debug, 0x10 linux, 0x2000 payload
  compressed with LZ4 (block format; CUDA 12 fatbins), 0x8000 payload compressed with zstd
  (CUDA 13 fatbins; the payload starts with the zstd frame magic 28 b5 2f fd),
  0x100000 architecture-specific code (`sm_90a`, `sm_100a`).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from typing import BinaryIO
from collections.abc import Iterator

from ..errors import ManagerError

MAGIC = 0xBA55ED50
KIND_PTX = 1
KIND_SASS = 2
FLAG_LZ4 = 0x2000
FLAG_ZSTD = 0x8000
FLAG_ARCH_SPECIFIC = 0x100000
CONTAINER_HEADER = struct.Struct("<IHHQ")
ENTRY_HEADER = struct.Struct("<HHIQIIHHIIIQQQ")
SECTION = ".nv_fatbin"
LARGE_DATA = (".ldata", ".lrodata")  # x86-64 large-model data sections, scanned for containers

MAX_ENTRIES = 1_000_000  # a hostile file cannot make the reader loop for ever
MAX_NAME_SCAN = 64 << 20  # bytes of one payload read to find its TU name
MAX_DECOMPRESSED = 64 << 20  # a larger compressed cubin stays unnamed (memory bound)
CHUNK = 1 << 20
TU_SYMBOL = re.compile(rb"_INTERNAL_[0-9a-f]{8}_(\d{1,3})_")
TU_CHARS = re.compile(rb"[A-Za-z0-9_]+")


class FatbinError(ManagerError):
    """A file's ELF or fatbin structure is malformed (truncated, hostile, not an ELF)."""


@dataclass(frozen=True)
class Entry:
    """One fatbin entry: SASS (a cubin) or PTX for one SM."""

    kind: str  # "sass" | "ptx"
    sm: int  # 70, 75, 80, 90, 100 ...
    arch_specific: bool  # sm_90a, sm_100a
    compression: str  # "none" | "lz4" | "zstd"
    size: int  # payload bytes in the file

    @property
    def arch(self) -> str:
        return f"sm_{self.sm}{'a' if self.arch_specific else ''}"


@dataclass(frozen=True)
class Container:
    """One fatbin container: the device code of one translation unit (without -rdc)."""

    index: int
    tu: str | None  # "cache_kernels_cu", from the cubins' _INTERNAL_ symbols; None when unnamed
    entries: tuple[Entry, ...]

    def sass(self) -> tuple[int, ...]:
        return tuple(sorted({e.sm for e in self.entries if e.kind == "sass"}))

    def ptx(self) -> tuple[int, ...]:
        return tuple(sorted({e.sm for e in self.entries if e.kind == "ptx"}))


@dataclass(frozen=True)
class Fatbin:
    """The device code of one ELF file; `containers` empty when it carries none."""

    path: str
    containers: tuple[Container, ...] = field(default_factory=tuple)

    @property
    def entries(self) -> tuple[Entry, ...]:
        return tuple(e for c in self.containers for e in c.entries)


def runs_on(sass: tuple[int, ...] | list[int], ptx: tuple[int, ...] | list[int], sm: int) -> str | None:
    """How code for these architectures runs on `sm`: "sass" (a cubin it can load), "ptx" (the
    driver JIT-compiles PTX of a lower or equal virtual architecture) or None.

    CUDA's binary compatibility (CUDA C++ Programming Guide, "Binary Compatibility"): a cubin for
    sm_XY runs on sm_XZ with Z >= Y, same major X only; arch-specific `a` cubins run only on their
    exact SM, and are excluded by the caller (not in `sass`)."""
    major, minor = divmod(sm, 10)
    if any(s // 10 == major and s % 10 <= minor for s in sass):
        return "sass"
    if any(p <= sm for p in ptx):
        return "ptx"
    return None


def _sections(fh: BinaryIO, size: int, path: str) -> dict[str, tuple[int, int]]:
    """name -> (file offset, size) of every section with file contents."""
    head = fh.read(64)
    if len(head) < 64 or head[:4] != b"\x7fELF":
        raise FatbinError(f"{path}: not an ELF file")
    if head[4] != 2 or head[5] != 1:
        raise FatbinError(f"{path}: not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", head, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
    if shnum == 0:
        return {}
    if shentsize < 64 or shstrndx >= shnum or shoff + shentsize * shnum > size:
        raise FatbinError(f"{path}: truncated or malformed ELF section table")
    fh.seek(shoff)
    table = fh.read(shentsize * shnum)
    secs = [struct.unpack_from("<IIQQQQ", table, i * shentsize) for i in range(shnum)]
    _n, _t, _f, _a, str_off, str_size = secs[shstrndx]
    if str_off + str_size > size or str_size > 16 << 20:
        raise FatbinError(f"{path}: truncated or malformed ELF section names")
    fh.seek(str_off)
    names = fh.read(str_size)
    out: dict[str, tuple[int, int]] = {}
    for name_off, sh_type, _flags, _addr, off, sec_size in secs:
        end = names.find(b"\0", name_off)
        name = names[name_off:end if end >= 0 else None].decode("latin-1")
        if sh_type == 8 or name in out:  # SHT_NOBITS: no bytes in the file
            continue
        if off + sec_size > size:
            raise FatbinError(f"{path}: section {name} runs past the end of the file")
        out[name] = (off, sec_size)
    return out


def _decompress(data: bytes, compression: str, expected: int) -> bytes | None:
    """A compressed payload, when the `[audit]` extra's library is installed; None otherwise."""
    try:
        if compression == "lz4":
            import lz4.block

            return bytes(lz4.block.decompress(data, uncompressed_size=expected))
        import zstandard

        return bytes(zstandard.ZstdDecompressor().decompress(data, max_output_size=expected))
    except ImportError:
        return None
    except Exception:  # noqa: BLE001 - a corrupt payload only loses the TU name
        return None


def _find_tu(data: bytes) -> str | None:
    """The source file of `_INTERNAL_<8 hex>_<len>_<file>_cu_<8 hex>` (the length prefix says
    where the name ends, as nvcc mangles it)."""
    for m in TU_SYMBOL.finditer(data):
        n = int(m.group(1))
        name = data[m.end():m.end() + n]
        if len(name) == n and TU_CHARS.fullmatch(name) and name.endswith(b"_cu"):
            return name.decode()
    return None


def _tu_name(fh: BinaryIO, offset: int, size: int, compression: str, csize: int, dsize: int) -> str | None:
    fh.seek(offset)
    if compression != "none":
        if not 0 < csize <= size or not 0 < dsize <= MAX_DECOMPRESSED:
            return None
        data = _decompress(fh.read(csize), compression, dsize)
        if data is None:
            return None
        return _find_tu(data)
    tail = b""
    left = min(size, MAX_NAME_SCAN)
    while left > 0:
        chunk = fh.read(min(CHUNK, left))
        if not chunk:
            break
        left -= len(chunk)
        name = _find_tu(tail + chunk)
        if name:
            return name
        tail = chunk[-1200:]
    return None


def _container(fh: BinaryIO, pos: int, end: int, path: str, index: int, names: bool,
               strict: bool) -> tuple[Container, int] | None:
    """The container at `pos` and where it ends; None when `pos` holds none (not strict: a magic
    number found by scanning data may be a coincidence, and is then skipped)."""
    fh.seek(pos)
    magic, version, hsize, fsize = CONTAINER_HEADER.unpack(fh.read(CONTAINER_HEADER.size))
    if magic != MAGIC:
        if strict:
            raise FatbinError(f"{path}: bad fatbin container magic {magic:#010x} at offset {pos:#x}")
        return None
    if hsize < CONTAINER_HEADER.size or pos + hsize + fsize > end:
        if strict:
            raise FatbinError(f"{path}: fatbin container at offset {pos:#x} runs past its section")
        return None
    if not strict and (version != 1 or hsize != CONTAINER_HEADER.size or fsize < ENTRY_HEADER.size):
        return None
    entries: list[Entry] = []
    tu: str | None = None
    e = pos + hsize
    cend = e + fsize
    while e + ENTRY_HEADER.size <= cend:
        if len(entries) >= MAX_ENTRIES:
            raise FatbinError(f"{path}: more than {MAX_ENTRIES} fatbin entries in one container")
        fh.seek(e)
        (kind, _u, ehs, psize, csize, _opt, _minor, _major, sm, _noff, _nlen, flags, _z,
         dsize) = ENTRY_HEADER.unpack(fh.read(ENTRY_HEADER.size))
        bad = None
        if ehs < ENTRY_HEADER.size or e + ehs + psize > cend:
            bad = f"{path}: fatbin entry at offset {e:#x} runs past its container"
        elif kind not in (KIND_PTX, KIND_SASS):
            bad = f"{path}: unknown fatbin entry kind {kind} at offset {e:#x}"
        if bad:
            if strict:
                raise FatbinError(bad)
            return None
        compression = "lz4" if flags & FLAG_LZ4 else "zstd" if flags & FLAG_ZSTD else "none"
        entries.append(Entry("ptx" if kind == KIND_PTX else "sass", sm, bool(flags & FLAG_ARCH_SPECIFIC),
                             compression, psize))
        if names and tu is None and kind == KIND_SASS:
            tu = _tu_name(fh, e + ehs, psize, compression, csize, dsize)
        e += ehs + psize
    if e != cend and cend - e >= ENTRY_HEADER.size:
        if strict:
            raise FatbinError(f"{path}: fatbin container at offset {pos:#x} is inconsistent")
        return None
    return Container(index, tu, tuple(entries)), cend


def _scan(fh: BinaryIO, start: int, end: int) -> Iterator[int]:
    """Offsets of the container magic in [start, end), read in chunks."""
    needle = struct.pack("<I", MAGIC)
    pos = start
    while pos < end:
        fh.seek(pos)
        chunk = fh.read(min(CHUNK, end - pos))
        if len(chunk) < 4:
            return
        i = chunk.find(needle)
        if i < 0:
            pos += len(chunk) - 3
            continue
        yield pos + i
        pos += i + 4  # the caller may seek elsewhere; resume right after this hit


def read(fh: BinaryIO, size: int, path: str, names: bool = True) -> Fatbin:
    """Parse the `.nv_fatbin` section of an open ELF file of `size` bytes, and the fatbin
    containers some libraries keep in their large-data sections (cuFFT: `.ldata`).

    `names`: also name each container's TU (reads one cubin per container). Raises FatbinError
    (one line naming `path`) on a truncated or inconsistent `.nv_fatbin`."""
    fh.seek(0)
    sections = _sections(fh, size, path)
    containers: list[Container] = []
    found = sections.get(SECTION)
    if found is not None:
        start, length = found
        end = start + length
        pos = start
        while pos + CONTAINER_HEADER.size <= end:
            fh.seek(pos)
            if fh.read(4) == b"\0\0\0\0":  # zero padding between containers
                pos += 8
                continue
            got = _container(fh, pos, end, path, len(containers), names, strict=True)
            assert got is not None
            containers.append(got[0])
            pos = (got[1] + 7) & ~7  # containers start 8-byte aligned
    for name in LARGE_DATA:
        if name not in sections:
            continue
        start, length = sections[name]
        end = start + length
        resume = start
        for hit in _scan(fh, start, end):
            if hit < resume:
                continue
            got = _container(fh, hit, end, path, len(containers), names, strict=False)
            if got is not None:
                containers.append(got[0])
                resume = got[1]
    return Fatbin(path, tuple(containers))


def read_path(path: str, names: bool = True) -> Fatbin:
    import os

    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            return read(fh, size, path, names)
    except OSError as exc:
        raise FatbinError(f"{path}: cannot read: {exc.strerror or exc}") from None
