"""Prepared plans: the full engine's first apply, recorded once, replayed at container start.

For a request (`overlay apply [IDS]` on package version V with tool version T) the engine's
output is a pure function of the bytes of the files it reads (every target and probe
target: their sha256 are the plan's *inputs*, the base hash H) and of the overlay
directories (their digests D). A plan stores, for one request, H, D, the exact bytes the
engine wrote (as hunks against the base bytes, each write with its expected result hash)
and the ledger the engine left. `apply_plan` (standard library only: it runs in
`manager.fastpath` before click, rich, pydantic, yaml or libcst load) replays it with the
engine's transaction: lock, originals stored, journal, atomic replace of each file, ledger
last, journal removed; `overlay revert` then restores the original bytes exactly.

A plan is used only on a first apply (no ledger, no journal under the root), when every
input hash and every overlay digest match and each write's result hash verifies. Anything
else returns None and the caller runs the full engine; a plan that fails its own checks
(tampered or corrupt) is refused with one line on stderr naming the file and why.

Who wrote it: manager.overlays.plankey (with a plan key, only plans whose HMAC verifies under
it; without, no plan cache, and `--plans`/`$OVERLAY_PLANS` plans are used unsigned, as said).

Plans live in directories: `overlay prepare --out DIR` and `overlay bundle` write them
(`DIR/<key>.json`), `--plans DIR` / `$OVERLAY_PLANS` (os.pathsep-separated) are read, and
`$OVERLAY_PLAN_CACHE` is read and also filled by a full-engine first apply (`<cache>/<key id>/`).

Only the standard library here; recording and `overlay prepare` (the engine) are in
`manager.overlays.prepare`.

The durable write transaction the replay uses is `manager.overlays.durable`.

Size: just over 400 lines: finding, checking (scope, hashes, the plan key through plankey.py) and replaying a
plan are one job that must stay in one module the warm start imports without `typing` or `re`.
"""

from __future__ import annotations

import json
import os
import sys

from .. import __version__
from ..state import (
    ABSENT, JOURNAL_FILE, LEDGER_FILE, STATE_DIR, UnreadableFile, catalog_overlay_ids, overlay_digest, package_version,
    journal_entry, read_bounded, validate_ledger,
)
from ..state import sha256 as _sha256
from .durable import transaction
from .plankey import ENV_CACHE, PlanKey, PlanKeyError, cache_dir, cache_plans, key_from_env, signature
from .targets import manifest_targets

TYPE_CHECKING = False  # not typing's: `typing` imports `re`, which the warm plan replay never loads
if TYPE_CHECKING:
    from typing import Any

FORMAT = "overlay-manager-plan/1"
ENV_PLANS = "OVERLAY_PLANS"
PLAN_MAX = 64 << 20  # a plan holds hunks of a few source files: far below this


class PlanRefused(Exception):
    """A plan that does not verify (tampered, corrupt, not signed with the key, naming a path outside the root)."""

    verb = "refused"


class PlanNotUsed(PlanRefused):
    """A plan that may exist but is not looked at (no plan key for the plan cache, an unusable key)."""

    verb = "no plan"


# --- keys and lookup -------------------------------------------------------------------------


def plan_key(package_version_: str | None, explicit: bool, requested: dict[str, str]) -> str:
    """The file name stem of the plan for a request: tool version, package version, whether
    the ids were named, and (id, digest) of every requested overlay."""
    raw = json.dumps([FORMAT, __version__, package_version_, bool(explicit), sorted(requested.items())])
    return str(_sha256(raw.encode()).hexdigest())


def plan_dirs(arg: str | None = None) -> list[str]:
    """The plans named explicitly: --plans DIR, then $OVERLAY_PLANS (os.pathsep list); never the cache."""
    out = []
    cache = cache_dir()
    for raw in [arg, *(os.environ.get(ENV_PLANS) or "").split(os.pathsep)]:
        if raw:
            d = os.path.realpath(os.path.expanduser(raw))
            if d not in out and d != cache:
                out.append(d)
    return out


def _check_rel(path: object, where: str) -> str:
    """A plan's path: relative, '/'-separated, no '.'/'..'/empty parts, not the state directory."""
    if not isinstance(path, str) or not path or path.startswith("/") or "\\" in path or "\0" in path:
        raise PlanRefused(f"{where}: path {path!r} is not a relative path inside the root")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts) or parts[0] == STATE_DIR:
        raise PlanRefused(f"{where}: path {path!r} is not a relative path inside the root")
    return path


def _inside(root: str, rel: str, where: str) -> str:
    """root/rel, refused when it resolves (symlinks included) outside the root."""
    real_root = os.path.realpath(root)
    full = os.path.realpath(os.path.join(real_root, rel))
    if not full.startswith(real_root + os.sep):
        raise PlanRefused(f"{where}: {rel} resolves outside the root ({full})")
    return os.path.join(root, rel)


def apply_hunks(base: bytes, hunks: list[Any], where: str) -> bytes:
    """base with each [start, end, text] replaced (byte offsets into base, ascending)."""
    out, pos = [], 0
    for h in hunks:
        if not (isinstance(h, list) and len(h) == 3 and isinstance(h[0], int) and isinstance(h[1], int)
                and isinstance(h[2], str) and pos <= h[0] <= h[1] <= len(base)):
            raise PlanRefused(f"{where}: malformed hunk {str(h)[:60]!r}")
        out.append(base[pos:h[0]])
        out.append(h[2].encode("utf-8"))
        pos = h[1]
    out.append(base[pos:])
    return b"".join(out)


def check_plan(plan: object, where: str) -> dict[str, Any]:
    """Structure and internal consistency of a loaded plan (raises PlanRefused)."""
    if not isinstance(plan, dict) or plan.get("format") != FORMAT:
        raise PlanRefused(f"{where}: not an {FORMAT} plan")
    for key, typ in (("overlays", list), ("inputs", dict), ("writes", list), ("ledger", dict), ("requested", list)):
        if not isinstance(plan.get(key), typ):
            raise PlanRefused(f"{where}: '{key}' missing or not a {typ.__name__}")
    inputs = plan["inputs"]
    for rel, sha in inputs.items():
        _check_rel(rel, where)
        if not isinstance(sha, str):
            raise PlanRefused(f"{where}: inputs[{rel!r}] is not a hash")
    led = plan["ledger"]
    try:  # the shapes are the ledger's own (manager.state); what follows checks it against the plan
        validate_ledger(led)
    except ValueError as exc:
        raise PlanRefused(f"{where}: the ledger it carries is malformed: {exc}") from None
    if led.get("tool_version") != plan.get("tool_version") or led.get("package_version") != plan.get("package_version"):
        raise PlanRefused(f"{where}: the ledger's tool/package version differs from the plan's")
    ids = []
    for o in plan["overlays"]:
        if not (isinstance(o, dict) and isinstance(o.get("id"), str) and isinstance(o.get("digest"), str)):
            raise PlanRefused(f"{where}: malformed overlays entry")
        ids.append(o["id"])
        if "/" in o["id"] or o["id"].startswith("."):
            raise PlanRefused(f"{where}: overlay id {o['id']!r} is not a directory name")
    records = led.get("overlays", {})
    if sorted(records) != sorted(ids):
        raise PlanRefused(f"{where}: the ledger's overlays differ from the plan's")
    for o in plan["overlays"]:
        if records[o["id"]].get("digest") != o["digest"]:
            raise PlanRefused(f"{where}: the ledger's digest of {o['id']} differs from the plan's")
    written = {}
    for w in plan["writes"]:
        if not isinstance(w, dict):
            raise PlanRefused(f"{where}: malformed writes entry")
        rel = _check_rel(w.get("path"), where)
        if rel not in inputs or w.get("pre_sha256") != inputs[rel] or not isinstance(w.get("post_sha256"), str):
            raise PlanRefused(f"{where}: write of {rel} does not start from a recorded input hash")
        if not isinstance(w.get("hunks"), list):
            raise PlanRefused(f"{where}: write of {rel} has no hunks")
        written[rel] = w["post_sha256"]
    files = led.get("files", {})
    if sorted(files) != sorted(written):
        raise PlanRefused(f"{where}: the ledger's files differ from the plan's writes")
    for rel, rec in files.items():
        if rec["base_sha256"] != inputs[rel] or rec["post_sha256"] != written[rel]:
            raise PlanRefused(f"{where}: the ledger's record of {rel} differs from the plan's write")
    for rel, sha in led.get("observed", {}).items():
        _check_rel(rel, where)
        if sha != written.get(rel, inputs.get(rel)):
            raise PlanRefused(f"{where}: the ledger's observed hash of {rel} is neither its input nor its result")
    return plan


# --- the stdlib transaction ------------------------------------------------------------------
#
def _requested(catalog: str, ids: list[str]) -> tuple[dict[str, str], bool] | None:
    """{id: digest} of the requested overlays (every catalog overlay when no ids), explicit."""
    overlays_dir = os.path.join(catalog, "overlays")
    every = catalog_overlay_ids(overlays_dir)
    if every is None:
        return None
    wanted = list(dict.fromkeys(ids)) if ids else every
    if any(i not in every for i in wanted):
        return None
    return {i: overlay_digest(os.path.join(overlays_dir, i)) for i in wanted}, bool(ids)


def _read_inputs(root: str, inputs: dict[str, str]) -> tuple[dict[str, bytes | None], list[Any]] | None:
    """(bytes of every input file (None: absent), their stat signatures), or None when a hash
    differs from the plan's."""
    out: dict[str, bytes | None] = {}
    sigs: list[tuple[int, int, int, int] | None] = []
    for rel, want in inputs.items():
        path = os.path.join(root, rel)
        try:  # non-blocking, fstat()ed, bounded: a FIFO, a device or a huge file -> the engine decides
            data: bytes | None = read_bounded(path)
            st = os.stat(path)
            sigs.append((st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        except (FileNotFoundError, NotADirectoryError):
            data = None
            sigs.append(None)
        except OSError:  # UnreadableFile (not a regular file, too large) or any read error
            return None
        if (ABSENT if data is None else _sha256(data).hexdigest()) != want:
            return None
        out[rel] = data
    return out, sigs


def _signatures(root: str, inputs: dict[str, str]) -> list[Any]:
    sigs: list[Any] = []
    for rel in inputs:
        try:
            st = os.stat(os.path.join(root, rel))
        except (FileNotFoundError, NotADirectoryError):
            sigs.append(None)
            continue
        is_dir = (st.st_mode & 0o170000) == 0o040000
        sigs.append(None if is_dir else (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return sigs


def find_plan(dirs: list[str], key: str) -> tuple[str, dict[str, Any]] | None:
    """The first readable `<dir>/<key>.json` (raises PlanRefused when it is not valid JSON, or
    not a regular file of at most PLAN_MAX bytes: a FIFO there never blocks)."""
    for d in dirs:
        path = os.path.join(d, key + ".json")
        try:
            raw = read_bounded(path, PLAN_MAX)
        except UnreadableFile as exc:
            raise PlanRefused(f"{path}: {exc}") from None
        except OSError:
            continue
        try:
            return path, json.loads(raw)
        except (ValueError, RecursionError):
            raise PlanRefused(f"{path}: not valid JSON") from None
    return None


def apply_plan(catalog: str, root: str, ids: list[str], dirs: list[str], *, cache: str | None = None,
               key: PlanKey | None = None) -> dict[str, Any] | None:
    """Apply the matching prepared plan as the engine's first apply would, or return None.

    `dirs` (--plans, $OVERLAY_PLANS) first, then the plan cache under `key`'s id; with a `key`, only
    a plan signed with it; without one, no cache (PlanNotUsed), and a plan of `dirs` unsigned.

    Returns {"plan": path, "changes": [(verb, path, ids)], "statuses": [(id, status)],
    "skipped": [(id, why)], "signed": key id or None, "auth": what the printed line says of
    it}. Raises PlanRefused for a plan that matches the request but does not verify; nothing
    under the root has changed then.
    """
    if not dirs and not cache:
        return None
    state = os.path.join(root, STATE_DIR)
    ledger_path, journal_path = os.path.join(state, LEDGER_FILE), os.path.join(state, JOURNAL_FILE)
    if os.path.exists(ledger_path) or os.path.exists(journal_path):
        return None  # not a first apply: the warm path or the engine decides
    version = package_version(root)
    req = _requested(catalog, ids)
    if req is None:
        return None
    requested, explicit = req
    stem = plan_key(version, explicit, requested)
    found = find_plan(dirs, stem)
    if found is None and cache:
        if key is None:
            raise PlanNotUsed(f"plan cache {cache} (${ENV_CACHE}): not used: no plan key is configured "
                              "($OVERLAY_PLAN_KEY), and only plans signed with it are taken from the cache")
        found = find_plan([cache_plans(cache, key)], stem)
    if found is None:
        return None
    where, plan = found
    problem, auth = signature(plan, stem, key)  # who wrote it, before anything it says is believed
    if problem is not None:
        raise PlanRefused(f"{where}: {problem}")
    check_plan(plan, where)
    if (plan.get("tool_version") != __version__ or plan.get("package_version") != version
            or bool(plan.get("explicit")) != explicit or sorted(plan["requested"]) != sorted(requested)):
        raise PlanRefused(f"{where}: made for another request (tool, package version or overlays)")
    overlays_dir = os.path.join(catalog, "overlays")
    for o in plan["overlays"]:
        want = requested.get(o["id"])
        if want is None:
            d = os.path.join(overlays_dir, o["id"])
            want = overlay_digest(d) if os.path.isfile(os.path.join(d, "overlay.yaml")) else None
        if want != o["digest"]:
            return None  # a required overlay changed in this catalog: the engine decides
    if not explicit and sorted(o["id"] for o in plan["overlays"]) != sorted(requested):
        return None
    led = plan["ledger"]
    # scope: a plan writes only targets of the overlays it applies (their manifests, read from
    # this catalog, whose digests matched), each recorded under overlays that list it
    targets = {}
    for o in plan["overlays"]:
        t = manifest_targets(os.path.join(overlays_dir, o["id"]))
        if t is None:
            return None
        targets[o["id"]] = t
    for rel, rec in led.get("files", {}).items():
        owners = list(rec["overlays"])
        if not owners or any(rel not in targets.get(i, ()) for i in owners):
            raise PlanRefused(f"{where}: writes {rel}, which is not a target of "
                              f"{', '.join(owners) or 'any overlay it applies'}")
    for rel in plan["inputs"]:
        _inside(root, rel, where)
    read = _read_inputs(root, plan["inputs"])
    if read is None:
        return None  # a hand-edited image or another release: the engine decides
    base, sigs = read
    new: dict[str, bytes | None] = {}
    for w in plan["writes"]:  # every result verified before anything is written
        rel = w["path"]
        if w["post_sha256"] == ABSENT:
            new[rel] = None
            continue
        data = apply_hunks(base[rel] or b"", w["hunks"], where)
        if _sha256(data).hexdigest() != w["post_sha256"]:
            raise PlanRefused(f"{where}: result hash mismatch for {rel} (tampered or corrupt plan)")
        for oid in led["files"][rel]["overlays"]:  # each overlay recorded on a file left its sentinel
            if b"overlay:" + oid.encode() + b" v" not in data:
                raise PlanRefused(f"{where}: the result for {rel} carries no block of {oid}")
        new[rel] = data
    # where each write lands: through an in-root file symlink, as the engine writes (the link is kept)
    paths = {}
    for rel, written in new.items():
        full = os.path.join(root, rel)
        if os.path.islink(full):
            if written is None:
                return None  # the engine refuses to delete a symlink or its target, in one line
            paths[rel] = os.path.realpath(full)
    state_made = not os.path.isdir(state)
    os.makedirs(state, exist_ok=True)
    from .lock import root_lock

    # the engine's lock (names its holder); a busy lock is not waited for here: the full CLI waits visibly
    with root_lock(state, wait=0):
        if os.path.exists(ledger_path) or os.path.exists(journal_path):
            return None  # another apply finished first
        if _signatures(root, plan["inputs"]) != sigs:  # changed since read (inode, size, times)
            read = _read_inputs(root, plan["inputs"])
            if read is None or read[0] != base:
                return None  # the engine decides
        led = plan["ledger"]
        journal = {}
        for rel in new:
            rec = led["files"][rel]
            journal[rel] = journal_entry(rec["base_sha256"], plan["inputs"][rel], rec["post_sha256"], rec["overlays"])
        import time

        ledger = dict(led)
        ledger["updated_at"] = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
        transaction(root, state, new, base, plan["inputs"], journal, ledger, state_made, paths)
    # what is printed is what was written (never the plan's own report): one line per write
    order = [o["id"] for o in plan["overlays"]]
    changes = []
    for w in plan["writes"]:
        rel = w["path"]
        verb = "create" if w["pre_sha256"] == ABSENT else "delete" if w["post_sha256"] == ABSENT else "updated"
        owners = led["files"][rel]["overlays"]
        changes.append((verb, rel, [i for i in order if i in owners]))
    report: dict[str, Any] = plan["report"] if isinstance(plan.get("report"), dict) else {}
    written_by = {i for _, _, ids_ in changes for i in ids_}
    skipped = [(s[0], s[1]) for s in report.get("skipped", []) if isinstance(s, list) and len(s) == 2
               and isinstance(s[0], str) and isinstance(s[1], str) and s[0] in requested and s[0] not in written_by]
    return {
        "plan": where,
        "changes": changes,
        "statuses": [(i, led["overlays"][i].get("status", "?")) for i in order],
        "skipped": skipped,
        "signed": key.key_id if key is not None else None,
        "auth": auth,
    }


# --- the fast path's entry --------------------------------------------------------------


def main_apply(argv_parsed: tuple[str | None, str | None, list[str], str | None]) -> dict[str, Any] | None:
    """fastpath: the plan apply for `[--catalog C] apply [IDS] [--root R] [--plans D]`, or None."""
    from ..state import catalog_dir as _catalog_dir, vllm_root as _root

    catalog_arg, root_arg, ids, plans_arg = argv_parsed
    dirs, cache = plan_dirs(plans_arg), cache_dir()
    if not dirs and not cache:
        return None
    catalog, root = _catalog_dir(catalog_arg), _root(root_arg)
    if catalog is None or root is None or not os.path.isdir(os.path.join(root, "vllm")):
        return None
    try:
        try:
            key = key_from_env()
        except PlanKeyError as exc:  # configured but unusable: no plan at all (never an unsigned one)
            raise PlanNotUsed(f"{exc}; no prepared plan is used") from None
        return apply_plan(catalog, root, ids, dirs, cache=cache, key=key)
    except PlanRefused as exc:
        sys.stderr.write(f"{exc.verb:>12}  {exc}; running the full engine\n")
        return None
