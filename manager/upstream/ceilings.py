"""Pin ceilings: the newest upstream release an SM can run, as data.

An engine built for an older GPU generation cannot follow upstream past the last release whose
binaries carry code for that SM: for such an engine a fix merged in a later release is not an
upgrade away, it needs a build of that release for the SM. `overlay upstream check` and
docs/UPSTREAM.md say so instead of pointing at a release those GPUs cannot run.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import Version


@dataclass(frozen=True)
class PinCeiling:
    sm: float
    newest: str  # the newest vLLM release on PyPI whose binaries (and its torch's) carry code for sm
    gpus: str  # the GPU generation, in words
    source: str

    @property
    def drop_rule(self) -> str:
        return f"drop needs a {self.gpus}-capable build of a release containing the fix"

    def note(self, fix_release: str | None = None) -> str:
        head = (f"pin ceiling: for sm {self.sm} the newest usable release is vLLM {self.newest} ({self.source}); "
                f"a later release does not run on these GPUs")
        if fix_release and Version(fix_release) > Version(self.newest):
            head += f" (the fix is native from {fix_release})"
        return f"{head}: {self.drop_rule}"


CEILINGS: dict[float, PinCeiling] = {
    7.0: PinCeiling(
        sm=7.0, newest="0.19.1", gpus="Volta",
        source=("docs/audit.md: vLLM 0.19.1 (nvcc 12.9) and torch 2.10.0+cu128 carry sm_70 SASS; every later vLLM "
                "on PyPI (0.20.0+, CUDA 13) and torch >= 2.11 (cu130) start at sm_75; "
                "tests/engines/test_audit_real_wheels.py"),
    ),
}


def ceiling_for(sm: float | None) -> PinCeiling | None:
    """The ceiling of an engine built for `sm` (its profile's `target_sm`), or None."""
    if sm is None:
        return None
    return next((c for s, c in CEILINGS.items() if abs(s - sm) < 1e-9), None)
