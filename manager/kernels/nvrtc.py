"""NVRTC through ctypes: find libnvrtc, compile CUDA C++ to PTX or a cubin.

How the library is found (first hit wins; `find_nvrtc` returns what it used):
  1. an explicit path (`--nvrtc PATH` on `overlay build`, or $OVERLAY_NVRTC):
     the shared library itself or a directory holding libnvrtc.so*;
  2. the `nvidia-cuda-nvrtc-cu12` wheel in any sys.path entry
     (nvidia/cuda_nvrtc/lib/libnvrtc.so.12 — CUDA-12 torch and vLLM images have it),
     then CUDA-13 wheels (nvidia/cu13/lib/libnvrtc.so.13, nvidia/cuda_nvrtc/lib/libnvrtc.so.13);
  3. a CUDA toolkit: $CUDA_HOME/lib64, /usr/local/cuda/lib64, then the loader's search path.
Headers (cuda_fp16.h, mma.h) come from the matching wheels
(nvidia/cuda_runtime/include, nvidia/cuda_cccl/include) or the toolkit's include/.

Nothing here needs a GPU or imports torch.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from ..errors import BuildError

ENV_NVRTC = "OVERLAY_NVRTC"

_WHEEL_LIBS = (
    "nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
    "nvidia/cu13/lib/libnvrtc.so.13",
    "nvidia/cuda_nvrtc/lib/libnvrtc.so.13",
)


@dataclass(frozen=True)
class Nvrtc:
    """A loaded libnvrtc: its path, version, and the include dirs that go with it."""

    path: str
    version: tuple[int, int]
    include_dirs: tuple[str, ...]

    @property
    def version_str(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"

    def supports(self, arch: str) -> bool:
        """Whether this NVRTC can target `arch` (sm_70 / compute_70 need NVRTC <= 12)."""
        num = int(arch.split("_", 1)[1].rstrip("af"))
        return not (self.version[0] >= 13 and num < 75)


_LIBS: dict[str, ctypes.CDLL] = {}
_LOCK = threading.Lock()


def _lib(path: str) -> ctypes.CDLL:
    with _LOCK:
        lib = _LIBS.get(path)
        if lib is None:
            try:
                lib = ctypes.CDLL(path)
            except OSError as exc:
                raise BuildError(f"cannot load NVRTC library {path}: {exc}") from exc
            _declare(lib)
            _LIBS[path] = lib
        return lib


def _declare(lib: ctypes.CDLL) -> None:
    c_p = ctypes.c_void_p
    lib.nvrtcVersion.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    lib.nvrtcGetErrorString.argtypes = [ctypes.c_int]
    lib.nvrtcCreateProgram.argtypes = [
        ctypes.POINTER(c_p), ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int,
        ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_char_p),
    ]
    lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(c_p)]
    lib.nvrtcCompileProgram.argtypes = [c_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    for name in ("nvrtcGetProgramLogSize", "nvrtcGetPTXSize", "nvrtcGetCUBINSize"):
        getattr(lib, name).argtypes = [c_p, ctypes.POINTER(ctypes.c_size_t)]
    for name in ("nvrtcGetProgramLog", "nvrtcGetPTX", "nvrtcGetCUBIN"):
        getattr(lib, name).argtypes = [c_p, ctypes.c_char_p]


def _site_dirs() -> list[Path]:
    seen: list[Path] = []
    for entry in sys.path:
        if not entry:
            continue
        p = Path(entry)
        if p.is_dir() and p not in seen:
            seen.append(p)
    return seen


def _candidates(explicit: str | None) -> list[str]:
    raw = explicit or os.environ.get(ENV_NVRTC)
    if raw:
        p = Path(raw)
        if p.is_dir():
            hits = sorted(glob.glob(str(p / "**" / "libnvrtc.so*"), recursive=True))
            hits = [h for h in hits if "builtins" not in h and ".alt." not in h]
            if not hits:
                raise BuildError(f"no libnvrtc.so* under {p} (from --nvrtc / ${ENV_NVRTC})")
            return hits[:1]
        if not p.exists():
            raise BuildError(f"NVRTC library {p} does not exist (from --nvrtc / ${ENV_NVRTC})")
        return [str(p)]
    found: list[str] = []
    for rel in _WHEEL_LIBS:
        for site in _site_dirs():
            cand = site / rel
            if cand.exists():
                found.append(str(cand))
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    for base in filter(None, [cuda_home, "/usr/local/cuda"]):
        for lib in sorted(glob.glob(os.path.join(base, "lib64", "libnvrtc.so*"))):
            if "builtins" not in lib and ".alt." not in lib:
                found.append(lib)
    sys_lib = ctypes.util.find_library("nvrtc")
    if sys_lib:
        found.append(sys_lib)
    return found


def _include_dirs(lib_path: str, major: int) -> tuple[str, ...]:
    p = Path(lib_path).resolve()
    dirs: list[str] = []
    # wheel layout: .../nvidia/cuda_nvrtc/lib/libnvrtc.so.12 -> .../nvidia/{cuda_runtime,cuda_cccl}/include
    # cu13 layout:  .../nvidia/cu13/lib/libnvrtc.so.13       -> .../nvidia/cu13/include
    nvidia = p.parent.parent.parent
    for sub in ("cuda_runtime/include", "cuda_cccl/include", "cuda_nvrtc/include", "cu13/include"):
        cand = nvidia / sub
        if cand.is_dir() and (sub != "cu13/include" or major >= 13):
            dirs.append(str(cand))
    toolkit_inc = p.parent.parent / "include"
    if toolkit_inc.is_dir() and str(toolkit_inc) not in dirs:
        dirs.append(str(toolkit_inc))
    for site in _site_dirs():  # headers installed as separate wheels next to another site dir
        for sub in ("nvidia/cuda_runtime/include", "nvidia/cuda_cccl/include"):
            cand = site / sub
            if major < 13 and cand.is_dir() and str(cand) not in dirs:
                dirs.append(str(cand))
    return tuple(dirs)


def load(path: str) -> Nvrtc:
    lib = _lib(path)
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(lib, lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return Nvrtc(path=path, version=(major.value, minor.value), include_dirs=_include_dirs(path, major.value))


def find_nvrtc(explicit: str | None = None, arch: str | None = None) -> Nvrtc:
    """The first NVRTC found (see module doc) that can target `arch` when given."""
    cands = _candidates(explicit)
    if not cands:
        from ..extras import install_hint

        raise BuildError(f"no NVRTC library found: pass --nvrtc PATH / set ${ENV_NVRTC}, or {install_hint('kernels')}")
    rejected: list[str] = []
    for cand in cands:
        try:
            nv = load(cand)
        except BuildError as exc:
            rejected.append(str(exc))
            continue
        if arch is None or nv.supports(arch):
            return nv
        rejected.append(f"{cand} is NVRTC {nv.version_str}, which cannot target {arch}")
    raise BuildError(f"no usable NVRTC for {arch or 'any arch'}: {'; '.join(rejected)}")


def _check(lib: ctypes.CDLL, rc: int, what: str, log: str = "") -> None:
    if rc != 0:
        msg = lib.nvrtcGetErrorString(rc).decode()
        tail = f": {log.strip().splitlines()[-1]}" if log.strip() else ""
        raise BuildError(f"{what} failed ({msg}){tail}")


@dataclass(frozen=True)
class CompileOutput:
    image: bytes          # PTX text (virtual arch) or cubin bytes (real arch)
    kind: str             # "ptx" | "cubin"
    log: str


def compile_source(
    nv: Nvrtc,
    source: str,
    name: str,
    arch: str,
    options: list[str] | tuple[str, ...] = (),
    headers: dict[str, str] | None = None,
) -> CompileOutput:
    """Compile one translation unit for `arch` (compute_XY -> PTX, sm_XY -> cubin)."""
    lib = _lib(nv.path)
    headers = headers or {}
    prog = ctypes.c_void_p()
    hnames = list(headers)
    h_src = (ctypes.c_char_p * max(1, len(hnames)))(*[headers[h].encode() for h in hnames])
    h_inc = (ctypes.c_char_p * max(1, len(hnames)))(*[h.encode() for h in hnames])
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(),
                                       len(hnames), h_src, h_inc), "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture={arch}", *options, *[f"--include-path={d}" for d in nv.include_dirs]]
        c_opts = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        rc = lib.nvrtcCompileProgram(prog, len(opts), c_opts)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace")
        if rc != 0:
            first = next((ln for ln in log.splitlines() if "error" in ln), log.strip()[:200])
            raise BuildError(f"NVRTC {nv.version_str} could not compile {name} for {arch}: {first.strip()}")
        if arch.startswith("sm_"):
            lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
            out = ctypes.create_string_buffer(size.value)
            _check(lib, lib.nvrtcGetCUBIN(prog, out), "nvrtcGetCUBIN")
            return CompileOutput(image=out.raw[: size.value], kind="cubin", log=log)
        lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
        out = ctypes.create_string_buffer(size.value)
        _check(lib, lib.nvrtcGetPTX(prog, out), "nvrtcGetPTX")
        return CompileOutput(image=out.raw[: size.value].rstrip(b"\0"), kind="ptx", log=log)
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
