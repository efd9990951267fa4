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
        if led.data and not isinstance(led.data.get("files"), dict):
            raise OverlayError(f"{led.path}: corrupt ledger (no 'files' mapping)")
        return led

    def save(self, package_version: str | None) -> None:
        self.data["tool_version"] = __version__
        self.data["package_version"] = package_version
        self.data["updated_at"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        atomic_write(self.path, (json.dumps(self.data, indent=2, sort_keys=True) + "\n").encode())

    # originals store --------------------------------------------------------------
    def store_original(self, data: bytes) -> str:
        digest = sha256_bytes(data)
        p = state_dir(self.root) / "originals" / digest
        if not p.exists():
            atomic_write(p, data, mode=0o644)
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
        atomic_write(self.journal_path, json.dumps(entries, indent=2, sort_keys=True).encode())

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
