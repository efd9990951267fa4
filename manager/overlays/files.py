"""The target files of one operation: read once (regular files only, inside the root), decoded
byte-exactly in their own encoding, parsed once (libcst) and hashed.

Every target the engine reads or writes goes through `resolve_in_root`; `Tree` keeps what was
read (and what was written) so status, planning and the ledger record never read a file twice.
"""

from __future__ import annotations

import io
import os
import stat
import tokenize
from pathlib import Path

from ..errors import OverlayError
from ..fsutil import sha256_bytes
from ..state import ABSENT, MAX_READ, check_rel_path


def read_regular(path: Path, rel: str) -> bytes | None:
    """The bytes of a regular file; None when it does not exist. Anything else (a directory, a
    FIFO, a device, a socket) is refused before a read can block: opened non-blocking, fstat()ed."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise OverlayError(f"{rel}: cannot read: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise OverlayError(f"{rel}: is a directory, not a regular file")
        if not stat.S_ISREG(st.st_mode):
            kind = _KINDS.get(stat.S_IFMT(st.st_mode), "special file")
            raise OverlayError(f"{rel}: not a regular file ({kind}); refused")
        if st.st_size > MAX_READ:
            raise OverlayError(f"{rel}: is {st.st_size} bytes, over the {MAX_READ}-byte limit for a target; refused")
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read(MAX_READ + 1)
        if len(data) > MAX_READ:
            raise OverlayError(f"{rel}: grew past the {MAX_READ}-byte limit for a target while read; refused")
        return data
    except OSError as exc:
        raise OverlayError(f"{rel}: cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)


_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket"}



def nul_line(text: str) -> int:
    return text.count("\n", 0, text.index("\0")) + 1


def resolve_in_root(root: Path, rel: str) -> Path:
    """The real path of `root/rel` (symlinks followed); refused unless it stays inside the root.

    Every target the engine reads or writes goes through here: a target behind a directory or
    file symlink that leaves the root, or a `..`/absolute path (a hand-edited ledger), is refused
    with one line naming it. A file symlink that stays inside the root resolves to its target,
    so writes land there and the link is kept."""
    why = check_rel_path(rel)
    if why:
        raise OverlayError(f"{rel!r}: {why}; refused: only paths inside the root {root} are read or written")
    base = Path(root).resolve()
    real = (base / rel).resolve()
    if real != base and base not in real.parents:
        raise OverlayError(f"{Path(root) / rel}: resolves to {real}, outside the root {base}; refused")
    return real


def file_encoding(rel: str, data: bytes) -> str:
    """The codec that gives `data` back byte for byte: utf-8-sig for a BOM, a Python file's
    coding declaration, else utf-8. Line endings are never translated."""
    if rel.endswith(".py"):
        try:
            enc, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        except SyntaxError as exc:
            raise OverlayError(f"{rel}: {exc}") from None
        return enc
    return "utf-8-sig" if data.startswith(b"\xef\xbb\xbf") else "utf-8"


def decode_file(rel: str, data: bytes) -> tuple[str, str]:
    """(text, codec) of a source file, or one line naming the file, the line and the problem
    (bytes its codec cannot read, a NUL byte)."""
    enc = file_encoding(rel, data)
    try:
        text = data.decode(enc)
    except LookupError as exc:
        raise OverlayError(f"{rel}: cannot be read as {enc}: {exc}") from None
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        label = "UTF-8" if enc.startswith("utf-8") else enc
        raise OverlayError(
            f"{rel}: line {line}: not {label} (byte 0x{data[exc.start]:02x}); a file in another encoding "
            f"needs a coding declaration naming it"
        ) from None
    if "\0" in text:
        raise OverlayError(f"{rel}: line {nul_line(text)}: contains a NUL byte; not a source file")
    return text, enc


def encode_file(rel: str, text: str, enc: str) -> bytes:
    try:
        return text.encode(enc)
    except (UnicodeEncodeError, LookupError) as exc:
        raise OverlayError(f"{rel}: the patched text cannot be written back as {enc}: {exc}") from None


class Tree:
    """Reads target files once per operation and keeps their parsed modules.

    `names`: for a target whose Python edits all work inside named top-level definitions, those
    names (manager.overlays.excerpt): `module()` then parses only them when that is safe, and
    `excerpt()` says how to render the result back into the whole file."""

    def __init__(self, root: Path, names: dict[str, frozenset[str]] | None = None) -> None:
        self.root = root
        self._bytes: dict[str, bytes | None] = {}
        self._modules: dict[str, object] = {}
        self._enc: dict[str, str] = {}
        self._texts: dict[str, str | None] = {}
        self._syntax: dict[str, object] = {}
        self._names = names or {}
        self._excerpts: dict[str, object] = {}

    def read(self, rel: str) -> bytes | None:
        if rel not in self._bytes:
            self._bytes[rel] = read_regular(resolve_in_root(self.root, rel), rel)
        return self._bytes[rel]

    def text(self, rel: str) -> str | None:
        """The file decoded in its own encoding (decoded once; None when it is missing)."""
        if rel not in self._texts:
            data = self.read(rel)
            if data is None:
                return None
            self._texts[rel], self._enc[rel] = decode_file(rel, data)
        return self._texts[rel]

    def encode(self, rel: str, text: str | None) -> bytes | None:
        """`text` as bytes in the file's own encoding (BOM and coding declaration kept)."""
        if text is None:
            return None
        if rel not in self._enc and self.read(rel) is not None:
            self.text(rel)
        return encode_file(rel, text, self._enc.get(rel, "utf-8"))

    def syntax(self, rel: str):
        """The file's `ast` module (None when it is missing or does not parse), parsed once."""
        if rel not in self._syntax:
            import ast

            text = self.text(rel)
            try:
                self._syntax[rel] = ast.parse(text) if text is not None else None
            except (SyntaxError, ValueError):
                self._syntax[rel] = None
        return self._syntax[rel]

    def module(self, rel: str):
        """The file's libcst module: the excerpt of its named definitions when it has one."""
        if rel not in self._modules:
            import libcst as cst

            text = self.text(rel)
            if text is not None and self._names.get(rel):
                from .excerpt import excerpt

                part = excerpt(text, self.syntax(rel), self._names[rel])
                if part is not None:
                    self._excerpts[rel] = part
                    self._modules[rel] = part.module
                    return part.module
            try:
                self._modules[rel] = cst.parse_module(text) if text is not None else None
            except cst.ParserSyntaxError as exc:
                raise OverlayError(f"{rel}: does not parse as Python: {exc.message}") from None
        return self._modules[rel]

    def excerpt(self, rel: str):
        """The `Excerpt` that `module(rel)` was parsed as, or None for a whole module."""
        return self._excerpts.get(rel)

    def sha(self, rel: str) -> str:
        data = self.read(rel)
        return ABSENT if data is None else sha256_bytes(data)

    def replace(self, rel: str, data: bytes | None, module: object | None) -> None:
        """Record bytes just written (and their module, when the plan built it)."""
        self._bytes[rel] = data
        self._texts.pop(rel, None)
        self._syntax.pop(rel, None)
        self._excerpts.pop(rel, None)  # the module kept is only inspected from here on, never rendered
        if module is not None:
            self._modules[rel] = module
        else:
            self._modules.pop(rel, None)
