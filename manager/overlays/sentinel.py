"""Sentinel comments: `# overlay:<id> v<N> <edit> key=value ...` (or `// overlay:` in C/C++/CUDA)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from urllib.parse import quote, unquote

_BODY = (r"overlay:(?P<id>[a-z0-9][a-z0-9._-]*) v(?P<version>\d+) "
         r"(?P<edit>[A-Za-z0-9][A-Za-z0-9_.-]*)(?P<rest>(?: \S+)*)")
PY_RE = re.compile(r"^#\s?" + _BODY + r"\s*$")
C_RE = re.compile(r"^\s*//\s?" + _BODY + r"\s*$")


@dataclass(frozen=True)
class Sentinel:
    overlay: str
    version: int
    edit: str
    fields: tuple[tuple[str, str], ...] = ()

    def get(self, key: str, default: str | None = None) -> str | None:
        for k, v in self.fields:
            if k == key:
                return v
        return default

    def body(self) -> str:
        extra = "".join(f" {k}={v}" for k, v in self.fields)
        return f"overlay:{self.overlay} v{self.version} {self.edit}{extra}"

    def python(self) -> str:
        return "# " + self.body()

    def c(self) -> str:
        return "// " + self.body()


def _parse(match: re.Match[str] | None) -> Sentinel | None:
    if match is None:
        return None
    fields: list[tuple[str, str]] = []
    for tok in match.group("rest").split():
        if "=" in tok:
            k, v = tok.split("=", 1)
            fields.append((k, v))
        else:
            fields.append((tok, ""))
    return Sentinel(match.group("id"), int(match.group("version")), match.group("edit"), tuple(fields))


def parse_python(comment: str) -> Sentinel | None:
    return _parse(PY_RE.match(comment.strip()))


def parse_c(line: str) -> Sentinel | None:
    return _parse(C_RE.match(line.rstrip("\n")))


def short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def encode_value(text: str) -> str:
    """Make a code fragment safe to carry in a sentinel field (no spaces), still readable."""
    return quote(text, safe="@()=.,_[]:'\"*+-/<>")


def decode_value(text: str) -> str:
    return unquote(text)
