"""Issue 28 points 10, 11: a remote checkpoint read (manager/inspect/source.py HttpSource) has a
total deadline, not a per-chunk timeout, and never keeps more of a body than it asked for (a 200
that ignores Range). Local servers on 127.0.0.1 only (tests/helpers/hostile_http.py)."""

from __future__ import annotations

import time
import tracemalloc

import pytest

from manager.errors import InspectError
from manager.inspect.source import HttpSource
from tests.helpers.hostile_http import HostileServer, flood, trickle


def test_a_server_trickling_one_byte_at_a_time_is_given_up_at_the_total_deadline():
    with HostileServer({"/config.json": trickle(seconds=20, every=0.2)}) as srv:
        src = HttpSource(srv.url, timeout=1.0, deadline=1.5)
        started = time.monotonic()
        with pytest.raises(InspectError, match="deadline"):
            src.read_json("config.json")
        assert time.monotonic() - started < 6


def test_a_200_ignoring_range_with_a_huge_body_keeps_only_the_window(monkeypatch):
    with HostileServer({"/model.safetensors": flood(total=256 << 20)}) as srv:
        src = HttpSource(srv.url, timeout=5.0, deadline=30)
        started = time.monotonic()
        tracemalloc.start()
        try:
            data = src.read("model.safetensors", 10, 100)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert data == b"x" * 100
        assert peak < 16 << 20, f"{peak} bytes held for a 100-byte read"
        assert time.monotonic() - started < 10
        assert src.bytes_read == 100
