"""HTTP GETs with a total deadline and a bounded body, for every remote read (inspect, upstream).

httpx's read timeout is per chunk: a server sending one byte every few seconds keeps a plain
`client.get` going forever, and `resp.content` / `resp.json()` take a body of any size (a 200
that ignores `Range` with a 2 GB body). `get` streams the answer and keeps only the byte window
the caller asks for (stopping once it has it), refuses a body over `limit`, and gives up at a
total deadline: the request runs in a daemon thread the caller stops waiting for, so a server
that trickles even its headers cannot hold the command.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable


class RemoteRefused(Exception):
    """The answer broke a bound: over its size limit or past the total deadline."""


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Any  # httpx.Headers
    body: bytes  # the window asked for
    reason: str


def get(client: Any, url: str, *, headers: dict[str, str] | None = None, deadline: float,
        limit: int | None = None, window: Callable[[int], tuple[int, int]] | None = None) -> Answer:
    """GET `url` with `client` (an httpx.Client); at most `deadline` seconds in all.

    `window(status) -> (lo, hi)`: the byte range of the body to keep (the rest is read past or,
    after `hi`, not read at all); default: all of it. `limit`: a body longer than this (by its
    Content-Length or as read) raises RemoteRefused. Network errors are httpx's own."""
    box: dict[str, Any] = {}
    until = time.monotonic() + deadline

    def run() -> None:
        try:
            box["answer"] = _read(client, url, headers or {}, until, limit, window)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = exc

    worker = threading.Thread(target=run, name="overlay-bounded-get", daemon=True)
    worker.start()
    worker.join(max(until - time.monotonic(), 0) + 0.25)
    if worker.is_alive():
        raise RemoteRefused(f"no complete answer within {deadline:g} s (total deadline)")
    if "error" in box:
        raise box["error"]
    return box["answer"]


def _read(client: Any, url: str, headers: dict[str, str], until: float, limit: int | None,
          window: Callable[[int], tuple[int, int]] | None) -> Answer:
    with client.stream("GET", url, headers=headers) as resp:
        declared = resp.headers.get("content-length", "")
        if limit is not None and declared.isdigit() and len(declared) < 20 and int(declared) > limit:
            raise RemoteRefused(f"answer of {int(declared)} bytes, over the {limit}-byte limit")
        lo, hi = window(resp.status_code) if window is not None else (0, 1 << 62)
        kept: list[bytes] = []
        pos = 0
        for chunk in resp.iter_bytes():
            if time.monotonic() > until:
                raise RemoteRefused("answer still arriving at the total deadline")
            end = pos + len(chunk)
            if limit is not None and end > limit:
                raise RemoteRefused(f"answer over the {limit}-byte limit")
            if end > lo and pos < hi:
                kept.append(chunk[max(lo - pos, 0):hi - pos])
            pos = end
            if pos >= hi:
                break  # the window is complete: the rest is never read
        return Answer(resp.status_code, resp.headers, b"".join(kept), resp.reason_phrase)
