"""On-disk cache of GitHub answers: one JSON file per URL, with ETag and timestamps.

Layout (default `manager.releases.cache_dir()/github`):
    <sha256(url)[:32]>.json   {"url", "status", "etag", "last_modified", "fetched_at", "checked_at", "body"}
    rate-limit.json           {"until": ISO time, "reason": "..."} while GitHub asked us to back off

`fetched_at` is when the body was received; `checked_at` is the last time GitHub confirmed it
(a 200 or a 304 answer to an If-None-Match revalidation). Both are UTC ISO-8601 strings.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..fsutil import atomic_write


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0)


def to_iso(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def from_iso(s: str) -> dt.datetime:
    return dt.datetime.fromisoformat(s.replace("Z", "+00:00")).astimezone(dt.timezone.utc)


@dataclass(frozen=True)
class CacheEntry:
    url: str
    status: int  # HTTP status of the stored answer: 200, or 404 for "not found" facts
    etag: str | None
    last_modified: str | None
    fetched_at: dt.datetime
    checked_at: dt.datetime
    body: Any

    def to_json(self) -> dict[str, object]:
        return {
            "url": self.url,
            "status": self.status,
            "etag": self.etag,
            "last_modified": self.last_modified,
            "fetched_at": to_iso(self.fetched_at),
            "checked_at": to_iso(self.checked_at),
            "body": self.body,
        }


class FactCache:
    """A directory of cached GitHub answers keyed by URL."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)

    def _path(self, url: str) -> Path:
        return self.dir / (hashlib.sha256(url.encode()).hexdigest()[:32] + ".json")

    def get(self, url: str) -> CacheEntry | None:
        path = self._path(url)
        try:
            raw = json.loads(path.read_text())
            if raw.get("url") != url:
                return None
            return CacheEntry(
                url=raw["url"],
                status=int(raw["status"]),
                etag=raw.get("etag"),
                last_modified=raw.get("last_modified"),
                fetched_at=from_iso(raw["fetched_at"]),
                checked_at=from_iso(raw["checked_at"]),
                body=raw.get("body"),
            )
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            # A torn or foreign file is no fact: behave as if it were not cached.
            return None

    def put(self, entry: CacheEntry) -> None:
        data = json.dumps(entry.to_json(), indent=1, sort_keys=True).encode() + b"\n"
        atomic_write(self._path(entry.url), data)

    # -- rate-limit back-off shared between runs -------------------------------------
    @property
    def _rl_path(self) -> Path:
        return self.dir / "rate-limit.json"

    def blocked_until(self, now: dt.datetime) -> tuple[dt.datetime, str] | None:
        try:
            raw = json.loads(self._rl_path.read_text())
            until = from_iso(raw["until"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None
        if until <= now:
            return None
        return until, str(raw.get("reason", "rate limited"))

    def block(self, until: dt.datetime, reason: str) -> None:
        data = json.dumps({"until": to_iso(until), "reason": reason}, indent=1).encode() + b"\n"
        atomic_write(self._rl_path, data)

    def entries(self) -> list[CacheEntry]:
        found = []
        if self.dir.is_dir():
            for p in sorted(self.dir.glob("*.json")):
                if p.name == "rate-limit.json":
                    continue
                try:
                    url = json.loads(p.read_text()).get("url")
                except (ValueError, OSError):
                    continue
                e = self.get(url) if isinstance(url, str) else None
                if e is not None:
                    found.append(e)
        return found
