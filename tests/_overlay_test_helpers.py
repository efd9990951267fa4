"""Helpers for the overlay engine's failure-path, property and manifest tests (no conftest edits)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

# The three Python overlays of issue 2 (the catalog may hold others that are work in progress).
THREE = ("dynamo-dict-caches", "gemma4-convertor-per-layer", "vllm-pr40886-gemma4-awq-moe-keys")


def make_catalog(dest: Path, ids=THREE, copies: tuple[str, ...] = ()) -> Path:
    """A catalog dir with overlays/ holding symlinks to the shipped overlays `ids`;
    those in `copies` are real copies instead (so a test may break them)."""
    from _overlay_helpers import make_catalog_dir

    return make_catalog_dir(dest, ids, copies=copies)


def tree_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under root (relative path -> hash), symlinks included by target."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for f in filenames:
            p = Path(dirpath) / f
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _entry(env: dict | None) -> str:
    """`python -m` target: the CLI, or with OVERLAY_TEST_WRITE_DELAY set, the CLI behind the write-delay seam."""
    return "manager.testing.faults" if env and "OVERLAY_TEST_WRITE_DELAY" in env else "manager"


def cli(*args: str, env: dict | None = None, timeout: float = 120, inherit_env: bool = True) -> subprocess.CompletedProcess:
    """Run `python -m manager ARGS` (the `overlay` CLI) in a fresh process: the one subprocess runner
    of the tests. `env` is added to this process's environment (or, `inherit_env=False`, is all of it)."""
    full_env = dict(os.environ) if inherit_env else {}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", _entry(env), *args],
        capture_output=True, text=True, env=full_env, timeout=timeout, cwd=REPO_ROOT,
    )


def popen_cli(*args: str, env: dict | None = None) -> subprocess.Popen:
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.Popen(
        [sys.executable, "-m", _entry(env), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env, cwd=REPO_ROOT,
    )
