"""Making prepared plans with the full engine: `overlay prepare`, and the plan of a first apply.

A plan (format and replay: `manager.overlays.plans`) is always the record of a real engine
apply: `prepare` runs the engine on a scratch root holding the release's input files (the
pristine sources from `manager.releases`), and `record_plan` records the first apply that
`manager.overlays.applying` (the apply entry) just made on a live root. Nothing here computes
patched bytes on its own.

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
from ..state import ABSENT, read_bounded
from .loader import Overlay, select
from .transaction import apply
from .model import ApplyResult
from .plankey import ENV_KEY, PlanKey, PlanKeyError, cache_plans, key_from_env, mac_problem, sign
from .plans import FORMAT, PlanRefused, apply_hunks, check_plan, plan_key

FROM_ENV = "from $OVERLAY_PLAN_KEY"  # applying.apply_and_record / prepare: the key the environment names


@dataclass(frozen=True)
class PreparedPlan:
    version: str
    path: str
    changes: tuple[str, ...]  # the files the plan writes
    statuses: tuple[tuple[str, str], ...]  # (overlay id, status after the apply)


def _hunks(before: bytes, after: bytes) -> list[list[int | str]]:
    """[start, end, text] against `before` (line-level, byte offsets) that turn it into `after`."""
    import difflib  # only when recording: not on every apply's import path

    a, b = before.splitlines(keepends=True), after.splitlines(keepends=True)
    offsets = [0]
    for line in a:
        offsets.append(offsets[-1] + len(line))
    out: list[list[int | str]] = []
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


def input_hashes(overlays: Sequence[Overlay], root: Path) -> dict[str, str]:
    """The plan's inputs: the hash of every file the engine reads for these overlays, read before it applies."""
    return {rel: _sha_or_absent(Path(root) / rel) for rel in input_paths(overlays)}


def signing_key(key: PlanKey | str | None, unsigned: bool) -> tuple[PlanKey | None, str | None]:
    """(the key to sign with, or why nothing is recorded)."""
    if key == FROM_ENV:
        try:
            key = key_from_env()
        except PlanKeyError as exc:
            return None, str(exc)
    if key is None and not unsigned:
        return None, (f"no plan key is configured (${ENV_KEY}), and the plan cache holds only signed plans")
    return key, None  # type: ignore[return-value]


def record_plan(
    overlays: Sequence[Overlay], root: Path, result: ApplyResult, inputs: dict[str, str], *, explicit: bool,
    ids: Iterable[str], cache: str, key: PlanKey | None, unsigned: bool,
) -> tuple[str | None, str | None]:
    """Record the plan of the first apply just made: signed with `key` into the plan cache `cache`
    (`<cache>/<key id>/`), or, `unsigned`, into `cache` itself. (the plan file, None) or (None, why not)."""
    out = Path(cache) if unsigned or key is None else Path(cache_plans(cache, key))
    try:
        path = record(overlays, root, result, inputs, explicit=explicit, ids=ids, out=out, key=key)
    except (OSError, PlanRefused) as exc:
        return None, f"plan not recorded in {cache}: {exc}"
    return str(path), None


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
    made: list[PreparedPlan] = []
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
            signing, why_not = signing_key(key, unsigned=True)
            inputs = input_hashes(selected, root)
            result = apply(selected, root, explicit=bool(ids))
            plan: str | None = None
            note = None if why_not is None else f"plan not recorded in {out}: {why_not}"
            if why_not is None and not result.notes:
                plan, note = record_plan(selected, root, result, inputs, explicit=bool(ids), ids=ids, cache=str(out),
                                         key=signing, unsigned=True)
            if plan is None:
                raise OverlayError(f"vllm {version}: {note or 'no plan recorded'}")
            made.append(PreparedPlan(
                version, plan, tuple(c.path for c in result.changes),
                tuple((o.id, o.status) for o in result.statuses.overlays),
            ))
    return tuple(made)
