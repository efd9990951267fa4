"""Real vLLM release sources from PyPI, downloaded once and cached.

`pip download --no-binary` of vLLM fails on its build requirements (an exact
torch with no sdist). The recipe that works: a helper venv with setuptools<81,
setuptools-scm, setuptools-rust, packaging, wheel and jinja2, a 4-file torch
stub on PYTHONPATH, and VLLM_TARGET_DEVICE=empty VLLM_VERSION_OVERRIDE=X.

The sdist itself is downloaded directly from the URL PyPI's simple index (PEP 691 JSON) lists
for it, sha256-checked against the digest listed there, so the download can report progress:
a `Progress` callback gets each step (the CLI draws a bar on a TTY, one line per step
otherwise; cache hits say so). Where the index cannot be read, the pip recipe above is the
fallback (no byte counts).

Layout of the cache (default ~/.cache/overlay-manager, or $OVERLAY_CACHE):
    sdists/vllm-X.tar.gz       the downloaded source distribution
    trees/X/vllm/...           the extracted python package (pristine, read-only use)
    helper-venv/               the venv used for `pip download`
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable

from .errors import ReleaseError

# filelock, tarfile, shutil, subprocess and tempfile are imported where they are used: every CLI
# command loads this module (progress reporting), `overlay apply` among them, which needs none of it

ENV_CACHE = "OVERLAY_CACHE"
PYPI_SIMPLE = "https://pypi.org/simple/{name}/"  # PEP 691 JSON: file URLs, sha256, sizes
_CHUNK = 1 << 16


@dataclass(frozen=True)
class Step:
    """One step of getting a release: `event` is cached | start | advance | done | fallback | extract."""

    event: str
    name: str
    done: int = 0  # bytes so far (advance/done)
    total: int | None = None  # bytes expected, when PyPI says
    detail: str = ""  # the URL (start), the cached path (cached), the reason (fallback), ...
    seconds: float = 0.0


Progress = Callable[[Step], None]
_progress: Progress | None = None


def set_progress(progress: Progress | None) -> None:
    """Where download/extract steps are reported (the CLI installs its reporter; None: silent)."""
    global _progress
    _progress = progress


def _report(step: Step) -> None:
    if _progress is not None:
        _progress(step)

_TORCH_STUB = {
    "torch/__init__.py": '__version__ = "0.0.0+stub"\nfrom . import version, utils\n',
    "torch/version.py": "cuda = hip = xpu = None\n",
    "torch/utils/__init__.py": "",
    "torch/utils/cpp_extension.py": "CUDA_HOME = ROCM_HOME = None\n",
}
_HELPER_REQS = [
    "setuptools>=77.0.3,<81",
    "setuptools-scm>=8",
    "setuptools-rust>=1.9",
    "packaging",
    "wheel",
    "jinja2",
]


def cache_dir() -> Path:
    """The cache directory, made when missing. Every cache user (sdists, trees, engine venvs, the
    kernel and GitHub caches, bundles) starts here, so this is the one check: a path that is, or
    lies under, something other than a directory is one ReleaseError naming $OVERLAY_CACHE and the
    path, and nothing is made."""
    raw = os.environ.get(ENV_CACHE)
    base = Path(raw) if raw else Path.home() / ".cache" / "overlay-manager"
    what = f"${ENV_CACHE}={raw}" if raw else f"the cache {base} (default; set ${ENV_CACHE} to move it)"
    return _make_dir(base, what)


def _make_dir(path: Path, what: str) -> Path:
    """mkdir -p `path`, or one ReleaseError naming `what` (a file in the way makes nothing)."""
    for up in (path, *path.parents):  # a regular file anywhere on the path: refused before any mkdir
        if up.is_symlink() or up.exists():
            if not up.is_dir():
                where = "is" if up == path else f"lies under {up}, which is"
                raise ReleaseError(f"{what}: {where} not a directory; the cache must be a directory")
            break
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReleaseError(f"{what}: cannot make the cache directory: {exc.strerror}") from None
    return path


def _run(cmd: list[str], env: dict[str, str] | None = None, what: str = "") -> None:
    import subprocess

    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise ReleaseError(f"{what or cmd[0]} failed (exit {proc.returncode}): {' | '.join(tail)}")


def _helper_python(base: Path) -> Path:
    import shutil

    from filelock import FileLock

    venv = base / "helper-venv"
    py = venv / "bin" / "python"
    marker = venv / ".ready"
    if marker.exists() and py.exists():
        return py
    with FileLock(str(base / "helper-venv.lock")):
        if marker.exists() and py.exists():
            return py
        shutil.rmtree(venv, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(venv)], what="creating the download helper venv")
        _run([str(py), "-m", "pip", "install", "-q", *_HELPER_REQS], what="installing the download helper")
        stub = venv / "torch-stub"
        for rel, text in _TORCH_STUB.items():
            p = stub / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        marker.write_text("ok\n")
    return py


def _sdist_url(version: str) -> tuple[str, str, int | None]:
    """(url, sha256, size) of the release's sdist, from PyPI's simple index (PEP 691 JSON)."""
    import urllib.parse
    import urllib.request

    index = PYPI_SIMPLE.format(name="vllm")
    req = urllib.request.Request(index, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 - a fixed https URL (tests: local)
        meta = json.load(resp)
    want = f"vllm-{version}.tar.gz"
    for f in meta.get("files", []):
        if f.get("filename") == want and f.get("hashes", {}).get("sha256"):
            return urllib.parse.urljoin(index, f["url"]), f["hashes"]["sha256"], f.get("size")
    raise ReleaseError(f"PyPI lists no {want} ({index})")


def _download(url: str, sha256: str, total: int | None, dest: Path, name: str) -> None:
    """Stream `url` into `dest` (atomically), reporting bytes; the sha256 must match."""
    import urllib.request

    h = hashlib.sha256()
    t0 = time.monotonic()
    _report(Step("start", name, 0, total, url))
    tmp = dest.with_name(f".{dest.name}.part-{os.getpid()}")
    try:
        with urllib.request.urlopen(url, timeout=60) as resp, open(tmp, "wb") as fh:  # noqa: S310
            if total is None and resp.headers.get("Content-Length", "").isdigit():
                total = int(resp.headers["Content-Length"])
            done = 0
            while True:
                chunk = resp.read(_CHUNK)
                if not chunk:
                    break
                fh.write(chunk)
                h.update(chunk)
                done += len(chunk)
                _report(Step("advance", name, done, total))
        if h.hexdigest() != sha256:
            raise ReleaseError(f"{url}: sha256 {h.hexdigest()} != {sha256} (PyPI's digest); not kept")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    _report(Step("done", name, done, total, f"sha256 {sha256[:12]}… ok", time.monotonic() - t0))


def _pip_sdist(version: str, base: Path, target: Path) -> None:
    import tempfile

    py = _helper_python(base)
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(py.parent.parent / "torch-stub"),
        VLLM_TARGET_DEVICE="empty",
        VLLM_VERSION_OVERRIDE=version,
        PIP_DISABLE_PIP_VERSION_CHECK="1",
    )
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        _run(
            [str(py), "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
             "--no-build-isolation", f"vllm=={version}", "-d", tmp],
            env=env,
            what=f"pip download vllm=={version}",
        )
        found = list(Path(tmp).glob("vllm-*.tar.gz"))
        if len(found) != 1:
            raise ReleaseError(f"pip download vllm=={version}: expected one sdist, got {found}")
        os.replace(found[0], target)


def sdist(version: str) -> Path:
    """Path of the vLLM sdist for `version`, downloading it from PyPI when not cached."""
    import urllib.error  # here, not at import: every command loads this module (progress reporting)

    from filelock import FileLock

    base = cache_dir()
    target = base / "sdists" / f"vllm-{version}.tar.gz"
    name = target.name
    if target.exists():
        _report(Step("cached", name, detail=str(target)))
        return target
    _make_dir(target.parent, f"cache directory {target.parent}")
    with FileLock(str(target) + ".lock"):
        if target.exists():
            _report(Step("cached", name, detail=str(target)))
            return target
        try:
            url, sha256, size = _sdist_url(version)
        except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
            _report(Step("fallback", name, detail=f"PyPI's simple index unreadable ({exc}); pip download"))
            t0 = time.monotonic()
            _pip_sdist(version, base, target)
            _report(Step("done", name, target.stat().st_size, None, "via pip", time.monotonic() - t0))
            return target
        try:
            _download(url, sha256, size, target, name)
        except urllib.error.URLError as exc:
            raise ReleaseError(f"downloading {url} failed: {exc.reason}") from None
    return target


def pristine_tree(version: str) -> Path:
    """A cached, extracted copy of the release's `vllm/` package: returns the root holding `vllm/`.

    Treat it as read-only; use `copy_release` for a tree to patch.
    """
    import shutil
    import tarfile
    import tempfile

    from filelock import FileLock

    base = cache_dir()
    root = base / "trees" / version
    marker = root / ".complete"
    if marker.exists():
        _report(Step("cached", f"vllm {version} sources", detail=str(root)))
        return root
    archive = sdist(version)
    _make_dir(root.parent, f"cache directory {root.parent}")
    with FileLock(str(root) + ".lock"):
        if marker.exists():
            return root
        shutil.rmtree(root, ignore_errors=True)
        _report(Step("extract", archive.name, detail=str(root)))
        tmp = Path(tempfile.mkdtemp(prefix=f".{version}.", dir=root.parent))
        prefix = f"vllm-{version}/vllm/"
        with tarfile.open(archive, "r:gz") as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix) and (m.isfile() or m.isdir())]
            if not members:
                raise ReleaseError(f"{archive}: no {prefix} inside")
            for m in members:
                m.name = m.name[len(f"vllm-{version}/"):]
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tmp, members=members, filter="data")
            else:  # Python < 3.10.12 / 3.11.4: no extraction filters
                tar.extractall(tmp, members=members)
        _write_dist_info(tmp, version)
        (tmp / ".complete").write_text(version + "\n")
        os.replace(tmp, root)
    return root


def _write_dist_info(root: Path, version: str) -> None:
    """Make the tree look like site-packages: a dist-info with the version, as pip would leave."""
    info = root / f"vllm-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")


def copy_release(version: str, dest: Path) -> Path:
    """Copy the release's `vllm/` package (and dist-info) into `dest`; returns `dest` (a root)."""
    import shutil

    src = pristine_tree(version)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for child in src.iterdir():
        if child.name.startswith("."):
            continue
        shutil.copytree(child, dest / child.name, dirs_exist_ok=True)
    return dest


ENV_RELEASE_FILES = "OVERLAY_RELEASE_FILES"


def release_file(version: str, path: str, sha256: str) -> bytes:
    """The bytes of `path` (relative to the package root, e.g. vllm/x.py) in vLLM `version`'s sdist,
    verified against `sha256`.

    Looked up first in `$OVERLAY_RELEASE_FILES/<sha256>` (a bundle's read-only, content-addressed
    copy: no network inside an image), then in the cache's `release-files/<sha256>`, else read from
    the release's pristine tree (downloading the sdist once) and stored there.
    """
    import hashlib

    from .fsutil import atomic_write

    def ok(data: bytes) -> bool:
        return hashlib.sha256(data).hexdigest() == sha256

    carried = os.environ.get(ENV_RELEASE_FILES)
    for base in ([Path(carried)] if carried else []) + [cache_dir() / "release-files"]:
        f = base / sha256
        if f.is_file():
            data = f.read_bytes()
            if ok(data):
                return data
    src = pristine_tree(version) / path
    try:
        data = src.read_bytes()
    except FileNotFoundError:
        raise ReleaseError(f"vLLM {version}: {path}: no such file in the release's sources") from None
    if not ok(data):
        got = hashlib.sha256(data).hexdigest()
        raise ReleaseError(f"vLLM {version}: {path}: sha256 {got[:16]}… does not match the pinned {sha256[:16]}…")
    dest = cache_dir() / "release-files" / sha256
    dest.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(dest, data)
    return data
