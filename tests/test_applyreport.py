"""manager.applyreport: the one builder of apply's report lines (engine, plan replay, warm no-op)."""

from __future__ import annotations

from manager.applyreport import apply_lines, plain


def test_lines_come_in_the_reports_order_and_statuses_outside_shown_are_left_out():
    lines = apply_lines(
        notes=["journal folded"], skipped=[("b", "superseded: gone")], changes=[("updated", "vllm/x.py", ["a", "c"])],
        statuses=[("a", "applied"), ("b", "superseded")], shown={"applied"}, identical="nothing to do",
        closing=("recorded", "plan p.json", "quiet"),
    )
    assert lines == [
        ("recovered", "journal folded", "note"),
        ("skipped", "b: superseded: gone", "skipped"),
        ("updated", "vllm/x.py  (a, c)", "change"),
        ("applied", "a", "status"),
        ("recorded", "plan p.json", "quiet"),
    ]  # changes were made: no "identical" line


def test_a_dry_run_says_would_and_reports_no_statuses():
    lines = apply_lines(changes=[("create", "vllm/new.py", ["a"])], statuses=[("a", "pending")], dry_run=True)
    assert lines == [("would create", "vllm/new.py  (a)", "change")]


def test_nothing_written_says_identical_and_plain_right_aligns_the_verb():
    lines = apply_lines(statuses=[("a", "applied")], identical="nothing to do (ledger hashes match)")
    assert plain(lines) == "     applied  a\n   identical  nothing to do (ledger hashes match)\n"
