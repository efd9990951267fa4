"""Where a checkpoint's files come from: a local directory, or HTTP range requests.

A source only ever hands out whole small JSON files and byte ranges the caller asks
for; nothing here reads a safetensors data region.
"""

from __future__ import annotations

import os
import stat
import re
from pathlib import Path
from typing import Any

from ..errors import InspectError
from ..jsonread import parse_json

HF_ENDPOINT = "https://huggingface.co"
MAX_JSON_BYTES = 64 * 1024 * 1024  # config/index files are KBs; refuse anything absurd


class Source:
    """The interface: `label`, `exists(name)`, `size(name)`, `read(name, start, length)`, `list_safetensors()`."""

    label: str = ""
    bytes_read: int = 0  # every byte handed out, for tests and the benchmark

    def exists(self, name: str) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def size(self, name: str) -> int | None:  # pragma: no cover - interface
        raise NotImplementedError

    def read(self, name: str, start: int, length: int) -> bytes:  # pragma: no cover - interface
        raise NotImplementedError

    def list_safetensors(self) -> list[str]:  # pragma: no cover - interface
        raise NotImplementedError

    def where(self, name: str) -> str:
        return f"{self.label}/{name}"

    def read_json(self, name: str) -> Any:
        size = self.size(name)
        if size is not None and size > MAX_JSON_BYTES:
            raise InspectError(f"{self.where(name)}: {size} bytes: too large for a JSON metadata file")
        data = self.read(name, 0, size if size is not None else MAX_JSON_BYTES)
        return parse_json(data, self.where(name), InspectError)


def check_name(name: str, where: str) -> str:
    """A file name from an index must stay inside the checkpoint (no absolute paths, no '..')."""
    if not isinstance(name, str) or not name or name.startswith(("/", "\\")) or ".." in Path(name).parts \
            or re.match(r"^[A-Za-z]:", name):
        raise InspectError(f"{where}: {name!r}: file name outside the checkpoint directory")
    return name


def _kind(mode: int) -> str:
    return {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
            stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"}.get(stat.S_IFMT(mode), "a special file")


class LocalSource(Source):
    def __init__(self, root: Path):
        self.root = Path(root)
        if not self.root.is_dir():
            raise InspectError(f"{root}: not a directory (a checkpoint directory holds config.json and *.safetensors)")
        self.label = str(self.root)
        self.bytes_read = 0
        self._resolved = self.root.resolve()
        self._ok: dict[str, Path] = {}

    def _path(self, name: str) -> Path:
        p = self._ok.get(name)
        if p is None:
            p = self.root / name
            try:
                p.resolve().relative_to(self._resolved)
            except ValueError as exc:
                raise InspectError(f"{self.where(name)}: resolves outside the checkpoint directory") from exc
            self._ok[name] = p
        return p

    def exists(self, name: str) -> bool:
        return self._path(name).is_file()

    def size(self, name: str) -> int | None:
        try:
            return self._path(name).stat().st_size
        except OSError as exc:
            raise InspectError(f"{self.where(name)}: cannot stat: {exc.strerror}") from exc

    def read(self, name: str, start: int, length: int) -> bytes:
        try:  # non-blocking open + fstat: a FIFO or device named by an index never blocks the read
            fd = os.open(self._path(name), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except OSError as exc:
            raise InspectError(f"{self.where(name)}: cannot read: {exc.strerror}") from exc
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise InspectError(f"{self.where(name)}: {_kind(os.fstat(fd).st_mode)}, not a regular file; refused")
            data = os.pread(fd, length, start)
        except OSError as exc:
            raise InspectError(f"{self.where(name)}: cannot read: {exc.strerror}") from exc
        finally:
            os.close(fd)
        self.bytes_read += len(data)
        return data

    def list_safetensors(self) -> list[str]:
        return sorted(p.name for p in self.root.glob("*.safetensors") if p.is_file())


class HttpSource(Source):
    """Files under `base_url` read with plain HTTP GETs carrying `Range: bytes=a-b`.

    For a Hugging Face repo id the base is `<endpoint>/<repo>/resolve/<revision>` (the
    endpoint from --endpoint or $HF_ENDPOINT). A token from $HF_TOKEN is sent when set.
    """

    def __init__(self, base_url: str, *, label: str | None = None, timeout: float = 20.0, deadline: float = 120.0):
        try:
            import httpx
        except ImportError:
            from ..extras import install_hint

            raise InspectError(f"reading {label or base_url} over HTTP needs httpx (or pass a local "
                               f"directory); {install_hint('inspect')}") from None

        self.deadline = deadline  # seconds for one request in all (httpx's timeout is per chunk)
        self.base = base_url.rstrip("/")
        self.label = label or self.base
        self.bytes_read = 0
        headers = {"User-Agent": "overlay-manager inspect"}
        token = os.environ.get("HF_TOKEN")
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._client = httpx.Client(timeout=timeout, headers=headers, follow_redirects=True)
        self._sizes: dict[str, int | None] = {}
        self._missing: set[str] = set()

    @classmethod
    def for_repo(cls, repo: str, *, revision: str = "main", endpoint: str | None = None) -> HttpSource:
        ep = (endpoint or os.environ.get("HF_ENDPOINT") or HF_ENDPOINT).rstrip("/")
        return cls(f"{ep}/{repo}/resolve/{revision}", label=f"{repo}@{revision}")

    def _get(self, name: str, start: int, length: int):
        """The answer to a Range GET, within the total deadline, holding at most `length` bytes
        of the body (a 200 that ignores Range: the window [start, start + length) of it)."""
        import httpx

        from ..boundedhttp import RemoteRefused, get

        url = f"{self.base}/{name}"
        length = max(length, 1)

        def window(status: int) -> tuple[int, int]:
            return (start, start + length) if status == 200 else (0, length)

        try:
            return get(self._client, url, headers={"Range": f"bytes={start}-{start + length - 1}"},
                       deadline=self.deadline, window=window)
        except RemoteRefused as exc:
            raise InspectError(f"{url}: {exc}") from None
        except httpx.HTTPError as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise InspectError(f"{url}: cannot reach ({reason}); offline? inspect a local directory instead") from exc

    def _fetch(self, name: str, start: int, length: int) -> tuple[bytes, int | None]:
        resp = self._get(name, start, length)
        url = f"{self.base}/{name}"
        if resp.status == 404:
            self._missing.add(name)
            raise InspectError(f"{url}: HTTP 404: no such file")
        if resp.status == 416:
            return b"", self._sizes.get(name)
        if resp.status not in (200, 206):
            raise InspectError(f"{url}: HTTP {resp.status}")
        total = None
        cr = resp.headers.get("content-range", "")
        m = re.match(r"bytes \d{1,19}-\d{1,19}/(\d{1,19})$", cr)
        if m:
            total = int(m.group(1))
        if resp.status == 200:  # the server ignored Range: its length, when it says it
            declared = resp.headers.get("content-length", "")
            total = int(declared) if declared.isdigit() and len(declared) < 20 else None
        return resp.body[:length], total

    def exists(self, name: str) -> bool:
        if name in self._missing:
            return False
        try:
            self.size(name)
        except InspectError:
            if name in self._missing:
                return False
            raise
        return True

    def size(self, name: str) -> int | None:
        if name not in self._sizes:
            _, total = self._fetch(name, 0, 1)
            self._sizes[name] = total
        return self._sizes[name]

    def read(self, name: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        data, total = self._fetch(name, start, length)
        if total is not None:
            self._sizes[name] = total
        self.bytes_read += len(data)
        return data

    def list_safetensors(self) -> list[str]:
        return ["model.safetensors"] if self.exists("model.safetensors") else []


def open_source(target: str, *, revision: str = "main", endpoint: str | None = None) -> Source:
    """A local directory when `target` is one; an http(s) URL; else a Hugging Face repo id."""
    if target.startswith(("http://", "https://")):
        return HttpSource(target)
    p = Path(target)
    if p.exists():
        return LocalSource(p)
    if re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", target) and not target.startswith((".", "/")):
        return HttpSource.for_repo(target, revision=revision, endpoint=endpoint)
    raise InspectError(f"{target}: no such directory (and not a Hugging Face repo id owner/name)")
