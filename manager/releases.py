"""Real vLLM release sources from PyPI, downloaded once and cached.

`pip download --no-binary` of vLLM fails on its build requirements (an exact
torch with no sdist). The recipe that works: a helper venv with setuptools<81,
setuptools-scm, setuptools-rust, packaging, wheel and jinja2, a 4-file torch
stub on PYTHONPATH, and VLLM_TARGET_DEVICE=empty VLLM_VERSION_OVERRIDE=X.

Layout of the cache (default ~/.cache/overlay-manager, or $OVERLAY_CACHE):
    sdists/vllm-X.tar.gz       the downloaded source distribution
    trees/X/vllm/...           the extracted python package (pristine, read-only use)
    helper-venv/               the venv used for `pip download`
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from filelock import FileLock

from .errors import ReleaseError

ENV_CACHE = "OVERLAY_CACHE"

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
    raw = os.environ.get(ENV_CACHE)
    base = Path(raw) if raw else Path.home() / ".cache" / "overlay-manager"
    base.mkdir(parents=True, exist_ok=True)
    return base


def _run(cmd: list[str], env: dict[str, str] | None = None, what: str = "") -> None:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise ReleaseError(f"{what or cmd[0]} failed (exit {proc.returncode}): {' | '.join(tail)}")


def _helper_python(base: Path) -> Path:
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


def sdist(version: str) -> Path:
    """Path of the vLLM sdist for `version`, downloading it from PyPI when not cached."""
    base = cache_dir()
    target = base / "sdists" / f"vllm-{version}.tar.gz"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if target.exists():
            return target
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
    return target


def pristine_tree(version: str) -> Path:
    """A cached, extracted copy of the release's `vllm/` package: returns the root holding `vllm/`.

    Treat it as read-only; use `copy_release` for a tree to patch.
    """
    base = cache_dir()
    root = base / "trees" / version
    marker = root / ".complete"
    if marker.exists():
        return root
    archive = sdist(version)
    root.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root) + ".lock"):
        if marker.exists():
            return root
        shutil.rmtree(root, ignore_errors=True)
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
