"""The hash-locked wheel directory an engine image is built from (`overlay image wheels`).

`wheel_set` downloads (once) every wheel of a recipe for the base image's python and platform into
`<root>/py<X.Y>-<platform>-<key>/` with `pip download` (pip checks the index's hashes) and writes a
`requirements.lock` naming each wheel by `==` version and sha256; `WheelServer` serves that directory
read-only on 127.0.0.1 for the build's `pip install --no-index --require-hashes`, so no wheel enters
the build context or a layer. Split out of image.py, which assembles and builds the context.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ComposeError
from ..releases import cache_dir
from .bundle import _pip, platform_tags
from .recipe import Recipe

LOCK = "requirements.lock"
_WHEEL_RE = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")


@dataclass(frozen=True)
class WheelSet:
    path: Path
    lock: Path
    count: int
    size_bytes: int
    cached: bool



def _wheel_key(reqs: tuple[str, ...]) -> str:
    return hashlib.sha256("\n".join(sorted(reqs)).encode()).hexdigest()[:12]


def default_wheel_root(recipe: Recipe) -> Path:
    return cache_dir() / "wheels" / recipe.name


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _write_lock(d: Path) -> Path:
    lines = []
    for wheel in sorted(d.glob("*.whl")):
        m = _WHEEL_RE.match(wheel.name)
        if not m:
            raise ComposeError(f"{wheel}: not a wheel file name")
        name = m.group("name").lower().replace("_", "-")
        lines.append(f"{name}=={m.group('version')} --hash=sha256:{sha256_file(wheel)}")
    if not lines:
        raise ComposeError(f"{d}: pip download left no wheels")
    lock = d / LOCK
    lock.write_text("# every wheel of this directory, hashed when downloaded (pip checked the index's hashes)\n"
                    + "\n".join(lines) + "\n")
    return lock


def wheel_set(recipe: Recipe, python: str, platform: str, root: Path | None = None) -> WheelSet:
    """Download (once) every wheel of the recipe for python/platform into `root`; idempotent:
    a directory marked complete is reused as it is (pip checks each wheel's hash at install)."""
    from filelock import FileLock

    from .bundle import _check_python

    python = _check_python(python)
    root = Path(root) if root else default_wheel_root(recipe)
    d = root / f"py{python}-{platform}-{_wheel_key(recipe.requirements)}"
    marker = d / ".complete"
    cached = marker.exists()
    if not cached:
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ComposeError(f"--wheels {root}: cannot create the directory: {exc.strerror}") from None
        with FileLock(str(d) + ".lock"):
            cached = marker.exists()
            if not cached:
                d.mkdir(parents=True, exist_ok=True)
                plat_args = [a for t in platform_tags(platform) for a in ("--platform", t)]
                _pip(["download", "-q", "--no-cache-dir", "--only-binary=:all:", "--python-version", python,
                      "--implementation", "cp", *plat_args, "-d", str(d), *recipe.requirements],
                     what=f"pip download of the {recipe.name} wheels for python {python} / {platform}")
                _write_lock(d)
                marker.write_text("\n".join(recipe.requirements) + "\n")
    wheels = list(d.glob("*.whl"))
    return WheelSet(d, d / LOCK, len(wheels), sum(w.stat().st_size for w in wheels), cached)


@functools.cache
def _quiet_handler(directory: str) -> type:
    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, directory=directory, **kw)

        def log_message(self, *a: Any) -> None:
            pass

    return Handler


class WheelServer:
    """The wheel directory on http://127.0.0.1:PORT/ (read-only, for the build's pip); the port is
    derived from the lock so that the install step's build argument, and its layer cache, stay the same."""

    def __init__(self, d: Path, lock_sha: str) -> None:
        preferred = 20000 + int(lock_sha[:8], 16) % 20000
        try:
            self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", preferred), _quiet_handler(str(d)))
        except OSError:
            self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _quiet_handler(str(d)))
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> WheelServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
