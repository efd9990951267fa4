"""What every edit kind shares: its per-file state and the interface the engine drives."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


class EditState(str, enum.Enum):
    APPLIED = "applied"  # our block, current version, untouched
    PENDING = "pending"  # not present; the anchor matches exactly once
    OLD = "old"  # our block from an older sentinel version: upgrade pending
    PARTIAL = "partial"  # some of this edit's sites present, some not
    MODIFIED = "modified"  # our sentinel is there but the block was edited
    DRIFT = "drift"  # scope exists, anchor matches 0 or >= 2 times
    SUPERSEDED = "superseded"  # the scope itself is gone
    NATIVE = "native"  # the edit itself sees the fix already present upstream
    NOT_APPLICABLE = "not-applicable"  # nothing for this edit to do in this file


@dataclass(frozen=True)
class Inspection:
    state: EditState
    detail: str = ""


class Edit(Protocol):
    """The interface the engine drives (transaction, statuses): every edit kind has it.

    `language` says what `inspect`/`apply`/`remove` take and return: "python", one libcst Module of the target
    (python.PythonEdit and its kinds, dictcache.DictCache); "text", the target's text, None when it is absent
    (text.TextEdit and its kinds, release.ReleaseFile). The engine hands each edit the form its language names,
    and raises EditFailed's message as one error line."""

    language: str
    spec: Any  # the manifest edit it was made from (manager.overlays.manifest)

    @property
    def name(self) -> str: ...

    def inspect(self, subject: Any) -> Inspection: ...

    def apply(self, subject: Any) -> Any: ...

    def remove(self, subject: Any) -> Any: ...


class EditFailed(Exception):
    """An edit could not be applied or removed (the engine turns it into an OverlayError)."""


@dataclass(frozen=True)
class EditContext:
    """What an edit needs to know about its overlay."""

    overlay_id: str
    version: int
    overlay_dir: Path

    def read(self, rel: str) -> str:
        """A snippet/source file of the overlay; it must resolve (symlinks followed) inside the
        overlay's own directory, never elsewhere on the host."""
        path = self.overlay_dir / rel
        base = self.overlay_dir.resolve()
        real = path.resolve()
        if Path(rel).is_absolute() or base not in real.parents:
            raise EditFailed(f"{path}: resolves to {real}, outside the overlay directory {base}; refused")
        try:
            return real.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise EditFailed(f"{path}: snippet file not found") from None
        except UnicodeDecodeError as exc:
            raise EditFailed(
                f"{path}: snippet is not UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})"
            ) from None
        except OSError as exc:
            raise EditFailed(f"{path}: cannot read the snippet: {exc.strerror}") from None
