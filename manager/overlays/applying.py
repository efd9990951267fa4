"""Applying overlays as `overlay apply` does: the one apply entry of the CLI and the start-up path.

`apply_overlays` is what both `overlay apply` (manager.cli) and the start-up path (manager.fastpath,
`engine_apply`) call: the engine's transactional apply (manager.overlays.transaction) and, on a first
apply, the plan that replays it recorded into the plan cache `$OVERLAY_PLAN_CACHE` (made by
manager.overlays.prepare). `report_lines` is what either prints.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..applyreport import apply_lines
from ..state import APPLY_SKIPS, JOURNAL_FILE, LEDGER_FILE, STATE_DIR
from .loader import Overlay
from .model import ApplyResult
from .plankey import ENV_CACHE, PlanKey
from .prepare import FROM_ENV, input_hashes, record_plan, signing_key
from .transaction import apply


@dataclass(frozen=True)
class RecordedApply:
    result: ApplyResult
    plan: str | None = None  # the plan file written, when one was
    note: str | None = None  # why none was written, when recording failed


def report_lines(recorded: RecordedApply, dry_run: bool = False) -> list[tuple[str, str, str]]:
    """What `overlay apply` reports, in order, as (verb, text, kind). kind: "note" (a recovered
    journal, a plan that could not be recorded), "skipped", "change", "status" (the verb is the
    overlay's status), "quiet". The CLI colours the lines by kind; the start-up path
    (manager.fastpath, stderr not a terminal) prints the same lines plain."""
    result = recorded.result
    closing = (("recorded", f"plan {recorded.plan}", "quiet") if recorded.plan
               else ("note", recorded.note, "note") if recorded.note else None)
    return apply_lines(
        notes=result.notes, skipped=result.skipped,
        changes=((c.verb, c.path, c.overlays) for c in result.changes),
        statuses=((o.id, o.status) for o in result.statuses.overlays), shown=APPLY_SKIPS, dry_run=dry_run,
        identical=f"nothing to do{' (ledger hashes match)' if result.fast_path else ''}", closing=closing,
    )


def apply_overlays(
    selected: Sequence[Overlay], root: Path, ids: Iterable[str] = (), *, dry_run: bool = False, wait: float = 600.0,
    on_wait: Callable[[str], None] | None = None,
) -> RecordedApply:
    """`overlay apply [IDS]` on `root` (`selected`: the overlays IDS name, all when none): the engine's apply,
    a first apply recorded into the plan cache `$OVERLAY_PLAN_CACHE` when that is set."""
    ids = tuple(ids)
    return apply_and_record(selected, root, explicit=bool(ids), ids=ids, cache=os.environ.get(ENV_CACHE) or None,
                            dry_run=dry_run, wait=wait, on_wait=on_wait)


def apply_and_record(
    overlays: Sequence[Overlay], root: Path, *, explicit: bool = False, ids: Iterable[str] = (),
    cache: str | None = None, dry_run: bool = False, wait: float = 600.0,
    on_wait: Callable[[str], None] | None = None, key: PlanKey | str | None = FROM_ENV, unsigned: bool = False,
) -> RecordedApply:
    """The engine's `apply`; when it is a first apply (no ledger, no journal) and succeeds, the
    plan that replays it is written (a read-only cache is a note): signed with `key` into the
    plan cache `cache` (`<cache>/<key id>/`; no usable key: not recorded, a note), or, with
    `unsigned` (`overlay prepare --out`), into `cache` itself, signed when there is a key."""
    root = Path(root)
    state = root / STATE_DIR
    first = not (state / LEDGER_FILE).exists() and not (state / JOURNAL_FILE).exists()
    why_not = None
    signing: PlanKey | None = None
    if cache and first and not dry_run:
        signing, why_not = signing_key(key, unsigned)
    record_now = bool(cache) and first and not dry_run and why_not is None
    inputs = input_hashes(overlays, root) if record_now else {}
    result = apply(overlays, root, dry_run=dry_run, explicit=explicit, wait=wait, on_wait=on_wait)
    if dry_run or not cache or not first or result.notes:
        return RecordedApply(result)
    if why_not is not None:
        return RecordedApply(result, None, f"plan not recorded in {cache}: {why_not}")
    plan, note = record_plan(overlays, root, result, inputs, explicit=explicit, ids=ids, cache=cache, key=signing,
                             unsigned=unsigned)
    return RecordedApply(result, plan, note)
