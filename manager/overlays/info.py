"""`OverlayInfo`: what fits(), inspect and the upstream check read of one overlay's manifest.

One class for all three, built from a validated `Manifest` (`from_manifest`), or, for a manifest
that does not validate, from the parts of it that do with `invalid` set (`manager.fits.overlays.
read_overlay`), so that fits() can still say "needed, but its manifest is invalid".
"""

from __future__ import annotations

import functools
from dataclasses import KW_ONLY, dataclass, field

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from .manifest import Manifest, NeededWhen


@dataclass(frozen=True)
class OverlayInfo:
    id: str
    _: KW_ONLY
    needed_when: NeededWhen = field(default_factory=NeededWhen)
    versions: str = ""
    native_from: str | None = None  # first vLLM release with the fix natively (None: none has it)
    kernel: bool = False
    provides_families: tuple[str, ...] = ()  # model families the overlay ports onto older engines
    invalid: str | None = None  # the manifest error, when it does not validate
    digest: str = ""  # of the manifest file's bytes
    # upstream facts as recorded in the manifest (not trusted on their own: `overlay upstream check`)
    repo: str | None = None
    pr: int | None = None
    state: str | None = None
    head_commit: str | None = None
    merge_commit: str | None = None
    drop_when: str = ""

    @classmethod
    def from_manifest(cls, m: Manifest, *, digest: str = "") -> OverlayInfo:
        up = m.upstream
        return cls(
            m.id,
            needed_when=m.needed_when,
            versions=m.versions.strip(),
            native_from=m.native_from,
            kernel=m.kernels is not None,
            provides_families=tuple(m.provides_families),
            digest=digest,
            repo=(up.repo.strip() or None) if up is not None else None,
            pr=up.pr if up is not None else None,
            state=up.state if up is not None else None,
            head_commit=up.head_commit if up is not None else None,
            merge_commit=up.merge_commit if up is not None else None,
            drop_when=" ".join(m.drop_when.split()),
        )

    @property
    def upstream_pr(self) -> tuple[str, int] | None:
        """(repo, PR number) of the upstream PR the overlay tracks, or None."""
        return (self.repo, self.pr) if self.repo and self.pr else None

    @property
    def has_upstream(self) -> bool:
        return self.upstream_pr is not None

    def in_range(self, version: str) -> bool:
        return _in_range(self.versions, version)

    def native_on(self, version: str) -> bool:
        """The fix is native in vLLM `version` (from `native_from`)."""
        try:
            return self.native_from is not None and Version(version) >= Version(self.native_from)
        except InvalidVersion:
            return False


@functools.lru_cache(maxsize=1024)
def _in_range(versions: str, version: str) -> bool:
    """`version` in the specifier `versions` ("" or unparsable: True); memoized, fits() asks per call."""
    if not versions:
        return True
    try:
        return Version(version) in SpecifierSet(versions)
    except (InvalidSpecifier, InvalidVersion):
        return True
