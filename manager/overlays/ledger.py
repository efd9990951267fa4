"""The ledger `<root>/.overlay-manager/ledger.json`, the originals store and the apply journal.

Order of writes during an apply: originals (content-addressed) -> journal -> target
files (each atomic) -> ledger -> journal removed. A journal left behind by a killed
apply is folded into the ledger by the next run, so every written file keeps its
original bytes and post hash on record.
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import OverlayError
from ..fsutil import atomic_write, sha256_bytes

STATE_DIR = ".overlay-manager"
ABSENT = "absent"


def state_dir(root: Path) -> Path:
    return root / STATE_DIR


@dataclass
class Ledger:
    root: Path
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return state_dir(self.root) / "ledger.json"

    @property
    def files(self) -> dict[str, dict[str, Any]]:
        return self.data.setdefault("files", {})

    @property
    def overlays(self) -> dict[str, dict[str, Any]]:
        return self.data.setdefault("overlays", {})

    @property
    def observed(self) -> dict[str, str]:
        return self.data.setdefault("observed", {})

    @classmethod
    def load(cls, root: Path) -> "Ledger":
        led = cls(root)
        try:
            led.data = json.loads(led.path.read_text())
        except FileNotFoundError:
            led.data = {}
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise OverlayError(f"{led.path}: corrupt ledger ({exc}); move it aside to start over") from None
        except OSError as exc:
            raise OverlayError(f"{led.path}: cannot read the ledger: {exc.strerror}") from None
        if not isinstance(led.data, dict):
            raise OverlayError(f"{led.path}: corrupt ledger (a JSON {type(led.data).__name__}, not an object)")
        if led.data and not isinstance(led.data.get("files"), dict):
            raise OverlayError(f"{led.path}: corrupt ledger (no 'files' mapping)")
        problem = _ledger_problem(led.data)
        if problem:
            raise OverlayError(f"{led.path}: corrupt ledger ({problem}); move it aside to start over")
        return led

    def save(self, package_version: str | None) -> None:
        self.data["tool_version"] = __version__
        self.data["package_version"] = package_version
        self.data["updated_at"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        _write_state(self.path, (json.dumps(self.data, indent=2, sort_keys=True) + "\n").encode(), "the ledger")

    # originals store --------------------------------------------------------------
    def store_original(self, data: bytes) -> str:
        digest = sha256_bytes(data)
        p = state_dir(self.root) / "originals" / digest
        if not p.exists():
            _write_state(p, data, "the original bytes", mode=0o644)
        return digest

    def original(self, digest: str) -> bytes | None:
        if digest == ABSENT:
            return None
        p = state_dir(self.root) / "originals" / digest
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
        return state_dir(self.root) / "journal.json"

    def write_journal(self, entries: dict[str, dict[str, Any]]) -> None:
        _write_state(self.journal_path, json.dumps(entries, indent=2, sort_keys=True).encode(), "the journal")

    def clear_journal(self) -> None:
        try:
            self.journal_path.unlink()
        except FileNotFoundError:
            pass

    def recover(self, current_sha) -> list[str]:
        """Fold a journal left by an interrupted apply into the ledger. Returns notes."""
        try:
            entries = json.loads(self.journal_path.read_text())
        except FileNotFoundError:
            return []
        except json.JSONDecodeError:
            self.clear_journal()
            return ["discarded an unreadable journal"]
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else "not UTF-8"
            raise OverlayError(f"{self.journal_path}: cannot read the journal: {why}") from None
        problem = _journal_problem(entries)
        if problem:
            raise OverlayError(
                f"{self.journal_path}: corrupt journal ({problem}); check the files it names, then move it aside"
            )
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


_SHA_KEYS = ("base_sha256", "post_sha256")


def _ledger_problem(data: dict[str, Any]) -> str | None:
    """What is wrong with a ledger's shape (the keys this module and the engine read), or None."""
    for key in ("files", "overlays", "observed"):
        if key in data and not isinstance(data[key], dict):
            return f"{key!r} is a {type(data[key]).__name__}, not a mapping"
    for rel, rec in data.get("files", {}).items():
        if not isinstance(rec, dict) or not all(isinstance(rec.get(k), str) for k in _SHA_KEYS) \
                or not isinstance(rec.get("overlays"), dict):
            return f"files[{rel!r}] lacks base_sha256/post_sha256/overlays"
    for oid, rec in data.get("overlays", {}).items():
        if not isinstance(rec, dict) or not isinstance(rec.get("targets", []), list) \
                or not all(isinstance(t, dict) and {"path", "status", "detail"} <= t.keys() for t in rec.get("targets", [])):
            return f"overlays[{oid!r}] is not an overlay record"
    for rel, sha in data.get("observed", {}).items():
        if not isinstance(sha, str):
            return f"observed[{rel!r}] is not a hash"
    return None


def _journal_problem(entries: Any) -> str | None:
    if not isinstance(entries, dict):
        return f"a JSON {type(entries).__name__}, not an object"
    for rel, e in entries.items():
        if not isinstance(e, dict) or not all(isinstance(e.get(k), str) for k in (*_SHA_KEYS, "pre_sha256")) \
                or not isinstance(e.get("overlays"), dict):
            return f"entry {rel!r} lacks base_sha256/pre_sha256/post_sha256/overlays"
    return None
