"""`overlay engine audit`: which CUDA architectures an engine's binaries carry, and whether an SM runs them.

Reads a wheel (each `.so` member copied to a temporary file, parsed, deleted), a site-packages
directory (read in place) or a Docker image (its site-packages streamed out with the Docker
SDK's get_archive, only the `.so` files and ptxas kept, one at a time; no container runs GPU
code). Each ELF's `.nv_fatbin` is parsed by `fatbin`; each TU is matched to a component by
`needs`; the verdict is "runs" when every needed component has code the SM can run.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import tarfile
import tempfile
import zipfile
from functools import partial
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, BinaryIO
from collections.abc import Callable, Iterable, Iterator

from ..dockerclient import docker_client
from ..errors import EngineError
from . import fatbin, needs

PTXAS_RELEASE = re.compile(rb"Cuda compilation tools, release (\d+)\.(\d+)")
# CUDA 13.0 removed offline compilation for Maxwell, Pascal and Volta (sm_50..sm_72):
# https://docs.nvidia.com/cuda/archive/13.0.0/cuda-toolkit-release-notes/index.html
PTXAS_MIN_SM = {12: 50, 13: 75}
TRITON_PTXAS = "triton/backends/nvidia/bin/ptxas"
MAX_TOOL_SCAN = 256 << 20
MAX_MEMBER = 16 << 30  # one extracted file (libtorch_cuda.so is ~1 GB); a larger one is refused


@dataclass(frozen=True)
class TU:
    index: int
    name: str | None
    sass: tuple[str, ...]  # "sm_70", "sm_90a" ...
    ptx: tuple[str, ...]
    runs: str | None  # "sass" | "ptx" | None on the audited SM

    def as_dict(self) -> dict[str, object]:
        return {"index": self.index, "name": self.name, "sass": list(self.sass), "ptx": list(self.ptx),
                "runs": self.runs}


@dataclass(frozen=True)
class Component:
    name: str
    binary: str
    role: str
    verdict: str  # runs | does not run | harmless | limit | not needed
    note: str
    source: str
    sass: tuple[str, ...]
    ptx: tuple[str, ...]
    tus: tuple[TU, ...]
    tool_release: str | None = None  # ptxas: the CUDA release it comes from

    @property
    def tus_running(self) -> int:
        return sum(1 for t in self.tus if t.runs)

    def as_dict(self, with_tus: bool = True) -> dict[str, object]:
        out: dict[str, object] = {
            "name": self.name, "binary": self.binary, "role": self.role, "verdict": self.verdict,
            "note": self.note, "source": self.source, "sass": list(self.sass), "ptx": list(self.ptx),
            "tu_count": len(self.tus), "tus_running": self.tus_running,
        }
        if self.tool_release:
            out["tool_release"] = self.tool_release
        if with_tus:
            out["tus"] = [t.as_dict() for t in self.tus]
        return out


@dataclass(frozen=True)
class BinarySummary:
    path: str
    tu_count: int
    tus_with_sass: int  # TUs with a cubin for exactly the audited SM
    tus_running: int  # TUs with code the SM runs (SASS of same major, lower-or-equal minor, or PTX <= SM)
    sass: tuple[str, ...]
    ptx: tuple[str, ...]

    def as_dict(self) -> dict[str, object]:
        return {"path": self.path, "tu_count": self.tu_count, "tus_with_sass": self.tus_with_sass,
                "tus_running": self.tus_running, "sass": list(self.sass), "ptx": list(self.ptx)}


@dataclass(frozen=True)
class AuditReport:
    source: str
    sm: int
    components: tuple[Component, ...]
    binaries: tuple[BinarySummary, ...]
    scanned: int  # ELF files read (with or without device code)
    errors: tuple[str, ...] = field(default_factory=tuple)  # files that could not be parsed

    @property
    def failing(self) -> tuple[Component, ...]:
        return tuple(c for c in self.components if c.verdict == "does not run")

    @property
    def verdict(self) -> str:
        if self.errors:
            return "unreadable"  # a binary could not be parsed: no answer for it
        if not self.components:
            return "no CUDA code"
        return "does not run" if self.failing else "runs"

    @property
    def ok(self) -> bool:
        return self.verdict == "runs"

    def as_dict(self, with_tus: bool = True) -> dict[str, object]:
        return {
            "source": self.source, "sm": self.sm, "verdict": self.verdict,
            "failing": [c.name for c in self.failing],
            "limits": [c.name for c in self.components if c.verdict == "limit"],
            "components": [c.as_dict(with_tus) for c in self.components],
            "binaries": [b.as_dict() for b in self.binaries],
            "scanned": self.scanned, "errors": list(self.errors),
        }


def _arches(entries: Iterable[fatbin.Entry], kind: str) -> tuple[str, ...]:
    found = {(e.sm, e.arch_specific) for e in entries if e.kind == kind}
    return tuple(f"sm_{sm}{'a' if a else ''}" for sm, a in sorted(found))


def _tu(c: fatbin.Container, sm: int) -> TU:
    generic_sass = [e.sm for e in c.entries if e.kind == "sass" and not e.arch_specific]
    exact_a = any(e.kind == "sass" and e.arch_specific and e.sm == sm for e in c.entries)
    runs = fatbin.runs_on(generic_sass, [e.sm for e in c.entries if e.kind == "ptx"], sm)
    if runs is None and exact_a:
        runs = "sass"
    return TU(c.index, c.tu, _arches(c.entries, "sass"), _arches(c.entries, "ptx"), runs)


def is_candidate(rel: str) -> bool:
    """A member worth opening: a shared object, or a bundled ptxas."""
    name = rel.rsplit("/", 1)[-1]
    return name.endswith(".so") or ".so." in name or name == "ptxas"


class _Collector:
    def __init__(self, sm: int) -> None:
        self.sm = sm
        self.components: list[Component] = []
        self.binaries: list[BinarySummary] = []
        self.scanned = 0
        self.errors: list[str] = []

    def add_file(self, rel: str, fh: BinaryIO, size: int) -> None:
        if rel.rsplit("/", 1)[-1] == "ptxas":
            self._add_ptxas(rel, fh, size)
            return
        head = fh.read(4)
        fh.seek(0)
        if head != b"\x7fELF":
            return
        self.scanned += 1
        try:
            fb = fatbin.read(fh, size, rel)
        except fatbin.FatbinError as exc:
            self.errors.append(str(exc))
            return
        if not fb.containers:
            return
        tus = [_tu(c, self.sm) for c in fb.containers]
        self.binaries.append(BinarySummary(
            rel, len(tus), sum(1 for c in fb.containers if self.sm in c.sass()),
            sum(1 for t in tus if t.runs), _arches(fb.entries, "sass"), _arches(fb.entries, "ptx")))
        groups: dict[needs.Rule, list[tuple[TU, fatbin.Container]]] = {}
        for t, c in zip(tus, fb.containers, strict=False):
            groups.setdefault(needs.rule_for(rel, t.name), []).append((t, c))
        for rule, members in groups.items():
            group_tus = tuple(t for t, _c in members)
            entries = [e for _t, c in members for e in c.entries]
            runs = any(t.runs for t in group_tus) if rule.whole_library else all(t.runs for t in group_tus)
            finding = needs.classify(rule, runs, self.sm)
            self.components.append(Component(
                rule.component, rel, rule.role, finding.verdict, finding.note, rule.source,
                _arches(entries, "sass"), _arches(entries, "ptx"), group_tus))

    def _add_ptxas(self, rel: str, fh: BinaryIO, size: int) -> None:
        release = None
        tail = b""
        left = min(size, MAX_TOOL_SCAN)
        while left > 0 and release is None:
            chunk = fh.read(min(fatbin.CHUNK, left))
            if not chunk:
                break
            left -= len(chunk)
            m = PTXAS_RELEASE.search(tail + chunk)
            if m:
                release = (int(m.group(1)), int(m.group(2)))
            tail = chunk[-64:]
        rule = needs.Rule(
            "triton ptxas" if rel.endswith(TRITON_PTXAS) else f"ptxas ({rel})", rel, None,
            needs.NEEDED if rel.endswith(TRITON_PTXAS) else needs.OTHER,
            "assembles Triton's kernels (TRITON_ATTN, fused_moe) for the SM at run time",
            "CUDA 13.0 release notes: offline compilation for sm_50..sm_72 removed "
            "(https://docs.nvidia.com/cuda/archive/13.0.0/cuda-toolkit-release-notes/index.html)")
        if release is None:
            self.errors.append(f"{rel}: no CUDA release string found in ptxas")
            return
        min_sm = PTXAS_MIN_SM.get(release[0], 75 if release[0] > 13 else 50)
        finding = needs.classify(rule, self.sm >= min_sm, self.sm)
        note = f"ptxas of CUDA {release[0]}.{release[1]} targets sm_{min_sm} and newer; " + finding.note
        self.components.append(Component(rule.component, rel, rule.role, finding.verdict, note, rule.source,
                                         (), (), (), f"{release[0]}.{release[1]}"))

    def report(self, source: str) -> AuditReport:
        order = {"does not run": 0, "limit": 1, "runs": 2, "harmless": 3, "not needed": 4}
        comps = sorted(self.components, key=lambda c: (order.get(c.verdict, 9), c.binary, c.name))
        return AuditReport(source, self.sm, tuple(comps), tuple(sorted(self.binaries, key=lambda b: b.path)),
                           self.scanned, tuple(self.errors))


def audit_wheel(path: Path, sm: int, progress: Callable[[str], None] | None = None) -> AuditReport:
    """Audit a wheel: each candidate member goes through one temporary file, deleted at once."""
    if not path.is_file():
        raise EngineError(f"{path}: no such file")
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise EngineError(f"{path}: not a wheel (zip): {exc}") from None
    with zf:
        names = zf.namelist()
        if not any(n.endswith(".dist-info/WHEEL") for n in names):
            raise EngineError(f"{path}: not a wheel (no *.dist-info/WHEEL in the zip)")
        col = _Collector(sm)
        with tempfile.TemporaryDirectory(prefix="overlay-audit-") as tmp:
            for info in zf.infolist():
                if info.is_dir() or not is_candidate(info.filename):
                    continue
                if info.file_size > MAX_MEMBER:
                    raise EngineError(
                        f"{path}: member {info.filename} declares {info.file_size:,} bytes (over {MAX_MEMBER:,})"
                    )
                if progress:
                    progress(info.filename)
                _through_temp(col, info.filename, partial(zf.open, info), Path(tmp))
    return col.report(str(path))


def _regular_member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> IO[bytes]:
    """The stream of a member already checked to be a regular file (`extractfile` is None only for other kinds)."""
    fh = tar.extractfile(member)
    if fh is None:
        raise tarfile.TarError(f"{member.name} is not a regular file")
    return fh


def _through_temp(col: _Collector, rel: str, opener: Callable[[], IO[bytes]], tmp: Path) -> None:
    target = tmp / "member"
    try:
        with opener() as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, fatbin.CHUNK)
        with open(target, "rb") as fh:
            col.add_file(rel, fh, os.path.getsize(target))
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as exc:
        raise EngineError(f"{rel}: cannot be read: {exc}") from None
    finally:
        target.unlink(missing_ok=True)


def audit_dir(path: Path, sm: int, progress: Callable[[str], None] | None = None) -> AuditReport:
    """Audit an unpacked site-packages directory in place (files read, nothing written)."""
    if not path.exists():
        raise EngineError(f"{path}: no such file or directory")
    if not path.is_dir():
        raise EngineError(f"{path}: not a directory")
    col = _Collector(sm)
    for dirpath, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            full = Path(dirpath) / name
            rel = full.relative_to(path).as_posix()
            if not is_candidate(rel) or full.is_symlink() or not full.is_file():
                continue
            if progress:
                progress(rel)
            try:
                with open(full, "rb") as fh:
                    col.add_file(rel, fh, full.stat().st_size)
            except OSError as exc:
                raise EngineError(f"{full}: cannot read: {exc.strerror or exc}") from None
    return col.report(str(path))


def audit_path(path: Path, sm: int, progress: Callable[[str], None] | None = None) -> AuditReport:
    if path.is_dir():
        return audit_dir(path, sm, progress)
    if not path.exists():
        raise EngineError(f"{path}: no such file or directory")
    if path.suffix != ".whl" and not zipfile.is_zipfile(path):
        head = path.open("rb").read(4)
        if head == b"\x7fELF":  # a single shared object
            col = _Collector(sm)
            with path.open("rb") as fh:
                col.add_file(path.name, fh, path.stat().st_size)
            return col.report(str(path))
    return audit_wheel(path, sm, progress)


SITE_PROBE = "import site, sys; print('\\n'.join(p for p in site.getsitepackages() + [site.getusersitepackages()]))"


def _docker() -> Any:
    return docker_client("overlay engine audit --image", EngineError)


def site_dirs(client: Any, image: str) -> list[str]:
    """The image's site-packages directories, from its own python3 (network off, no GPU)."""
    out = client.containers.run(image, entrypoint=["python3", "-c", SITE_PROBE], network_mode="none",
                                remove=True, stdout=True, stderr=False)
    return [line.strip() for line in out.decode(errors="replace").splitlines() if line.strip().startswith("/")]


class _ChunkStream(io.RawIOBase):
    """A raw stream over get_archive's chunk iterator (wrapped in a BufferedReader for tarfile)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._chunk = b""
        self._pos = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while self._pos >= len(self._chunk):
            try:
                self._chunk, self._pos = next(self._chunks), 0
            except StopIteration:
                return 0
        n = min(len(b), len(self._chunk) - self._pos)
        b[:n] = self._chunk[self._pos:self._pos + n]
        self._pos += n
        return n


def audit_image(image: str, sm: int, progress: Callable[[str], None] | None = None) -> AuditReport:
    """Audit a local Docker image: its site-packages streamed out (get_archive), `.so` files and
    ptxas kept one at a time in a temporary file; nothing of the image is run but python3's
    `site` probe."""
    client = _docker()
    from docker.errors import APIError, ContainerError, ImageNotFound, NotFound

    try:
        client.images.get(image)
    except ImageNotFound:
        raise EngineError(f"image {image!r} is not present locally; `docker pull {image}` or build it first") from None
    except APIError as exc:
        raise EngineError(f"image {image!r}: {exc.explanation or exc}") from None
    try:
        dirs = site_dirs(client, image)
    except (ContainerError, APIError) as exc:
        raise EngineError(
            f"image {image!r}: cannot list its site-packages with python3: {str(exc).splitlines()[0]}"
        ) from None
    col = _Collector(sm)
    container = client.containers.create(image, entrypoint=["/bin/true"], network_disabled=True)
    try:
        with tempfile.TemporaryDirectory(prefix="overlay-audit-") as tmp:
            for site in dirs:
                try:
                    chunks, _stat = container.get_archive(site, chunk_size=fatbin.CHUNK)
                except NotFound:
                    continue
                base = site.rstrip("/").rsplit("/", 1)[-1]
                stream = io.BufferedReader(_ChunkStream(iter(chunks)), fatbin.CHUNK)
                with tarfile.open(fileobj=stream, mode="r|") as tar:
                    for member in tar:
                        # stream mode keeps every TarInfo otherwise (~100k files); typeshed leaves `members` out
                        tar.members = []  # type: ignore[attr-defined]
                        rel = member.name.split("/", 1)[1] if member.name.startswith(base + "/") else member.name
                        if not member.isfile() or not is_candidate(rel):
                            continue
                        if member.size > MAX_MEMBER:
                            raise EngineError(f"image {image!r}: {rel} has {member.size:,} bytes (over {MAX_MEMBER:,})")
                        if progress:
                            progress(rel)
                        _through_temp(col, rel, partial(_regular_member, tar, member), Path(tmp))
    finally:
        container.remove(force=True)
    return col.report(image)
