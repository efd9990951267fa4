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
from collections.abc import Callable

from .. import __version__
from ..errors import OverlayError
from ..fsutil import atomic_write, sha256_bytes
from ..state import (
    ABSENT, JOURNAL_FILE, LEDGER_FILE, ORIGINALS_DIR, STATE_DIR, TYPE_CHECKING, journal_bytes, ledger_bytes,
    ledger_file, validate_journal, validate_ledger,
)

if TYPE_CHECKING:
    from ..state import JournalEntry, LedgerFile, OverlayRecord


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
    def files(self) -> dict[str, LedgerFile]:
        section: dict[str, LedgerFile] = self.data.setdefault("files", {})
        return section

    @property
    def overlays(self) -> dict[str, OverlayRecord]:
        section: dict[str, OverlayRecord] = self.data.setdefault("overlays", {})
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
        _write_state(self.path, ledger_bytes(self.data), "the ledger")

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

    def write_journal(self, entries: dict[str, JournalEntry]) -> None:
        _write_state(self.journal_path, journal_bytes(entries), "the journal")

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
                self.files[rel] = ledger_file(e)
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


