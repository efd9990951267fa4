"""`overlay build`: compile kernel overlays with NVRTC into a content-addressed cache.

Cache layout (the compose's named volume, default `<OVERLAY_CACHE>/kernels`):

    objects/<k[:2]>/<k>/image.ptx | image.cubin    the compiled image
    objects/<k[:2]>/<k>/meta.json                   key, arch, kind, sha256 of the image, compiler
    index/<overlay-id>.json                         what the runtime loads: source/arch -> object
    locks/<k>.lock                                  one builder per key at a time (filelock)

k = sha256 over the source text, every header's text, the NVRTC options, the
NVRTC version and the arch.  A warm cache compiles nothing; an object whose
image no longer matches the sha256 recorded in its meta.json is rebuilt.
Objects are published by renaming a finished temporary directory, so readers
never see half-written entries and two processes building the same key end
with one compile (the second waits on the lock, then finds the object).

The builder prints nothing: it returns BuildItem records, and tells an optional
`BuildProgress` (the CLI's console, `manager.cli.build`) what it is doing as it goes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from contextlib import AbstractContextManager
from typing import Protocol
from collections.abc import Callable, Iterable, Iterator

from filelock import FileLock
from ..errors import BuildError
from ..fsutil import TMP_MARK, atomic_write, fsync_dir, sha256_bytes, write_if_changed
from ..state import catalog_overlay_ids
from . import nvrtc as _nvrtc
from .spec import KernelsSpec, load_kernels_spec

CACHE_FORMAT = 1
ENV_KERNEL_CACHE = "OVERLAY_KERNEL_CACHE"


def default_cache_dir() -> Path:
    raw = os.environ.get(ENV_KERNEL_CACHE)
    if raw:
        return Path(raw)
    from ..releases import cache_dir

    return cache_dir() / "kernels"


@dataclass(frozen=True)
class BuildItem:
    overlay: str
    source: str
    arch: str
    kind: str          # ptx | cubin
    key: str
    path: str          # the image, absolute
    action: str        # compiled | cached | rebuilt
    seconds: float


class BuildProgress(Protocol):
    """What a caller is told during a build (the records themselves are returned)."""

    def compiling(self, overlay: str, source: str, arch: str, compiler: str) -> AbstractContextManager[object]:
        """Entered around one NVRTC compilation."""
        ...

    def built(self, item: BuildItem, seconds: float) -> None:
        """One (source, arch) object is ready: compiled, rebuilt or found in the cache."""
        ...


@dataclass(frozen=True)
class BuildResult:
    cache: str
    compiler: str
    items: tuple[BuildItem, ...] = field(default_factory=tuple)

    @property
    def compiled(self) -> int:
        return sum(1 for i in self.items if i.action in ("compiled", "rebuilt"))

    def to_json(self) -> dict:
        return {
            "cache": self.cache,
            "compiler": self.compiler,
            "compiled": self.compiled,
            "cached": len(self.items) - self.compiled,
            "items": [i.__dict__ for i in self.items],
        }


def resolve_archs(spec: KernelsSpec, archs: Iterable[str] | None) -> list[str]:
    """`--arch sm_70 --arch sm_86` -> PTX for the lowest virtual arch plus one cubin per real arch."""
    archs = list(archs or [])
    if not archs:
        return list(dict.fromkeys(spec.archs))
    out: list[str] = []
    nums: list[int] = []
    for a in archs:
        try:
            kind, num = a.split("_", 1)
            n = int(num.rstrip("af"))
        except ValueError:
            raise BuildError(f"--arch {a!r}: expected sm_XY or compute_XY") from None
        if kind not in ("sm", "compute"):
            raise BuildError(f"--arch {a!r}: expected sm_XY or compute_XY")
        nums.append(n)
        if kind == "sm":
            out.append(a)
    virt = f"compute_{min(nums)}"
    return list(dict.fromkeys([virt, *out]))


def cache_key(source_text: str, headers: dict[str, str], options: list[str], compiler: str, arch: str) -> str:
    doc = {
        "format": CACHE_FORMAT,
        "source": sha256_bytes(source_text.encode()),
        "headers": {k: sha256_bytes(v.encode()) for k, v in sorted(headers.items())},
        "options": list(options),
        "compiler": compiler,
        "arch": arch,
    }
    return sha256_bytes(json.dumps(doc, sort_keys=True).encode())


def _object_dir(cache: Path, key: str) -> Path:
    return cache / "objects" / key[:2] / key


def _valid_object(obj: Path) -> Path | None:
    """The image path when the entry is complete and its image hashes to the recorded sha256."""
    try:
        meta = json.loads((obj / "meta.json").read_text())
        image = obj / meta["image"]
        data = image.read_bytes()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if sha256_bytes(data) != meta.get("sha256"):
        return None
    return image


def _publish(cache: Path, key: str, arch: str, kind: str, image: bytes, meta_extra: dict) -> Path:
    """Called with the key's lock held: any temp or trash directory of this key is then a
    killed build's, and goes."""
    obj = _object_dir(cache, key)
    obj.parent.mkdir(parents=True, exist_ok=True)
    for stale in [*obj.parent.glob(f".{key[:12]}.*"), *obj.parent.glob(f".trash-{key[:12]}-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key[:12]}.", dir=obj.parent))
    name = f"image.{kind}"
    (tmp / name).write_bytes(image)
    meta = {"format": CACHE_FORMAT, "key": key, "arch": arch, "kind": kind, "image": name,
            "sha256": sha256_bytes(image), **meta_extra}
    atomic_write(tmp / "meta.json", (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode())
    if obj.exists():  # a corrupt entry: move it aside, then replace
        trash = obj.parent / f".trash-{key[:12]}-{os.getpid()}-{time.monotonic_ns()}"
        os.replace(obj, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(tmp, obj)
    fsync_dir(obj.parent)
    return obj / name


@contextlib.contextmanager
def _cache_write(cache: Path, what: str) -> Iterator[None]:
    """A write into the kernel cache that the system refuses (full disk, read-only volume, a file
    where a directory belongs) is one BuildError naming the cache, not a traceback."""
    try:
        yield
    except OSError as exc:
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        raise BuildError(f"kernel cache {cache}: cannot write {what}: {exc.strerror or exc}{where}") from None


def _inside(overlay_dir: Path, rel: str) -> Path:
    """A kernel source/header: it must resolve (symlinks followed) inside the overlay directory."""
    base = Path(overlay_dir).resolve()
    real = (base / rel).resolve()
    if base not in real.parents:
        raise BuildError(f"{Path(overlay_dir) / rel}: resolves to {real}, "
                         f"outside the overlay directory {base}; refused")
    return real


def build_overlay(
    overlay_id: str,
    overlay_dir: Path,
    spec: KernelsSpec,
    cache: Path,
    nv_for: Callable[[str], _nvrtc.Nvrtc],
    archs: Iterable[str] | None = None,
    progress: BuildProgress | None = None,
) -> list[BuildItem]:
    """Build every source of one overlay for every arch; write its index. Returns one item per (source, arch)."""
    cache = Path(cache)
    headers = {}
    for rel in spec.headers:
        # NVRTC resolves #include "x.cuh" by the name relative to the source: register both spellings.
        text = _inside(overlay_dir, rel).read_text()
        headers[Path(rel).name] = text
        headers[rel] = text
    items: list[BuildItem] = []
    for arch in resolve_archs(spec, archs):
        nv = nv_for(arch)
        compiler = f"nvrtc {nv.version_str}"
        for src in spec.sources:
            text = _inside(overlay_dir, src.path).read_text()
            key = cache_key(text, headers, spec.options, compiler, arch)
            obj = _object_dir(cache, key)
            started = time.monotonic()
            image = _valid_object(obj)
            action = "cached"
            if image is None:
                with _cache_write(cache, "a lock"):
                    (cache / "locks").mkdir(parents=True, exist_ok=True)
                with _cache_write(cache, "a lock"), FileLock(str(cache / "locks" / f"{key}.lock")):
                    image = _valid_object(obj)  # another process may have built it meanwhile
                    if image is None:
                        action = "rebuilt" if obj.exists() else "compiled"
                        if progress:
                            with progress.compiling(overlay_id, src.path, arch, compiler):
                                out = _nvrtc.compile_source(nv, text, Path(src.path).name, arch, spec.options, headers)
                        else:
                            out = _nvrtc.compile_source(nv, text, Path(src.path).name, arch, spec.options, headers)
                        with _cache_write(cache, f"the object of {src.path} ({arch})"):
                            image = _publish(cache, key, arch, out.kind, out.image, {
                                "overlay": overlay_id, "source": src.path, "compiler": compiler,
                                "options": spec.options, "entries": [e.name for e in src.entries],
                            })
            seconds = time.monotonic() - started
            kind = "ptx" if arch.startswith("compute_") else "cubin"
            item = BuildItem(overlay_id, src.path, arch, kind, key, str(image), action, round(seconds, 3))
            if progress:
                progress.built(item, seconds)
            items.append(item)
    index = {
        "format": CACHE_FORMAT,
        "overlay": overlay_id,
        "spec": spec.model_dump(mode="json"),  # entry points for the runtime (no catalog needed)
        "objects": [
            {"source": i.source, "arch": i.arch, "kind": i.kind, "key": i.key,
             "path": str(Path(i.path).relative_to(cache)),
             "entries": [e.name for e in next(s for s in spec.sources if s.path == i.source).entries]}
            for i in items
        ],
    }
    with _cache_write(cache, "the index"):
        (cache / "locks").mkdir(parents=True, exist_ok=True)
        with FileLock(str(cache / "locks" / f"index-{overlay_id}.lock")):  # its temp files: only ours to clean
            for stale in (cache / "index").glob(f".{overlay_id}.json{TMP_MARK}*"):
                stale.unlink(missing_ok=True)
            write_if_changed(cache / "index" / f"{overlay_id}.json", (json.dumps(index, indent=2) + "\n").encode())
    return items


def kernel_overlays(overlays_dir: Path, ids: Iterable[str] | None) -> list[tuple[str, Path, KernelsSpec]]:
    """(id, dir, spec) for the named overlays (all with a kernels: section when none are named)."""
    overlays_dir = Path(overlays_dir)
    ids = list(ids or [])
    found: list[tuple[str, Path, KernelsSpec]] = []
    if ids:
        for oid in ids:
            d = overlays_dir / oid
            if not (d / "overlay.yaml").is_file():
                raise BuildError(f"overlay {oid!r}: no {d / 'overlay.yaml'}")
            spec = load_kernels_spec(d)
            if spec is None:
                raise BuildError(f"overlay {oid!r}: {d / 'overlay.yaml'} has no kernels: section")
            found.append((oid, d, spec))
        return found
    if not overlays_dir.is_dir():
        return found
    for d in (overlays_dir / oid for oid in catalog_overlay_ids(str(overlays_dir)) or []):
        spec = load_kernels_spec(d)
        if spec is not None:
            found.append((d.name, d, spec))
    return found


def build(
    overlays_dir: Path,
    ids: Iterable[str] | None = None,
    archs: Iterable[str] | None = None,
    cache: Path | None = None,
    nvrtc_path: str | None = None,
    progress: BuildProgress | None = None,
) -> BuildResult:
    """Build the named kernel overlays (or all of them) into `cache`."""
    cache = Path(cache) if cache else default_cache_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BuildError(f"kernel cache {cache}: {exc.strerror}") from exc
    found = kernel_overlays(overlays_dir, ids)
    loaded: dict[str, _nvrtc.Nvrtc] = {}

    def nv_for(arch: str) -> _nvrtc.Nvrtc:
        if arch not in loaded:
            loaded[arch] = _nvrtc.find_nvrtc(nvrtc_path, arch=arch)
        return loaded[arch]

    items: list[BuildItem] = []
    for oid, d, spec in found:
        items.extend(build_overlay(oid, d, spec, cache, nv_for, archs, progress))
    compilers = sorted({f"nvrtc {n.version_str} ({n.path})" for n in loaded.values()})
    return BuildResult(cache=str(cache), compiler="; ".join(compilers), items=tuple(items))


def summary(result: BuildResult) -> str:
    """The one-line outcome of a build (every kernel overlay yields at least one object)."""
    if not result.items:
        return "no kernel overlays to build"
    if result.compiled == 0:
        return f"kernel cache {result.cache} is warm: 0 compilations ({len(result.items)} objects cached)"
    return f"built {result.compiled} of {len(result.items)} objects into {result.cache}"
