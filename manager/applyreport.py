"""The one builder of what `overlay apply` reports, for all three ways an apply runs: the engine (the CLI and
the start-up path), a prepared plan replayed, and the warm no-op (manager.fastpath). Standard library only, and
no `typing` at run time: the warm no-op imports it before anything else loads.

Lines are (verb, text, kind), in this order: recovered journals, skipped overlays, changes, overlay statuses,
"identical" when nothing was written, then one closing line (a plan recorded or replayed, or a note). kind:
"note", "skipped", "change", "status" (the verb is the overlay's status), "quiet". The CLI colours them by
kind; the start-up paths print them plain (`plain`).
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: `typing` imports `re`, which the warm no-op never loads
if TYPE_CHECKING:
    from collections.abc import Collection, Iterable

Line = tuple[str, str, str]
_WOULD = {"create": "would create", "updated": "would update", "delete": "would delete"}


def apply_lines(
    *,
    notes: Iterable[str] = (),
    skipped: Iterable[tuple[str, str]] = (),
    changes: Iterable[tuple[str, str, Iterable[str]]] = (),
    statuses: Iterable[tuple[str, str]] = (),
    shown: Collection[str] | None = None,
    dry_run: bool = False,
    identical: str | None = None,
    closing: Line | None = None,
) -> list[Line]:
    """`changes`: (verb, path, overlay ids); `statuses`: (overlay id, status), those in `shown` reported (all when
    None; none on a dry run); `identical`: the "nothing to do" text, said when there are no changes."""
    out: list[Line] = [("recovered", note, "note") for note in notes]
    out += [("skipped", f"{oid}: {why}", "skipped") for oid, why in skipped]
    n = 0
    for verb, path, ids in changes:
        n += 1
        out.append((_WOULD.get(verb, verb) if dry_run else verb, f"{path}  ({', '.join(ids)})", "change"))
    if not dry_run:
        out += [(st, oid, "status") for oid, st in statuses if shown is None or st in shown]
    if not n and identical is not None:
        out.append(("identical", identical, "quiet"))
    if closing is not None:
        out.append(closing)
    return out


def plain(lines: Iterable[Line]) -> str:
    """The lines as the start-up paths write them to stderr (no colour): the verb right-aligned in 12 columns."""
    return "".join(f"{verb:>12}  {text}\n" for verb, text, _kind in lines)
