"""Load compiled kernels through the CUDA driver API and launch them on torch's stream.

ctypes on libcuda.so.1 (the driver every CUDA machine has); nothing is loaded
at import time, so this module imports on machines without a GPU or torch.
The current context is the one torch made current (its primary context); when
no context is current the device's primary context is retained and made current.

    kernels = load_overlay_kernels("sm70-d512-attention", prefer="ptx")
    kernels["paged_decode_d512"].launch(grid, args)   # args follow the manifest's params
"""

from __future__ import annotations

import ctypes
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Sequence

from ..errors import BuildError
from .spec import EntryPoint

_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
_CU_JIT_INFO_LOG_BUFFER = 3
_CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4
_CU_JIT_ERROR_LOG_BUFFER = 5
_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6

_driver_lock = threading.Lock()
_driver: Driver | None = None


class Driver:
    """The few driver entry points we need, declared once."""

    def __init__(self, path: str = "libcuda.so.1") -> None:
        try:
            self.lib = ctypes.CDLL(path)
        except OSError as exc:
            raise BuildError(f"cannot load the CUDA driver ({path}): {exc}") from exc
        lib = self.lib
        v, p, i, u = ctypes.c_void_p, ctypes.POINTER, ctypes.c_int, ctypes.c_uint
        lib.cuInit.argtypes = [u]
        lib.cuGetErrorString.argtypes = [i, p(ctypes.c_char_p)]
        lib.cuCtxGetCurrent.argtypes = [p(v)]
        lib.cuCtxSetCurrent.argtypes = [v]
        lib.cuCtxGetDevice.argtypes = [p(i)]
        lib.cuDeviceGet.argtypes = [p(i), i]
        lib.cuDeviceGetAttribute.argtypes = [p(i), i, i]
        lib.cuDevicePrimaryCtxRetain.argtypes = [p(v), i]
        lib.cuModuleLoadDataEx.argtypes = [p(v), ctypes.c_char_p, u, p(i), p(v)]
        lib.cuModuleGetFunction.argtypes = [p(v), v, ctypes.c_char_p]
        lib.cuModuleUnload.argtypes = [v]
        lib.cuFuncSetAttribute.argtypes = [v, i, i]
        lib.cuLaunchKernel.argtypes = [v, u, u, u, u, u, u, u, v, p(v), p(v)]
        lib.cuOccupancyMaxActiveBlocksPerMultiprocessor.argtypes = [p(i), v, i, ctypes.c_size_t]
        self.check(lib.cuInit(0), "cuInit")

    def check(self, rc: int, what: str, log: str = "") -> None:
        if rc != 0:
            s = ctypes.c_char_p()
            self.lib.cuGetErrorString(rc, ctypes.byref(s))
            msg = s.value.decode() if s.value else f"CUresult {rc}"
            extra = f": {log.strip()}" if log.strip() else ""
            raise BuildError(f"{what} failed ({msg}){extra}")

    def ensure_context(self, device: int | None = None) -> tuple[int, int]:
        """Make a context current (torch's if it made one). Returns (device ordinal, context handle)."""
        ctx = ctypes.c_void_p()
        self.check(self.lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
        if not ctx.value:
            dev = ctypes.c_int()
            self.check(self.lib.cuDeviceGet(ctypes.byref(dev), device or 0), "cuDeviceGet")
            self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
            self.check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        dev = ctypes.c_int()
        self.check(self.lib.cuCtxGetDevice(ctypes.byref(dev)), "cuCtxGetDevice")
        return dev.value, ctx.value or 0

    def compute_capability(self, device: int) -> tuple[int, int]:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.check(self.lib.cuDeviceGetAttribute(ctypes.byref(major), _CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                                 device), "cuDeviceGetAttribute")
        self.check(self.lib.cuDeviceGetAttribute(ctypes.byref(minor), _CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                                 device), "cuDeviceGetAttribute")
        return major.value, minor.value

    def load_module(self, image: bytes) -> int:
        """cuModuleLoadDataEx: a cubin, or PTX that the driver JIT-compiles for this device."""
        if image[:4] != b"\x7fELF" and not image.endswith(b"\0"):
            image = image + b"\0"
        log = ctypes.create_string_buffer(1 << 14)
        opts = (ctypes.c_int * 2)(_CU_JIT_ERROR_LOG_BUFFER, _CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
        vals = (ctypes.c_void_p * 2)(ctypes.cast(log, ctypes.c_void_p), ctypes.c_void_p(len(log)))
        mod = ctypes.c_void_p()
        self.check(self.lib.cuModuleLoadDataEx(ctypes.byref(mod), image, 2, opts, vals), "cuModuleLoadDataEx",
                   log.value.decode(errors="replace"))
        return mod.value or 0


def driver() -> Driver:
    global _driver
    with _driver_lock:
        if _driver is None:
            _driver = Driver()
        return _driver


_CTYPES = {"i32": ctypes.c_int32, "i64": ctypes.c_int64, "f32": ctypes.c_float}


def _ptr(value: Any) -> int:
    if hasattr(value, "data_ptr"):
        return int(value.data_ptr())
    if value is None:
        return 0
    return int(value)


@dataclass
class Kernel:
    """One entry point in a loaded module, launched with the manifest's parameter types."""

    entry: EntryPoint
    handle: int
    driver: Driver

    def occupancy(self, shared_bytes: int | None = None) -> int:
        """Resident blocks per multiprocessor for this entry's block size and shared memory."""
        n = ctypes.c_int()
        smem = self.entry.shared_bytes if shared_bytes is None else shared_bytes
        self.driver.check(self.driver.lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(n), ctypes.c_void_p(self.handle), self.entry.threads, smem),
            "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        return n.value

    def launch(self, grid: Sequence[int], args: Sequence[Any], stream: int | None = None,
               shared_bytes: int | None = None) -> None:
        params = self.entry.params
        if len(args) != len(params):
            raise BuildError(f"{self.entry.name}: {len(args)} arguments given, {len(params)} declared")
        holders: list[Any] = []  # ctypes scalars, one per declared parameter
        for p, a in zip(params, args, strict=False):
            holders.append(ctypes.c_uint64(_ptr(a)) if p.type == "ptr" else _CTYPES[p.type](a))
        argv = (ctypes.c_void_p * len(holders))(*[ctypes.cast(ctypes.byref(h), ctypes.c_void_p) for h in holders])
        if stream is None:
            stream = _torch_stream()
        g = list(grid) + [1] * (3 - len(grid))
        smem = self.entry.shared_bytes if shared_bytes is None else shared_bytes
        self.driver.check(
            self.driver.lib.cuLaunchKernel(self.handle, g[0], g[1], g[2], self.entry.threads, 1, 1, smem,
                                           ctypes.c_void_p(stream), argv, None),
            f"cuLaunchKernel({self.entry.name})",
        )


def _torch_stream() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.current_stream().cuda_stream)


@dataclass(frozen=True)
class LoadedObject:
    arch: str
    kind: str
    path: str


class KernelSet(dict):
    """name -> Kernel, plus which images were loaded (`.objects`)."""

    objects: list[LoadedObject]


def _select(objects: list[dict], cc: tuple[int, int], prefer: str) -> dict[str, dict]:
    """Per source: the cubin for exactly this device, else the newest PTX not newer than it."""
    dev = cc[0] * 10 + cc[1]
    by_source: dict[str, dict] = {}
    for src in dict.fromkeys(o["source"] for o in objects):
        cands = [o for o in objects if o["source"] == src]
        cubins = [o for o in cands if o["kind"] == "cubin" and int(o["arch"].split("_")[1].rstrip("af")) == dev]
        ptxs = sorted((o for o in cands if o["kind"] == "ptx" and int(o["arch"].split("_")[1].rstrip("af")) <= dev),
                      key=lambda o: int(o["arch"].split("_")[1].rstrip("af")))
        pick = None
        if prefer in ("auto", "cubin") and cubins:
            pick = cubins[0]
        elif prefer in ("auto", "ptx") and ptxs:
            pick = ptxs[-1]
        if pick is None:
            raise BuildError(f"no {prefer} image of {src} runs on sm_{dev} (built: "
                             f"{', '.join(o['arch'] for o in cands)}); run `overlay build --arch sm_{dev}`")
        by_source[src] = pick
    return by_source


def load_overlay_kernels(overlay_id: str, spec=None, cache: Path | None = None, prefer: str = "auto",
                         device: int | None = None, overlay_dir: Path | None = None) -> KernelSet:
    """Load an overlay's built images for the current device; `prefer` is auto | cubin | ptx."""
    from .builder import default_cache_dir
    from .spec import KernelsSpec, load_kernels_spec

    cache = Path(cache) if cache else default_cache_dir()
    index_path = cache / "index" / f"{overlay_id}.json"
    try:
        index = json.loads(index_path.read_text())
    except FileNotFoundError:
        raise BuildError(f"{index_path}: not built; run `overlay build {overlay_id} --cache {cache}`") from None
    if spec is None:
        if overlay_dir is not None:
            spec = load_kernels_spec(Path(overlay_dir))
        elif "spec" in index:
            spec = KernelsSpec.model_validate(index["spec"])
        else:
            from ..catalog import Catalog

            spec = load_kernels_spec(Catalog.locate().overlays_dir / overlay_id)
        if spec is None:
            raise BuildError(f"overlay {overlay_id!r} has no kernels: section")
    drv = driver()
    dev, _ctx = drv.ensure_context(device)
    cc = drv.compute_capability(dev)
    picks = _select(index["objects"], cc, prefer)
    kernels = KernelSet()
    kernels.objects = []
    for src in spec.sources:
        obj = picks.get(src.path)
        if obj is None:
            raise BuildError(f"{index_path}: no object for {src.path}; rebuild the overlay")
        path = cache / obj["path"]
        mod = drv.load_module(path.read_bytes())
        kernels.objects.append(LoadedObject(obj["arch"], obj["kind"], str(path)))
        for e in src.entries:
            fn = ctypes.c_void_p()
            drv.check(drv.lib.cuModuleGetFunction(ctypes.byref(fn), ctypes.c_void_p(mod), e.name.encode()),
                      f"cuModuleGetFunction({e.name})")
            if e.shared_bytes > 48 * 1024:
                drv.check(drv.lib.cuFuncSetAttribute(fn, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                     e.shared_bytes), f"cuFuncSetAttribute({e.name})")
            kernels[e.name] = Kernel(e, fn.value or 0, drv)
    return kernels
