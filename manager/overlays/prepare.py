"""Making prepared plans with the full engine: `overlay prepare`, and recording a first apply.

A plan (format and replay: `manager.overlays.plans`) is always the record of a real engine
apply: `prepare` runs the engine on a scratch root holding the release's input files (the
pristine sources from `manager.releases`), and `apply_and_record` records the first apply it
just made on a live root. Nothing here computes patched bytes on its own.

Signing (manager.overlays.plankey): a plan recorded into the plan cache is always signed, with
the key `$OVERLAY_PLAN_KEY` names (no key, or one that cannot be used: not recorded, a note);
`prepare` signs with the key it is given (default: that one) and writes unsigned plans when
there is none (for `--plans DIR`, used unsigned only where no key is configured).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterable, Sequence

from .. import __version__
from ..errors import OverlayError
from ..fsutil import atomic_write, sha256_bytes
from .ledger import Ledger
from ..state import ABSENT, APPLY_SKIPS, JOURNAL_FILE, LEDGER_FILE, STATE_DIR, read_bounded
from ..applyreport import apply_lines
from .loader import Overlay, select
from .transaction import apply
from .model import ApplyResult
from .plankey import ENV_KEY, PlanKey, PlanKeyError, cache_plans, key_from_env, mac_problem, sign
from .plans import FORMAT, PlanRefused, apply_hunks, check_plan, plan_key

FROM_ENV = "from $OVERLAY_PLAN_KEY"  # apply_and_record / prepare: the key the environment names


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


@dataclass(frozen=True)
class PreparedPlan:
    version: str
    path: str
    changes: tuple[str, ...]  # the files the plan writes
    statuses: tuple[tuple[str, str], ...]  # (overlay id, status after the apply)


def _hunks(before: bytes, after: bytes) -> list:
    """[start, end, text] against `before` (line-level, byte offsets) that turn it into `after`."""
    import difflib  # only when recording: not on every apply's import path

    a, b = before.splitlines(keepends=True), after.splitlines(keepends=True)
    offsets = [0]
    for line in a:
        offsets.append(offsets[-1] + len(line))
    out = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag != "equal":
            out.append([offsets[i1], offsets[i2], b"".join(b[j1:j2]).decode("utf-8")])
    return out


def input_paths(overlays: Sequence[Overlay]) -> list[str]:
    """Every file the engine reads under the root for these overlays: targets, edit and probe targets."""
    paths: set[str] = set()
    for o in overlays:
        m = o.manifest
        paths.update(m.targets)
        paths.update(e.target for e in m.edits if e.target)
        paths.update(p.target for p in m.probes)
    return sorted(paths)


def _sha_or_absent(path: Path) -> str:
    """The input hash the plan records; a FIFO, device or oversized file is never read (the
    engine then refuses it with its own line)."""
    try:
        return sha256_bytes(read_bounded(str(path)))
    except (FileNotFoundError, NotADirectoryError):
        return ABSENT
    except OSError:
        return "not-a-regular-file"


def _signing_key(key: PlanKey | str | None, unsigned: bool) -> tuple[PlanKey | None, str | None]:
    """(the key to sign with, or why nothing is recorded)."""
    if key == FROM_ENV:
        try:
            key = key_from_env()
        except PlanKeyError as exc:
            return None, str(exc)
    if key is None and not unsigned:
        return None, (f"no plan key is configured (${ENV_KEY}), and the plan cache holds only signed plans")
    return key, None  # type: ignore[return-value]


def apply_and_record(
    overlays: Sequence[Overlay], root: Path, *, explicit: bool = False, ids: Iterable[str] = (),
    cache: str | None = None, dry_run: bool = False, wait: float = 600.0, on_wait=None,
    key: PlanKey | str | None = FROM_ENV, unsigned: bool = False,
) -> RecordedApply:
    """The engine's `apply`; when it is a first apply (no ledger, no journal) and succeeds, the
    plan that replays it is written (a read-only cache is a note): signed with `key` into the
    plan cache `cache` (`<cache>/<key id>/`; no usable key: not recorded, a note), or, with
    `unsigned` (`overlay prepare --out`), into `cache` itself, signed when there is a key."""
    root = Path(root)
    state = root / STATE_DIR
    first = not (state / LEDGER_FILE).exists() and not (state / JOURNAL_FILE).exists()
    why_not = None
    if cache and first and not dry_run:
        key, why_not = _signing_key(key, unsigned)
    record_now = bool(cache) and first and not dry_run and why_not is None
    inputs = {rel: _sha_or_absent(root / rel) for rel in input_paths(overlays)} if record_now else {}
    result = apply(overlays, root, dry_run=dry_run, explicit=explicit, wait=wait, on_wait=on_wait)
    if dry_run or not cache or not first or result.notes:
        return RecordedApply(result)
    if why_not is not None:
        return RecordedApply(result, None, f"plan not recorded in {cache}: {why_not}")
    out = Path(cache) if unsigned or key is None else Path(cache_plans(cache, key))  # type: ignore[arg-type]
    try:
        path = record(overlays, root, result, inputs, explicit=explicit, ids=ids, out=out,
                      key=key)  # type: ignore[arg-type]
    except (OSError, PlanRefused) as exc:
        return RecordedApply(result, None, f"plan not recorded in {cache}: {exc}")
    return RecordedApply(result, str(path))


def record(
    overlays: Sequence[Overlay], root: Path, result: ApplyResult, inputs: dict[str, str], *,
    explicit: bool, ids: Iterable[str], out: Path, key: PlanKey | None = None,
) -> Path:
    """Write the plan of the first apply just made (`inputs`: the hashes read before it), signed
    with `key` when given."""
    led = dict(Ledger.load(Path(root)).data)  # the ledger just written, read (and validated) by its owner
    led.pop("updated_at", None)
    by_id = {o.id: o for o in overlays}
    wanted = list(dict.fromkeys(ids)) or [o.id for o in overlays]
    writes = []
    for c in result.changes:
        pre = ABSENT if c.before is None else sha256_bytes(c.before)
        if inputs.get(c.path) != pre:
            raise PlanRefused(f"{c.path} changed while the engine applied")
        hunks = [] if c.after is None else _hunks(c.before or b"", c.after)
        if c.after is not None and apply_hunks(c.before or b"", hunks, c.path) != c.after:
            raise PlanRefused(f"{c.path}: the hunks do not reproduce the bytes written")
        writes.append({"path": c.path, "pre_sha256": pre,
                       "post_sha256": ABSENT if c.after is None else sha256_bytes(c.after), "hunks": hunks})
    plan = {
        "format": FORMAT,
        "tool_version": __version__,
        "package_version": result.package_version,
        "explicit": bool(explicit),
        "requested": sorted(wanted),
        "overlays": [{"id": o.id, "digest": o.digest} for o in overlays],
        "inputs": dict(sorted(inputs.items())),
        "writes": writes,
        "ledger": led,
        "report": {
            "changes": [[c.verb, c.path, list(c.overlays)] for c in result.changes],
            "skipped": [list(s) for s in result.skipped],
        },
    }
    check_plan(plan, f"plan of the apply on {root}")
    stem = plan_key(result.package_version, explicit, {i: by_id[i].digest for i in wanted})
    if key is not None:
        plan = sign(plan, stem, key)
    data = (json.dumps(plan, indent=1, sort_keys=True) + "\n").encode()
    if key is not None and mac_problem(json.loads(data), stem, key) is not None:  # what a reader will parse
        raise PlanRefused(f"plan of the apply on {root}: its signature does not survive a JSON round trip")
    Path(out).mkdir(parents=True, exist_ok=True)
    path = Path(out) / (stem + ".json")
    atomic_write(path, data)
    return path


def prepare(
    every: Sequence[Overlay], versions: Sequence[str], ids: Sequence[str], out: Path,
    key: PlanKey | str | None = FROM_ENV,
) -> tuple[PreparedPlan, ...]:
    """For each release, the plan of `overlay apply [IDS]` on its pristine sources, into `out`,
    signed with `key` (default: `$OVERLAY_PLAN_KEY`'s; None or no such key: unsigned).

    The engine applies on a scratch root holding the release's dist-info and every input
    file of the selected overlays (the engine reads nothing else under a root)."""
    from ..releases import pristine_tree

    selected = select(every, ids)
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OverlayError(f"--out {out}: cannot create the directory: {exc.strerror}") from None
    made = []
    for version in dict.fromkeys(versions):
        src = pristine_tree(version)
        with tempfile.TemporaryDirectory(prefix=f"overlay-prepare-{version}-") as tmp:
            root = Path(tmp)
            for info in src.glob("vllm-*.dist-info"):
                shutil.copytree(info, root / info.name)
            (root / "vllm").mkdir()
            for rel in input_paths(selected):
                if (src / rel).is_file():
                    (root / rel).parent.mkdir(parents=True, exist_ok=True)
                    (root / rel).write_bytes((src / rel).read_bytes())
            rec = apply_and_record(selected, root, explicit=bool(ids), ids=ids, cache=str(out), key=key, unsigned=True)
            if rec.plan is None:
                raise OverlayError(f"vllm {version}: {rec.note or 'no plan recorded'}")
            made.append(PreparedPlan(
                version, rec.plan, tuple(c.path for c in rec.result.changes),
                tuple((o.id, o.status) for o in rec.result.statuses.overlays),
            ))
    return tuple(made)
