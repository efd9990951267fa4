"""What the restart path, the engine, the ledger and the CLI agree on, in the standard library only.

A leaf: it imports nothing from the package at module level (the catalog lookup is imported
when asked for), so `manager.fastpath` and `manager.overlays.plans` can read it before click,
rich, pydantic, yaml or libcst load, and every library module can import it without reaching
the entry point.

- `overlay_digest` / `package_version`: the fingerprints the ledger records and checks.
- `STATE_DIR`, `LEDGER_FILE`, `JOURNAL_FILE`, `ORIGINALS_DIR`, `ABSENT`: the state directory
  under a package root and its files.
- `APPLY_SKIPS` / `SKIP_UNLESS_NAMED`: the overlay statuses `apply` leaves alone.
- `catalog_dir` / `vllm_root`: where a `--catalog` / `--root` argument (or their defaults) point.
- The ledger/journal format, owned here only: the record shapes (`LedgerFile`, `JournalEntry`,
  `OverlayRecord`, typed for checkers), their constructors (`journal_entry`, `ledger_file`,
  `overlay_record`), their validation (`validate_ledger`, `validate_journal`, `check_rel_path`)
  and the warm no-op decision (`warm_records`) the restart path and `status` ask. `Ledger` writes ledger.json.
"""

from __future__ import annotations

import os
import stat
import sys

TYPE_CHECKING = False  # not typing's: `typing` imports `re`, which the warm no-op never loads (tests/test_fastpath.py)
if TYPE_CHECKING:  # annotations only: the leaf imports nothing of the package when it runs
    from .overlays.model import Status

try:  # the builtin module: no OpenSSL load (~3 ms of every container start)
    from _sha256 import sha256 as sha256  # type: ignore[import-not-found,unused-ignore]  # Python <= 3.11
except ImportError:  # pragma: no cover - Python >= 3.12 names it _sha2
    try:
        from _sha2 import sha256 as sha256  # type: ignore[import-not-found,no-redef,unused-ignore]
    except ImportError:
        from hashlib import sha256 as sha256  # type: ignore[assignment,unused-ignore]

STATE_DIR = ".overlay-manager"  # under the package root
LEDGER_FILE = "ledger.json"
JOURNAL_FILE = "journal.json"
ORIGINALS_DIR = "originals"
ABSENT = "absent"  # the recorded hash of a file that does not exist

# apply skips these: the overlay needs nothing written. When its ids were named, a
# superseded/missing-target overlay is an error (reported by the full CLI); unnamed, it is skipped.
APPLY_SKIPS: frozenset[Status] = frozenset({"applied", "upstream", "not-applicable"})
SKIP_UNLESS_NAMED: frozenset[Status] = frozenset({"superseded", "missing-target"})

# compiled on first use (re's cache), and `re` imported then: the warm no-op never reads a
# _version.py, and a bare python (an image's) does not import re at start-up (~5 ms)
_VERSION_RE = r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]"""


MAX_READ = 256 << 20  # the largest file any reader here takes whole (a target, a plan, a state file)

_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"}


class UnreadableFile(OSError):
    """A path that is not a regular file (FIFO, device, socket, directory) or is over a size bound.

    An OSError, so every existing `except OSError` (a skipped plan, one error line) applies;
    `str()` is the reason without the path."""

    def __str__(self) -> str:
        return self.strerror or "unreadable"


def read_bounded(path: str, limit: int = MAX_READ) -> bytes:
    """The bytes of a regular file of at most `limit` bytes, never blocking.

    Opened non-blocking and fstat()ed before any read: a FIFO, a device (a `/dev/zero`
    symlink), a socket or a directory raises UnreadableFile, as does a file over `limit` (also
    one that grows past it while read). FileNotFoundError when it does not exist."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except IsADirectoryError:
        raise UnreadableFile(21, "is a directory, not a regular file") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = _KINDS.get(stat.S_IFMT(st.st_mode), "a special file")
            raise UnreadableFile(22, f"is {kind}, not a regular file")
        if st.st_size > limit:
            raise UnreadableFile(27, f"is {st.st_size} bytes, over the {limit}-byte limit")
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise UnreadableFile(27, f"grew past the {limit}-byte limit while read")
        return b"".join(chunks)
    finally:
        os.close(fd)


def overlay_digest(overlay_dir: os.PathLike[str] | str) -> str:
    """sha256 over an overlay directory: the manifest and every file it may read.

    Only regular files inside the directory are read (bounded): a symlink is hashed as its link
    text (never followed: one pointing outside is refused when an edit reads it), and a FIFO,
    device or socket by its kind, so hashing can neither block nor read the host."""
    base = os.fspath(overlay_dir)
    files: list[str] = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        files.extend(os.path.join(dirpath, f) for f in filenames)
        files.extend(os.path.join(dirpath, d) for d in dirnames if os.path.islink(os.path.join(dirpath, d)))
    h = sha256()
    for path in sorted(files, key=lambda f: os.path.relpath(f, base).split(os.sep)):
        h.update(os.path.relpath(path, base).replace(os.sep, "/").encode() + b"\0")
        try:
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                data = b"symlink:" + os.fsencode(os.readlink(path))
            elif stat.S_ISREG(st.st_mode):
                data = read_bounded(path)
            else:
                data = b"special:" + _KINDS.get(stat.S_IFMT(st.st_mode), "special").encode()
        except OSError as exc:
            data = b"unreadable:" + str(exc).encode()
        h.update(data + b"\0")
    return str(h.hexdigest())


def package_version(root: os.PathLike[str] | str, package: str = "vllm") -> str | None:
    """The installed version, from the dist-info METADATA or `<package>/_version.py`."""
    root = os.fspath(root)
    prefix = package.replace("-", "_") + "-"
    try:
        infos = sorted(n for n in os.listdir(root) if n.startswith(prefix) and n.endswith(".dist-info"))
    except OSError:
        infos = []
    for info in infos:
        try:
            with open(os.path.join(root, info, "METADATA"), errors="replace") as fh:
                for line in fh:
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip()
                    if not line.strip():
                        break
        except OSError:
            continue
    import re

    try:
        with open(os.path.join(root, package, "_version.py"), errors="replace") as fh:
            m = re.search(_VERSION_RE, fh.read(), re.M)
    except OSError:
        return None
    return m.group(1) if m else None


def file_sha(path: str) -> str:
    """sha256 of a regular file; ABSENT when missing, "not-a-regular-file" for anything else
    (a FIFO, a device, a directory, a file over MAX_READ: never blocks, never reads unbounded)."""
    try:
        return str(sha256(read_bounded(path)).hexdigest())
    except (FileNotFoundError, NotADirectoryError):
        return ABSENT
    except UnreadableFile as exc:
        return ABSENT if exc.errno == 21 else "not-a-regular-file"  # matches no recorded hash


def catalog_overlay_ids(overlays_dir: str, *, any_kind: bool = False) -> list[str] | None:
    """Sorted ids of the catalog's overlays (folders with an overlay.yaml; `.`/`_` folders skipped), or None when
    unreadable. `any_kind`: an overlay.yaml that is not a regular file counts too (the loader then names it)."""
    present = os.path.lexists if any_kind else os.path.isfile
    try:
        return sorted(n for n in os.listdir(overlays_dir) if not n.startswith((".", "_"))
                      and present(os.path.join(overlays_dir, n, "overlay.yaml")))
    except OSError:
        return None


def catalog_dir(arg: str | None) -> str | None:
    """`--catalog DIR`, else $OVERLAY_CATALOG, else the shipped catalog (None when there is none)."""
    raw = arg or os.environ.get("OVERLAY_CATALOG")
    if raw:
        return os.path.realpath(os.path.expanduser(raw))
    from .catalog import default_catalog_dir

    found = default_catalog_dir()
    return os.fspath(found) if found is not None else None


def vllm_root(arg: str | None, package: str = "vllm") -> str | None:
    """`--root DIR`, else the directory holding the `package` on sys.path (not imported); None when not found.
    The one root finder: `overlays.root.find_root` is this plus the checks that raise."""
    if arg:
        return os.path.realpath(os.path.expanduser(arg))
    from importlib.machinery import PathFinder

    spec = PathFinder.find_spec(package, sys.path)
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.dirname(os.path.realpath(next(iter(spec.submodule_search_locations))))


# --- the ledger/journal format: record shapes, constructors, validation, the warm no-op ---------------------------
# ledger.json (written by `overlays.ledger.Ledger` only):
#   {"files": {rel: LedgerFile}, "overlays": {id: OverlayRecord}, "observed": {rel: sha256},
#    "package_version", "tool_version", "updated_at"}
# journal.json (an apply in progress): {rel: JournalEntry}
if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Mapping, Sequence
    from typing import Any, TypedDict

    class LedgerFile(TypedDict):
        base_sha256: str  # the original bytes (in originals/) or ABSENT
        post_sha256: str  # what the apply wrote
        overlays: dict[str, int]  # overlay id -> sentinel version

    class JournalEntry(LedgerFile):
        pre_sha256: str  # the bytes this apply replaced

    class TargetRecord(TypedDict):
        path: str
        status: str
        detail: str

    class OverlayRecord(TypedDict, total=False):
        version: int
        requires: list[str]
        digest: str
        status: str
        targets: list[TargetRecord]

LEDGER_FILE_KEYS = ("base_sha256", "post_sha256", "overlays")
JOURNAL_FILE_KEYS = ("base_sha256", "pre_sha256", "post_sha256", "overlays")
_HEX = frozenset("0123456789abcdef")


def journal_entry(base: str, pre: str, post: str, overlays: Mapping[str, int]) -> JournalEntry:
    """The journal's record of one file an apply is about to write."""
    return {"base_sha256": base, "pre_sha256": pre, "post_sha256": post, "overlays": dict(overlays)}


def ledger_file(entry: JournalEntry | LedgerFile) -> LedgerFile:
    """The ledger's record of a file written under `entry` (a journal entry or a ledger record)."""
    return {"base_sha256": entry["base_sha256"], "post_sha256": entry["post_sha256"],
            "overlays": dict(entry["overlays"])}


def overlay_record(version: int, requires: Sequence[str], digest: str, status: str,
                   targets: Sequence[tuple[str, str, str]]) -> OverlayRecord:
    """The ledger's record of one overlay after an apply: `targets` as (path, status, detail)."""
    return {"version": version, "requires": list(requires), "digest": digest, "status": status,
            "targets": [{"path": p, "status": s, "detail": d} for p, s, d in targets]}


def check_rel_path(rel: object) -> str | None:
    """Why `rel` is not a relative path inside a root (None when it is one)."""
    if not isinstance(rel, str) or not rel:
        return "not a non-empty string"
    if rel.startswith("/") or "\\" in rel or (len(rel) > 1 and rel[1] == ":"):
        return "an absolute path"
    if ".." in rel.split("/"):
        return "a path with '..'"
    if "\0" in rel:
        return "a path with a NUL byte"
    return None


def is_sha256(value: object, absent_ok: bool = True) -> bool:
    """A lowercase hex sha256 (or ABSENT when `absent_ok`)."""
    return isinstance(value, str) and ((len(value) == 64 and _HEX.issuperset(value)) or (absent_ok and value == ABSENT))


def _check_sha(where: str, value: object, absent_ok: bool = True) -> None:
    if not is_sha256(value, absent_ok):
        raise ValueError(f"{where}: {value!r} is not a sha256{' or ' + repr(ABSENT) if absent_ok else ''}")


def _check_files(where: str, files: object, keys: tuple[str, ...]) -> None:
    if not isinstance(files, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(files).__name__}")
    for rel, rec in files.items():
        why = check_rel_path(rel)
        if why:
            raise ValueError(f"{where}: {rel!r} is {why}, not a path inside the root")
        at = f"{where}[{rel!r}]"
        if not isinstance(rec, dict):
            raise ValueError(f"{at}: expected a mapping, got {type(rec).__name__}")
        for k in keys:
            if k not in rec:
                raise ValueError(f"{at}: missing key {k!r}")
        for k in keys:
            if k.endswith("sha256"):
                _check_sha(f"{at}.{k}", rec[k])
        ov = rec["overlays"]
        if not isinstance(ov, dict) or not all(isinstance(i, str) and type(v) is int for i, v in ov.items()):
            raise ValueError(f"{at}.overlays: expected a mapping of overlay id -> sentinel version")


def validate_ledger(data: object) -> dict[str, Any]:
    """The one schema of ledger.json, checked on every read and every write.

    `files`, `overlays` and `observed` may be absent (= empty); present, they must have their
    shapes, and every file key must be a relative path without '..'. Raises ValueError naming
    the key and the value."""
    if not isinstance(data, dict):
        raise ValueError(f"(top): expected a mapping, got {type(data).__name__}")
    _check_files("files", data.get("files", {}), LEDGER_FILE_KEYS)
    overlays = data.get("overlays", {})
    if not isinstance(overlays, dict) or not all(isinstance(v, dict) for v in overlays.values()):
        raise ValueError("overlays: expected a mapping of overlay id -> record")
    for oid, rec in overlays.items():
        targets = rec.get("targets", [])
        if not isinstance(rec.get("status"), str) or not isinstance(targets, list) or not all(
            isinstance(t, dict) and set(t) == {"path", "status", "detail"} for t in targets
        ):
            raise ValueError(f"overlays[{oid!r}]: needs 'status' and 'targets' [{{path, status, detail}}]")
        if not targets:  # every manifest has a target: an empty list would vouch for files never checked
            raise ValueError(f"overlays[{oid!r}]: targets is empty (every overlay record lists its targets)")
    observed = data.get("observed", {})
    if not isinstance(observed, dict):
        raise ValueError(f"observed: expected a mapping, got {type(observed).__name__}")
    for rel, sha in observed.items():
        why = check_rel_path(rel)
        if why:
            raise ValueError(f"observed: {rel!r} is {why}, not a path inside the root")
        _check_sha(f"observed[{rel!r}]", sha)
    for k in ("package_version", "tool_version", "updated_at"):
        if data.get(k) is not None and not isinstance(data[k], str):
            raise ValueError(f"{k}: {data[k]!r} is not a string")
    return data


def validate_journal(data: object) -> dict[str, JournalEntry]:
    """The schema of journal.json (rel path -> base/pre/post hashes and overlays), read and write."""
    _check_files("(top)", data, JOURNAL_FILE_KEYS)
    return data  # type: ignore[return-value]


def _dumps(data: object) -> bytes:
    import json  # here, not at the top: json compiles regular expressions, which the warm no-op never needs

    return json.dumps(data, indent=2, sort_keys=True).encode()


def ledger_bytes(data: object) -> bytes:
    """ledger.json's bytes (validated first: never write what the next run would call corrupt); the engine's
    `Ledger.save` and the plan replay write these, nothing else."""
    try:
        validate_ledger(data)
    except ValueError as exc:  # a bug
        raise AssertionError(f"refusing to write an invalid ledger: {exc}") from None
    return _dumps(data) + b"\n"


def journal_bytes(entries: object) -> bytes:
    """journal.json's bytes (validated first), for the engine's `Ledger.write_journal` and the plan replay."""
    try:
        validate_journal(entries)
    except ValueError as exc:  # a bug
        raise AssertionError(f"refusing to write an invalid journal: {exc}") from None
    return _dumps(entries)


def warm_records(ledger: object, version: str | None, journal_exists: bool, wanted: Sequence[str],
                 digest_of: Callable[[str], str | None], sha_of: Callable[[str], str | None], *,
                 quiet: Collection[str] | None = None, known: Collection[str] | None = None,
                 targets_of: Callable[[str], Sequence[str]] | None = None) -> list[tuple[str, OverlayRecord]] | None:
    """The warm no-op decision, one for the restart path and `status`: [(id, its ledger record)] when the ledger
    still vouches for every `wanted` overlay, None at any doubt.

    It does when the ledger is for this package `version`, no journal is left, and for each overlay its record has
    the digest `digest_of(id)`, lists targets, and every target's `sha_of(path)` is the observed hash. `quiet`: the
    statuses allowed (else any). `known`: follow each record's `requires` too, each id in `known`. `targets_of`:
    the paths to check (the manifest's, where it is loaded), else those the record lists."""
    if not isinstance(ledger, dict) or not ledger or journal_exists or ledger.get("package_version") != version:
        return None
    records = ledger.get("overlays", {})
    observed = ledger.get("observed", {})
    want = list(wanted)
    if known is not None:  # a named overlay brings the ones it requires (as recorded with it)
        i = 0
        while i < len(want):
            rec = records.get(want[i])
            if rec is None or want[i] not in known:
                return None
            want.extend(r for r in rec.get("requires", []) if r not in want)
            i += 1
    out = []
    for oid in want:
        rec = records.get(oid)
        # a record vouching for no file (no targets) is no proof of anything
        if not rec or not rec.get("targets") or (quiet is not None and rec.get("status") not in quiet) \
                or rec.get("digest") != digest_of(oid):
            return None
        for path in targets_of(oid) if targets_of is not None else [t["path"] for t in rec["targets"]]:
            seen = observed.get(path)
            if seen is None or sha_of(path) != seen:
                return None
        out.append((oid, rec))
    return out
