"""A local HTTP server (127.0.0.1 only, a thread) that misbehaves on purpose: it trickles its
answer, floods a body that ignores Range, or answers JSON of a hostile shape. Each route is a
function (handler) -> None; every loop in them is bounded, so a test can never hang on it."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from collections.abc import Callable


def trickle(seconds: float = 8.0, every: float = 0.2) -> Callable:
    """200 with a JSON body sent one byte per `every` s, for at most `seconds`."""

    def route(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.end_headers()
        stop = time.monotonic() + seconds
        while time.monotonic() < stop and not h.server.stopping:  # type: ignore[attr-defined]
            try:
                h.wfile.write(b" ")
                h.wfile.flush()
            except OSError:
                return
            time.sleep(every)

    return route


def flood(total: int, chunk: int = 1 << 16) -> Callable:
    """200 ignoring any Range, a body of `total` bytes (no Content-Length: read to the end)."""

    def route(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.end_headers()
        block = b"x" * chunk
        sent = 0
        while sent < total and not h.server.stopping:  # type: ignore[attr-defined]
            try:
                h.wfile.write(block)
            except OSError:
                return
            sent += chunk

    return route


def body(data: bytes, status: int = 200) -> Callable:
    def route(h: BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    return route


class HostileServer:
    """`with HostileServer({"/path": route}) as srv: srv.url + "/path"`."""

    def __init__(self, routes: dict[str, Callable]):
        routes_ = routes

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                path = self.path.split("?", 1)[0]
                route = routes_.get(path) or next((r for p, r in routes_.items() if p.endswith("*") and path.startswith(p[:-1])), None)
                if route is None:
                    self.send_error(404)
                    return
                route(self)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.stopping = False  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> HostileServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.stopping = True  # type: ignore[attr-defined]
        self.server.shutdown()
        self.server.server_close()
