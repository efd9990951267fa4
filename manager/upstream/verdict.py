"""The verdict for one overlay on one engine, from plain inputs (no catalog, no network).

    superseded  the probe says the overlay's target scope (or target file) no longer exists at the pin
    drift       the probe says the scope exists but the anchor does not (re-anchor needed)
    drop        the probe says the fix is native at the pin (or the overlay has nothing left to do
                there although the version is in its range), or the PR merged and the pin contains it
    waiting     the PR merged but the pin does not contain the merge commit
    keep        the PR is open or closed unmerged (or there is none and the probe finds the
                overlay's anchor) and nothing shows a native fix
    unknown     the facts needed are missing (offline with no cache, PR not found, ancestry unknown,
                no PR and no probe): never `keep` without evidence

A verified merge in the pin decides first (drop, even when the probe then reports drift:
the merge itself often rewrites the overlay's anchor). Otherwise source probes come first:
they read the engine's actual sources, so they catch a fix that landed another way (a PR
closed unmerged but fixed by a different one) and a scope deleted by a refactor, which PR
state alone cannot.
"""

from __future__ import annotations

from dataclasses import dataclass

from .ancestry import Ancestry
from .facts import PRFacts, PRUnavailable

VERDICTS = ("keep", "waiting", "drop", "superseded", "drift", "unknown")

# Overlay-engine statuses that decide on their own, and what they mean here.
_DECISIVE = {
    "superseded": ("superseded", "the target scope no longer exists at the pin"),
    "drift": ("drift", "the scope exists but the anchor does not: re-anchor needed"),
    "upstream": ("drop", "the fix is native at the pin"),
    "missing-target": ("superseded", "a target file of the overlay does not exist at the pin"),
    # inside the overlay's `versions`: the edits find nothing to do (e.g. no functools caches left)
    "not-applicable": ("drop", "the overlay has nothing to do at the pin (not-applicable)"),
}
# Statuses meaning "the overlay's anchor is there and no native fix was detected".
NOT_NATIVE = ("pending", "applied")


@dataclass(frozen=True)
class ProbeFacts:
    """The overlay engine's status for this overlay on the engine's sources (None: no probe)."""

    status: str | None
    evidence: tuple[str, ...]


@dataclass(frozen=True)
class Verdict:
    verdict: str
    evidence: tuple[str, ...]
    provisional: str | None = None  # for `unknown`: what the manifest's recorded PR state would give


def decide(
    *,
    has_upstream: bool,
    pr: PRFacts | PRUnavailable | None,
    ancestry: Ancestry | None,
    probe: ProbeFacts | None,
    manifest_state: str | None = None,
    in_versions: bool | None = None,
) -> Verdict:
    """`in_versions`: whether the engine's vLLM version is inside the overlay's `versions`
    (None: unknown). Outside it, a `not-applicable` probe only says the overlay is not meant
    for this engine, which decides nothing about upstream."""
    ev: list[str] = []
    if pr is not None:
        ev.append(pr.evidence)
    if ancestry is not None:
        ev.extend(ancestry.evidence)
    if probe is not None:
        ev.extend(probe.evidence)

    merged_in_pin = (isinstance(pr, PRFacts) and pr.state == "merged" and ancestry is not None
                     and ancestry.contains is True)
    if (merged_in_pin and ancestry is not None and probe is not None
            and probe.status in ("drift", "superseded", "missing-target")):
        # The merge itself usually rewrites the code the overlay anchors on: re-anchoring an
        # overlay whose fix is in the pin would be wasted work.
        ev.append(f"note: the probe reports {probe.status}, expected once the fix's own change is in the pin")
        ev.append(f"verdict drop: PR merged and the pin contains the merge ({ancestry.method})")
        return Verdict("drop", tuple(ev))
    decisive = probe is not None and probe.status in _DECISIVE
    if decisive and probe is not None and probe.status == "not-applicable" and in_versions is False:
        decisive = False
        ev.append("note: the engine's vLLM version is outside the overlay's `versions`: not-applicable by design")
    if decisive and probe is not None and probe.status is not None:
        verdict, why = _DECISIVE[probe.status]
        if verdict == "drop" and isinstance(pr, PRFacts) and pr.state in ("open", "closed"):
            ev.append(f"note: PR #{pr.number} is {pr.state} unmerged, so the fix reached the pin another way")
        ev.append(f"verdict {verdict}: probe says {why}")
        return Verdict(verdict, tuple(ev))

    if not has_upstream:
        if probe is None or probe.status not in NOT_NATIVE:
            # nothing to stand on: no PR to ask about and no probe read the engine's sources
            ev.append("verdict unknown: no upstream PR recorded and no source probe ran, so nothing shows "
                      "whether the fix is native at the pin")
            return Verdict("unknown", tuple(ev))
        ev.append(f"verdict keep: no upstream PR recorded and the probe finds the overlay's anchor ({probe.status})")
        return Verdict("keep", tuple(ev))

    if isinstance(pr, PRUnavailable) or pr is None or pr.state == "not-found":
        provisional = None
        if manifest_state in ("open", "closed", "merged") and isinstance(pr, PRUnavailable):
            guess = _from_state(manifest_state, ancestry, probe)
            if guess is not None:
                provisional = guess
                why = ""
                if manifest_state == "merged" and (ancestry is None or ancestry.contains is None):
                    why = ", as the probe finds no native fix at the pin"
                ev.append(f"manifest records the PR as {manifest_state} (not verified): would be {guess}{why}")
        ev.append("verdict unknown: no PR facts" if pr is None or isinstance(pr, PRUnavailable)
                  else "verdict unknown: the PR number does not exist upstream")
        return Verdict("unknown", tuple(ev), provisional)

    native_note = _probe_note(probe)
    if pr.state in ("open", "closed"):
        ev.append(f"verdict keep: PR {pr.state}{' unmerged' if pr.state == 'closed' else ''}{native_note}")
        return Verdict("keep", tuple(ev))

    # merged
    if ancestry is None or ancestry.contains is None:
        ev.append("verdict unknown: PR merged but whether the pin contains the merge is unknown")
        return Verdict("unknown", tuple(ev))
    if ancestry.contains:
        if probe is not None and probe.status in NOT_NATIVE:
            ev.append(f"note: the probe still finds the overlay's anchor ({probe.status}); "
                      "check its native-fix detection")
        ev.append(f"verdict drop: PR merged and the pin contains the merge ({ancestry.method})")
        return Verdict("drop", tuple(ev))
    ev.append(f"verdict waiting: PR merged, the pin does not contain the merge yet ({ancestry.method})")
    return Verdict("waiting", tuple(ev))


def _from_state(state: str, ancestry: Ancestry | None, probe: ProbeFacts | None) -> str | None:
    if state in ("open", "closed"):
        return "keep"
    if ancestry is not None and ancestry.contains is not None:
        return "drop" if ancestry.contains else "waiting"
    if probe is not None and probe.status in NOT_NATIVE:
        return "waiting"  # merged (per the manifest) but the sources at the pin have no native fix yet
    return None


def _probe_note(probe: ProbeFacts | None) -> str:
    if probe is None or probe.status is None:
        return " (no source probe for this engine)"
    if probe.status in NOT_NATIVE:
        return f" and no native fix in the sources (probe: {probe.status})"
    return f" (probe: {probe.status}, not decisive)"
