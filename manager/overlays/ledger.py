"""The ledger `<root>/.overlay-manager/ledger.json`, the originals store and the apply journal.

Order of writes during an apply: originals (content-addressed) -> journal -> target
files (each atomic) -> ledger -> journal removed. A journal left behind by a killed
apply is folded into the ledger by the next run, so every written file keeps its
original bytes and post hash on record.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from collections.abc import Callable

from .. import __version__
from ..errors import OverlayError
from ..fsutil import atomic_write, sha256_bytes
from ..state import ABSENT, JOURNAL_FILE, LEDGER_FILE, ORIGINALS_DIR, STATE_DIR


_SHA_RE = re.compile(r"^[0-9a-f]{64}$")


def check_rel_path(rel: object) -> str | None:
    """Why `rel` is not a relative path inside a root (None when it is one)."""
    if not isinstance(rel, str) or not rel:
        return "not a non-empty string"
    p = PurePosixPath(rel)
    if p.is_absolute() or "\\" in rel or (len(rel) > 1 and rel[1] == ":"):
        return "an absolute path"
    if ".." in p.parts:
        return "a path with '..'"
    if "\0" in rel:
        return "a path with a NUL byte"
    return None


def _check_sha(where: str, value: object, absent_ok: bool = True) -> None:
    if isinstance(value, str) and (_SHA_RE.match(value) or (absent_ok and value == ABSENT)):
        return
    raise ValueError(f"{where}: {value!r} is not a sha256{' or ' + repr(ABSENT) if absent_ok else ''}")


def _check_file_entry(where: str, rec: object, keys: tuple[str, ...]) -> None:
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(rec).__name__}")
    for k in keys:
        if k not in rec:
            raise ValueError(f"{where}: missing key {k!r}")
    for k in keys:
        if k.endswith("sha256"):
            _check_sha(f"{where}.{k}", rec[k])
    ov = rec["overlays"]
    if not isinstance(ov, dict) or not all(isinstance(i, str) and type(v) is int for i, v in ov.items()):
        raise ValueError(f"{where}.overlays: expected a mapping of overlay id -> sentinel version")


def _check_files(where: str, files: object, keys: tuple[str, ...]) -> None:
    if not isinstance(files, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(files).__name__}")
    for rel, rec in files.items():
        why = check_rel_path(rel)
        if why:
            raise ValueError(f"{where}: {rel!r} is {why}, not a path inside the root")
        _check_file_entry(f"{where}[{rel!r}]", rec, keys)


LEDGER_FILE_KEYS = ("base_sha256", "post_sha256", "overlays")
JOURNAL_FILE_KEYS = ("base_sha256", "pre_sha256", "post_sha256", "overlays")


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


def validate_journal(data: object) -> dict[str, Any]:
    """The schema of journal.json (rel path -> base/pre/post hashes and overlays), read and write."""
    _check_files("(top)", data, JOURNAL_FILE_KEYS)
    return data  # type: ignore[return-value]


def state_dir(root: Path) -> Path:
    return root / STATE_DIR


@dataclass
class Ledger:
    root: Path
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return state_dir(self.root) / LEDGER_FILE

    @property
    def files(self) -> dict[str, dict[str, Any]]:
        section: dict[str, dict[str, Any]] = self.data.setdefault("files", {})
        return section

    @property
    def overlays(self) -> dict[str, dict[str, Any]]:
        section: dict[str, dict[str, Any]] = self.data.setdefault("overlays", {})
        return section

    @property
    def observed(self) -> dict[str, str]:
        section: dict[str, str] = self.data.setdefault("observed", {})
        return section

    @classmethod
    def load(cls, root: Path) -> Ledger:
        led = cls(root)
        try:
            led.data = json.loads(led.path.read_text())
        except FileNotFoundError:
            led.data = {}
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise OverlayError(f"{led.path}: corrupt ledger ({exc}); move it aside to start over") from None
        except OSError as exc:
            raise OverlayError(f"{led.path}: cannot read the ledger: {exc.strerror}") from None
        try:
            validate_ledger(led.data)
        except ValueError as exc:
            raise OverlayError(f"{led.path}: corrupt ledger: {exc}; move it aside to start over") from None
        return led

    def save(self, package_version: str | None) -> None:
        _ = (self.files, self.overlays, self.observed)  # the properties create every section, even when empty
        self.data["tool_version"] = __version__
        self.data["package_version"] = package_version
        self.data["updated_at"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        try:
            validate_ledger(self.data)
        except ValueError as exc:  # a bug: never write what the next run would call corrupt
            raise AssertionError(f"refusing to write an invalid ledger: {exc}") from None
        _write_state(self.path, (json.dumps(self.data, indent=2, sort_keys=True) + "\n").encode(), "the ledger")

    # originals store --------------------------------------------------------------
    def store_original(self, data: bytes) -> str:
        digest = sha256_bytes(data)
        p = state_dir(self.root) / ORIGINALS_DIR / digest
        if not p.exists():
            _write_state(p, data, "the original bytes", mode=0o644)
        return digest

    def original(self, digest: str) -> bytes | None:
        if digest == ABSENT:
            return None
        p = state_dir(self.root) / ORIGINALS_DIR / digest
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            raise OverlayError(f"{p}: original bytes missing from the store; cannot revert") from None
        if sha256_bytes(data) != digest:
            raise OverlayError(f"{p}: original bytes corrupt (hash mismatch); cannot revert")
        return data

    # journal ------------------------------------------------------------------------
    @property
    def journal_path(self) -> Path:
        return state_dir(self.root) / JOURNAL_FILE

    def write_journal(self, entries: dict[str, dict[str, Any]]) -> None:
        try:
            validate_journal(entries)
        except ValueError as exc:  # a bug: never write what the next run would call corrupt
            raise AssertionError(f"refusing to write an invalid journal: {exc}") from None
        _write_state(self.journal_path, json.dumps(entries, indent=2, sort_keys=True).encode(), "the journal")

    def has_journal(self) -> bool:
        return self.journal_path.exists()

    def clear_journal(self) -> None:
        try:
            self.journal_path.unlink()
        except FileNotFoundError:
            pass

    def recover(self, current_sha: Callable[[str], str]) -> list[str]:
        """Fold a journal left by an interrupted apply into the ledger. Returns notes."""
        try:
            entries = validate_journal(json.loads(self.journal_path.read_text()))
        except FileNotFoundError:
            return []
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else "not UTF-8"
            raise OverlayError(f"{self.journal_path}: cannot read the journal: {why}") from None
        except (json.JSONDecodeError, ValueError) as exc:
            raise OverlayError(
                f"{self.journal_path}: corrupt journal of an interrupted apply ({exc}); check the files it "
                "names by hand, then move it aside"
            ) from None
        notes = []
        for rel, e in entries.items():
            now = current_sha(rel)
            if now == e["post_sha256"]:
                self.files[rel] = {k: e[k] for k in ("base_sha256", "post_sha256", "overlays")}
                notes.append(f"{rel}: written by an interrupted apply (recorded)")
            elif now == e["pre_sha256"]:
                notes.append(f"{rel}: not written by an interrupted apply")
            else:
                notes.append(f"{rel}: changed since an interrupted apply (left as is)")
        return notes


def _write_state(path: Path, data: bytes, what: str, mode: int | None = None) -> None:
    """atomic_write into the state directory; a full disk, a read-only or misplaced directory is
    one line naming the path."""
    try:
        atomic_write(path, data, mode=mode)
    except OSError as exc:
        raise OverlayError(f"{path}: cannot write {what}: {exc.strerror or exc}") from None


