"""`release-file`: a whole file copied from a pinned upstream release's sdist, sha256-verified.

The repository never vendors upstream code: the manifest names the release, the path inside
its package root and the file's sha256; the bytes come from `manager.releases.release_file`
(the cached sdist from PyPI, or a content-addressed copy a bundle carries) when the overlay
is planned, bundled or applied. The written file's first line is our sentinel, with the sha of
the body (hand edits show as `modified`) and the source release/sha (what was copied).
"""

from __future__ import annotations

from ..sentinel import Sentinel, short_hash
from .base import EditContext, EditFailed, EditState, Inspection
from .text import TextEdit


class ReleaseFile(TextEdit):
    def __init__(self, spec, ctx: EditContext, target: str) -> None:
        super().__init__(spec, ctx, target)
        self._body: str | None = None

    def body(self) -> str:
        if self._body is None:
            from ...errors import ReleaseError
            from ...releases import release_file

            try:
                data = release_file(self.spec.release, self.spec.path, self.spec.sha256)
            except ReleaseError as exc:
                raise EditFailed(f"edit {self.name}: {exc}") from None
            text = data.decode("utf-8")
            self._body = text if text.endswith("\n") else text + "\n"
        return self._body

    def content(self) -> str:
        body = self.body()
        s = Sentinel(self.ctx.overlay_id, self.ctx.version, self.name,
                     (("sha", short_hash(body)), ("release", self.spec.release), ("src", self.spec.sha256[:12])))
        return self._line(s) + "\n" + body

    def inspect(self, text: str | None) -> Inspection:
        tag = f"edit {self.name}"
        if text is None:
            return Inspection(EditState.PENDING, f"{tag}: {self.target} will be copied from vLLM {self.spec.release}")
        first, _, rest = text.partition("\n")
        s = self._parse(first)
        if s is None or s.overlay != self.ctx.overlay_id or s.edit != self.name:
            from ...fsutil import sha256_bytes

            if sha256_bytes(text.encode()) == self.spec.sha256:
                return Inspection(EditState.NATIVE, f"{tag}: {self.target} is already vLLM {self.spec.release}'s file")
            return Inspection(EditState.DRIFT, f"{tag}: {self.target} exists and is not ours")
        if short_hash(rest) != s.get("sha"):
            return Inspection(EditState.MODIFIED, f"{tag}: {self.target} was edited after it was written")
        if s.version < self.ctx.version:
            return Inspection(EditState.OLD, f"{tag}: v{s.version} present, v{self.ctx.version} available")
        if s.get("src") != self.spec.sha256[:12]:
            return Inspection(EditState.OLD, f"{tag}: copied from another source ({s.get('src')}); this catalog pins "
                                             f"vLLM {self.spec.release} {self.spec.sha256[:12]}")
        return Inspection(EditState.APPLIED, f"{tag}: v{s.version} present (vLLM {self.spec.release})")

    def apply(self, text: str | None) -> str | None:
        st = self.inspect(text)
        if st.state in (EditState.PENDING, EditState.OLD):
            return self.content()
        if st.state in (EditState.APPLIED, EditState.NATIVE):
            return text
        raise EditFailed(st.detail)

    def remove(self, text: str | None) -> str | None:
        if text is None:
            return None
        s = self._parse(text.partition("\n")[0])
        if s is None or s.overlay != self.ctx.overlay_id or s.edit != self.name:
            return text  # not ours: never touched
        return None  # delete
