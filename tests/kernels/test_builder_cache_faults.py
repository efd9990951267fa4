"""Issue 28 point 12: `overlay build` into a full, read-only or misplaced kernel cache is one
BuildError naming the cache and the problem (exit 1), never an OSError traceback (exit 3).
NVRTC is replaced by a stand-in: these tests are about the cache writes, not the compiler."""

from __future__ import annotations

import errno
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from manager.errors import BuildError
from manager.kernels import builder
from manager.kernels.nvrtc import CompileOutput
from tests.helpers import SHIPPED_OVERLAYS


@pytest.fixture
def catalog(tmp_path: Path, monkeypatch) -> Path:
    dest = tmp_path / "overlays" / "sm70-d512-attention"
    shutil.copytree(SHIPPED_OVERLAYS / "sm70-d512-attention", dest)
    monkeypatch.setattr(builder._nvrtc, "find_nvrtc",
                        lambda *a, **k: SimpleNamespace(version_str="12.9", path="/stand-in/libnvrtc.so"))
    monkeypatch.setattr(builder._nvrtc, "compile_source",
                        lambda nv, text, name, arch, options, headers: CompileOutput(b"image-" + arch.encode(),
                                                                                    "ptx" if arch.startswith("compute_") else "cubin", ""))
    return tmp_path / "overlays"


def _build(catalog: Path, cache: Path):
    return builder.build(catalog, ["sm70-d512-attention"], cache=cache, progress=False)


def test_the_stand_in_builds(catalog, tmp_path):
    assert _build(catalog, tmp_path / "c").compiled == 4


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EROFS])
def test_a_full_or_read_only_cache_is_one_build_error(catalog, tmp_path, monkeypatch, err):
    def refused(*a, **k):
        raise OSError(err, __import__("os").strerror(err))

    monkeypatch.setattr(tempfile, "mkdtemp", refused)
    with pytest.raises(BuildError, match=f"kernel cache {tmp_path / 'c'}: cannot write"):
        _build(catalog, tmp_path / "c")


def test_a_full_cache_at_the_index_is_one_build_error(catalog, tmp_path, monkeypatch):
    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(builder, "write_if_changed", full)
    with pytest.raises(BuildError, match="cannot write the index"):
        _build(catalog, tmp_path / "c")


def test_a_regular_file_in_place_of_the_objects_directory_is_one_build_error(catalog, tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "objects").write_text("not a directory\n")
    with pytest.raises(BuildError, match="kernel cache"):
        _build(catalog, tmp_path / "c")
