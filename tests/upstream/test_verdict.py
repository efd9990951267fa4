"""Verdict logic on plain inputs: every verdict, and the precedence of source probes."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from manager.upstream import VERDICTS, Ancestry, PRFacts, PRUnavailable, ProbeFacts, decide

T = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)


def pr(state, merge=None):
    return PRFacts("o/r", 5, state, merge, None, None, T, f"PR #5 {state}")


YES = Ancestry(True, "compare API", ("compare: ahead",))
NO = Ancestry(False, "git", ("git: no",))
UNK = Ancestry(None, "none", ("compare: unavailable",))
PENDING = ProbeFacts("pending", ("probe: pending at vllm 0.20.0",))


@pytest.mark.parametrize("state", ["open", "closed"])
def test_open_or_closed_unmerged_pr_without_native_fix_is_keep(state):
    v = decide(has_upstream=True, pr=pr(state), ancestry=None, probe=PENDING)
    assert v.verdict == "keep"
    assert v.evidence[0] == f"PR #5 {state}" and "probe: pending at vllm 0.20.0" in v.evidence
    assert "no native fix in the sources" in v.evidence[-1]


def test_merged_pr_not_contained_in_pin_is_waiting():
    v = decide(has_upstream=True, pr=pr("merged", "a" * 40), ancestry=NO, probe=PENDING)
    assert v.verdict == "waiting" and "(git)" in v.evidence[-1]


def test_merged_pr_contained_in_pin_is_drop():
    v = decide(has_upstream=True, pr=pr("merged", "a" * 40), ancestry=YES, probe=None)
    assert v.verdict == "drop" and "compare API" in v.evidence[-1]


def test_drop_by_ancestry_notes_a_probe_that_still_finds_the_anchor():
    v = decide(has_upstream=True, pr=pr("merged", "a" * 40), ancestry=YES, probe=PENDING)
    assert v.verdict == "drop" and any("check its native-fix detection" in e for e in v.evidence)


def test_probe_upstream_drops_even_a_closed_unmerged_pr():
    v = decide(has_upstream=True, pr=pr("closed"), ancestry=None,
               probe=ProbeFacts("upstream", ("probe: upstream at vllm 0.22.0",)))
    assert v.verdict == "drop"
    assert any("reached the pin another way" in e for e in v.evidence)


def test_probe_superseded_wins_over_pr_state():
    v = decide(has_upstream=True, pr=pr("merged", "a" * 40), ancestry=NO,
               probe=ProbeFacts("superseded", ("probe: superseded",)))
    assert v.verdict == "superseded" and "scope no longer exists" in v.evidence[-1]


@pytest.mark.parametrize("status", ["drift", "superseded", "missing-target"])
def test_merge_contained_in_pin_is_drop_even_when_the_probe_lost_the_anchor(status):
    v = decide(has_upstream=True, pr=pr("merged", "a" * 40), ancestry=YES, probe=ProbeFacts(status, ("probe",)))
    assert v.verdict == "drop" and f"the probe reports {status}" in v.evidence[-2]


def test_probe_drift_is_drift():
    v = decide(has_upstream=True, pr=pr("open"), ancestry=None, probe=ProbeFacts("drift", ("probe: drift",)))
    assert v.verdict == "drift" and "re-anchor" in v.evidence[-1]


def test_no_pr_facts_is_unknown_with_manifest_suggestion():
    v = decide(has_upstream=True, pr=PRUnavailable("o/r", 5, "offline; nothing cached"), ancestry=None,
               probe=PENDING, manifest_state="closed")
    assert v.verdict == "unknown" and v.provisional == "keep"
    assert any(e == "manifest records the PR as closed (not verified): would be keep" for e in v.evidence)


def test_no_pr_facts_and_merged_manifest_uses_ancestry_for_the_suggestion():
    v = decide(has_upstream=True, pr=PRUnavailable("o/r", 5, "offline"), ancestry=NO, probe=None,
               manifest_state="merged")
    assert v.verdict == "unknown" and v.provisional == "waiting"


def test_pr_not_found_is_unknown():
    v = decide(has_upstream=True, pr=pr("not-found"), ancestry=None, probe=PENDING)
    assert v.verdict == "unknown" and "does not exist upstream" in v.evidence[-1] and v.provisional is None


def test_merged_with_unknown_ancestry_is_unknown():
    v = decide(has_upstream=True, pr=pr("merged", "a" * 40), ancestry=UNK, probe=PENDING)
    assert v.verdict == "unknown" and "compare: unavailable" in v.evidence


def test_overlay_without_upstream_pr_is_keep():
    v = decide(has_upstream=False, pr=None, ancestry=None, probe=PENDING)
    assert v.verdict == "keep" and "no upstream PR recorded" in v.evidence[-1]


def test_no_pr_and_no_probe_is_unknown_never_keep():
    v = decide(has_upstream=False, pr=None, ancestry=None, probe=None)
    assert v.verdict == "unknown" and "no source probe ran" in v.evidence[-1]


def test_offline_without_cached_pr_facts_and_without_probe_is_unknown():
    from manager.upstream.facts import PRUnavailable

    unavailable = PRUnavailable("vllm-project/vllm", 40886, "offline; nothing cached")
    v = decide(has_upstream=True, pr=unavailable, ancestry=None, probe=None)
    assert v.verdict == "unknown"


def test_not_applicable_outside_the_overlay_versions_does_not_decide():
    v = decide(has_upstream=True, pr=pr("open"), ancestry=None,
               probe=ProbeFacts("not-applicable", ("probe: not-applicable",)), in_versions=False)
    assert v.verdict == "keep" and "not decisive" in v.evidence[-1]
    assert any("outside the overlay's `versions`" in e for e in v.evidence)


def test_not_applicable_inside_versions_means_nothing_left_to_do_so_drop():
    v = decide(has_upstream=False, pr=None, ancestry=None,
               probe=ProbeFacts("not-applicable", ("probe: not-applicable [cuda.py: no functools cache decorators]",)),
               in_versions=True)
    assert v.verdict == "drop" and "nothing to do at the pin" in v.evidence[-1]


def test_missing_target_file_is_superseded():
    v = decide(has_upstream=True, pr=pr("open"), ancestry=None, probe=ProbeFacts("missing-target", ("probe",)))
    assert v.verdict == "superseded" and "does not exist at the pin" in v.evidence[-1]


def test_merged_manifest_without_ancestry_suggests_waiting_only_when_probe_finds_no_native_fix():
    v = decide(has_upstream=True, pr=PRUnavailable("o/r", 5, "offline"), ancestry=UNK, probe=PENDING,
               manifest_state="merged")
    assert v.verdict == "unknown" and v.provisional == "waiting"
    assert "as the probe finds no native fix at the pin" in v.evidence[-2]
    none = decide(has_upstream=True, pr=PRUnavailable("o/r", 5, "offline"), ancestry=UNK, probe=None,
                  manifest_state="merged")
    assert none.provisional is None


def test_sdist_commit_reads_the_commit_id_line(tmp_path):
    from manager.upstream import sdist_commit

    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "_version.py").write_text(
        "__version__ = version = '0.20.0'\n__commit_id__ = commit_id = 'gb8160878f'\n")
    assert sdist_commit(tmp_path) == "b8160878f"
    (tmp_path / "vllm" / "_version.py").write_text("__commit_id__ = commit_id = None\n")
    assert sdist_commit(tmp_path) is None
    assert sdist_commit(tmp_path / "nowhere") is None


_prs = st.one_of(
    st.none(),
    st.builds(PRUnavailable, st.just("o/r"), st.just(5), st.just("offline; nothing cached")),
    st.sampled_from(["open", "closed", "merged", "not-found"]).map(lambda s: pr(s, "a" * 40 if s == "merged" else None)),
)
_ancestries = st.sampled_from([None, YES, NO, UNK])
_probes = st.one_of(st.none(), st.sampled_from(
    ["pending", "applied", "upstream", "superseded", "drift", "not-applicable", "missing-target", "partial",
     "modified", "error", None]).map(lambda s: ProbeFacts(s, (f"probe: {s}",))))


@given(has_upstream=st.booleans(), pr_=_prs, ancestry=_ancestries, probe=_probes,
       manifest_state=st.sampled_from([None, "open", "closed", "merged"]), in_versions=st.sampled_from([None, True, False]))
def test_every_input_gives_one_known_verdict_explained_by_its_last_evidence_line(
        has_upstream, pr_, ancestry, probe, manifest_state, in_versions):
    v = decide(has_upstream=has_upstream, pr=pr_, ancestry=ancestry, probe=probe, manifest_state=manifest_state,
               in_versions=in_versions)
    assert v.verdict in VERDICTS
    assert v.evidence[-1].startswith(f"verdict {v.verdict}:")
    assert (v.provisional is None) or (v.verdict == "unknown" and v.provisional in VERDICTS)
    merged_in = isinstance(pr_, PRFacts) and pr_.state == "merged" and ancestry is YES
    if probe is not None and probe.status in ("superseded", "drift") and not merged_in:
        assert v.verdict == probe.status
    if v.verdict == "drop":  # a drop always rests on a native-fix/no-op probe or a contained merge
        assert (probe is not None and probe.status in ("upstream", "not-applicable")) or (
            isinstance(pr_, PRFacts) and pr_.state == "merged" and ancestry is YES)
