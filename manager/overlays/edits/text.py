"""Text edit kinds: new files, and anchored line edits for C/C++/CUDA sources.

Sentinels are `# overlay:...` lines in Python files and `// overlay:...` lines in
C-family files. A block is `begin ... end` with the sha of its body in `begin`.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from ..sentinel import Sentinel, parse_c, parse_python, short_hash
from .base import EditContext, EditFailed, EditState, Inspection

_C_SUFFIXES = {".c", ".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp", ".cu", ".cuh"}


def _body_sha(lines: list[str]) -> str:
    return short_hash("\n".join(ln[:-1] if ln.endswith("\r") else ln for ln in lines))


def comment_style(path: str) -> str:
    return "c" if PurePosixPath(path).suffix in _C_SUFFIXES else "python"


class TextEdit:
    language = "text"

    def __init__(self, spec, ctx: EditContext, target: str) -> None:
        self.spec = spec
        self.ctx = ctx
        self.target = target
        self.style = comment_style(target)

    @property
    def name(self) -> str:
        return self.spec.name

    def _line(self, s: Sentinel) -> str:
        return s.c() if self.style == "c" else s.python()

    def _parse(self, line: str) -> Sentinel | None:
        return parse_c(line) if self.style == "c" else parse_python(line)


class NewFile(TextEdit):
    """A whole new file whose first line is our sentinel (with the sha of the rest)."""

    def content(self) -> str:
        body = self.ctx.read(self.spec.source)
        if not body.endswith("\n"):
            body += "\n"
        s = Sentinel(self.ctx.overlay_id, self.ctx.version, self.name, (("sha", short_hash(body)),))
        return self._line(s) + "\n" + body

    def inspect(self, text: str | None) -> Inspection:
        tag = f"edit {self.name}"
        if text is None:
            return Inspection(EditState.PENDING, f"{tag}: {self.target} will be created")
        first, _, rest = text.partition("\n")
        s = self._parse(first)
        if s is None or s.overlay != self.ctx.overlay_id or s.edit != self.name:
            return Inspection(EditState.DRIFT, f"{tag}: {self.target} exists and is not ours")
        if short_hash(rest) != s.get("sha"):
            return Inspection(EditState.MODIFIED, f"{tag}: {self.target} was edited after it was written")
        if s.version < self.ctx.version:
            return Inspection(EditState.OLD, f"{tag}: v{s.version} present, v{self.ctx.version} available")
        if text != self.content():
            return Inspection(EditState.MODIFIED, f"{tag}: differs from this catalog's v{s.version}")
        return Inspection(EditState.APPLIED, f"{tag}: v{s.version} present")

    def apply(self, text: str | None) -> str | None:
        st = self.inspect(text)
        if st.state in (EditState.PENDING, EditState.OLD):
            return self.content()
        if st.state == EditState.APPLIED:
            return text
        raise EditFailed(st.detail)

    def remove(self, text: str | None) -> str | None:
        if text is None:
            return None
        first, _, rest = text.partition("\n")
        s = self._parse(first)
        if s is None or s.overlay != self.ctx.overlay_id or s.edit != self.name:
            return text  # not ours: never touched
        if short_hash(rest) != s.get("sha"):
            raise EditFailed(
                f"line 1: edit {self.name}: {self.target} was edited after it was written "
                f"(sentinel sha={s.get('sha')}, found sha={short_hash(rest)}); not deleting it"
            )
        return None  # delete


class TextInsert(TextEdit):
    """Insert lines before/after a unique anchor line, optionally within a brace block."""

    def _region(self, lines: list[str]) -> tuple[int, int] | None:
        if not self.spec.within:
            return 0, len(lines)
        rx = re.compile(self.spec.within)
        starts = [i for i, ln in enumerate(lines) if rx.search(ln)]
        if len(starts) != 1:
            return None if not starts else (-len(starts), 0)
        depth, opened = 0, False
        for j in range(starts[0], len(lines)):
            depth += lines[j].count("{") - lines[j].count("}")
            opened = opened or "{" in lines[j]
            if opened and depth <= 0:
                return starts[0], j + 1
        return starts[0], len(lines)

    def _blocks(self, lines: list[str]) -> list[tuple[int, int, Sentinel]]:
        out = []
        i = 0
        while i < len(lines):
            s = self._parse(lines[i])
            if s and s.overlay == self.ctx.overlay_id and s.edit == self.name and s.get("begin") is not None:
                for j in range(i + 1, len(lines)):
                    e = self._parse(lines[j])
                    if e and e.overlay == s.overlay and e.edit == s.edit and e.get("end") is not None:
                        out.append((i, j, s))
                        i = j
                        break
                else:
                    out.append((i, -1, s))
            i += 1
        return out

    def _block_lines(self, indent: str, cr: str = "") -> list[str]:
        """Our lines (split on LF); `cr` = "\r" in a CRLF file, so every line keeps its ending.
        The sha covers the body without the CRs (the same block hashes the same either way)."""
        code = self.ctx.read(self.spec.code).replace("\r\n", "\n").rstrip("\n").split("\n")
        body = [(indent + ln) if ln.strip() else "" for ln in code]
        digest = short_hash("\n".join(body))
        begin = Sentinel(self.ctx.overlay_id, self.ctx.version, self.name, (("begin", ""), ("sha", digest)))
        end = Sentinel(self.ctx.overlay_id, self.ctx.version, self.name, (("end", ""),))
        return [ln + cr for ln in (indent + self._line(begin), *body, indent + self._line(end))]

    def _sites(self, lines: list[str]) -> list[int] | str:
        region = self._region(lines)
        if region is None:
            return f"scope line /{self.spec.within}/ not found"
        if region[0] < 0:
            return f"scope line /{self.spec.within}/ matches {-region[0]} times"
        want = self.spec.anchor.strip()
        return [i for i in range(*region) if lines[i].strip() == want]

    def inspect(self, text: str | None) -> Inspection:
        tag = f"edit {self.name}"
        if text is None:
            return Inspection(EditState.SUPERSEDED, f"{tag}: {self.target} does not exist")
        lines = text.split("\n")
        blocks = self._blocks(lines)
        if blocks:
            if len(blocks) > 1:
                return Inspection(EditState.MODIFIED, f"{tag}: sentinel present {len(blocks)} times")
            b, e, s = blocks[0]
            if e < 0 or _body_sha(lines[b + 1 : e]) != s.get("sha"):
                return Inspection(EditState.MODIFIED, f"{tag}: block was edited after it was written")
            if s.version < self.ctx.version:
                return Inspection(EditState.OLD, f"{tag}: v{s.version} present, v{self.ctx.version} available")
            indent = lines[b][: len(lines[b]) - len(lines[b].lstrip())]
            if lines[b : e + 1] != self._block_lines(indent, "\r" if lines[b].endswith("\r") else ""):
                return Inspection(EditState.MODIFIED, f"{tag}: differs from this catalog's v{s.version}")
            return Inspection(EditState.APPLIED, f"{tag}: v{s.version} present")
        sites = self._sites(lines)
        if isinstance(sites, str):
            kind = EditState.SUPERSEDED if "not found" in sites else EditState.DRIFT
            return Inspection(kind, f"{tag}: {sites}")
        if len(sites) == 1:
            return Inspection(EditState.PENDING, f"{tag}: anchor found once")
        if not sites:
            return Inspection(EditState.DRIFT, f"{tag}: anchor line not found: {self.spec.anchor.strip()!r}")
        return Inspection(EditState.DRIFT, f"{tag}: anchor line matches {len(sites)} times (ambiguous)")

    def apply(self, text: str | None) -> str | None:
        st = self.inspect(text)
        if st.state == EditState.APPLIED:
            return text
        if st.state == EditState.OLD:
            text = self.remove(text)
            st = self.inspect(text)
        if st.state != EditState.PENDING:
            raise EditFailed(st.detail)
        assert text is not None
        lines = text.split("\n")
        sites = self._sites(lines)
        assert isinstance(sites, list) and len(sites) == 1
        i = sites[0]
        indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
        at = i if self.spec.position == "before" else i + 1
        lines[at:at] = self._block_lines(indent, "\r" if lines[i].endswith("\r") else "")
        return "\n".join(lines)

    def remove(self, text: str | None) -> str | None:
        if text is None:
            return None
        lines = text.split("\n")
        blocks = self._blocks(lines)
        for b, e, s in blocks:
            if e < 0:
                raise EditFailed(f"line {b + 1}: edit {self.name}: begin sentinel without end in {self.target}")
            found = _body_sha(lines[b + 1 : e])
            if found != s.get("sha"):
                raise EditFailed(
                    f"line {b + 1}: edit {self.name}: the block under the sentinel does not match it "
                    f"(sentinel sha={s.get('sha')}, found sha={found}); not removing it"
                )
        for b, e, _ in reversed(blocks):
            del lines[b : e + 1]
        return "\n".join(lines)
