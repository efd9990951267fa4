"""manager.state as the owner of the ledger/journal format: records, validation, the warm no-op decision."""

from __future__ import annotations

import json

import pytest

from manager.state import (
    ABSENT,
    check_rel_path,
    journal_bytes,
    journal_entry,
    ledger_bytes,
    ledger_file,
    overlay_record,
    validate_journal,
    validate_ledger,
    warm_records,
)

A, B = "a" * 64, "b" * 64


def _ledger(status: str = "applied", requires: tuple[str, ...] = ()) -> dict:
    return {
        "package_version": "0.19.1",
        "files": {"vllm/x.py": ledger_file(journal_entry(ABSENT, ABSENT, B, {"ov": 1}))},
        "overlays": {
            "ov": overlay_record(1, requires, "D-ov", status, [("vllm/x.py", status, "")]),
            "dep": overlay_record(1, (), "D-dep", "applied", [("vllm/y.py", "applied", "")]),
        },
        "observed": {"vllm/x.py": B, "vllm/y.py": A},
    }


SHAS = {"vllm/x.py": B, "vllm/y.py": A}


def _warm(ledger: object, *, version: str = "0.19.1", journal: bool = False, wanted=("ov",), shas=SHAS, **kw):
    return warm_records(ledger, version, journal, list(wanted), lambda oid: f"D-{oid}", shas.get, **kw)


def test_records_built_by_the_owner_pass_its_own_validation_and_round_trip_as_bytes():
    led = _ledger()
    assert validate_ledger(json.loads(ledger_bytes(led))) == led
    entries = {"vllm/x.py": journal_entry(A, ABSENT, B, {"ov": 2})}
    assert validate_journal(json.loads(journal_bytes(entries))) == entries
    assert ledger_file(entries["vllm/x.py"]) == {"base_sha256": A, "post_sha256": B, "overlays": {"ov": 2}}


@pytest.mark.parametrize(("mutate", "where"), [
    (lambda d: d["files"]["vllm/x.py"].update(post_sha256="A" * 64), "post_sha256"),  # upper-case hex
    (lambda d: d["files"]["vllm/x.py"].update(base_sha256="a" * 63), "base_sha256"),
    (lambda d: d["files"].update({"../etc/passwd": d["files"]["vllm/x.py"]}), "'..'"),
    (lambda d: d["observed"].update({"/abs": A}), "absolute"),
    (lambda d: d["overlays"]["ov"].update(targets=[]), "targets is empty"),
])
def test_an_invalid_ledger_is_refused_naming_the_key_and_never_written(mutate, where):
    led = _ledger()
    mutate(led)
    with pytest.raises(ValueError, match=where):
        validate_ledger(led)
    with pytest.raises(AssertionError, match="refusing to write an invalid ledger"):
        ledger_bytes(led)


def test_check_rel_path_names_why_a_path_is_not_inside_the_root():
    assert check_rel_path("vllm/a/b.py") is None
    assert check_rel_path("a/../b") == "a path with '..'"
    assert check_rel_path("C:x") == "an absolute path"
    assert check_rel_path("a\0b") == "a path with a NUL byte"
    assert check_rel_path("") == "not a non-empty string"


def test_warm_records_vouches_only_while_every_hash_digest_and_version_match():
    assert [oid for oid, _ in _warm(_ledger())] == ["ov"]
    assert _warm(_ledger(), version="0.20.0") is None
    assert _warm(_ledger(), journal=True) is None
    assert _warm(_ledger(), shas={**SHAS, "vllm/x.py": A}) is None  # a target changed since
    assert _warm(_ledger(), shas={}) is None  # a target that cannot be read: no proof
    assert _warm(_ledger(), wanted=("missing",)) is None
    assert _warm({}, wanted=()) is None and _warm([], wanted=()) is None


def test_warm_records_quiet_refuses_a_status_apply_would_act_on_and_known_follows_requires():
    assert _warm(_ledger("pending"), quiet={"applied"}) is None
    assert _warm(_ledger("pending")) is not None  # status: any recorded status is the answer
    found = _warm(_ledger(requires=("dep",)), quiet={"applied"}, known={"ov", "dep"})
    assert [oid for oid, _ in found] == ["ov", "dep"]
    assert _warm(_ledger(requires=("dep",)), known={"ov"}) is None  # a required overlay gone from the catalog


def test_warm_records_checks_the_paths_targets_of_names_instead_of_the_recorded_ones():
    led = _ledger()
    assert _warm(led, targets_of=lambda oid: ["vllm/x.py", "vllm/y.py"]) is not None
    assert _warm(led, targets_of=lambda oid: ["vllm/x.py", "vllm/z.py"]) is None  # z.py never observed
