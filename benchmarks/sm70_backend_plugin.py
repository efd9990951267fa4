"""The alternative delivery of the sm70-d512-attention route (issue 32 point 3), a prototype: not shipped.

A vLLM general plugin that registers `AttentionBackendEnum.CUSTOM` as `SM70Backend`, a subclass of vLLM's
`TritonAttentionBackend` (so the selector validates it as Triton: any head size >= 32, fp16/bf16/fp32, every
compute capability) whose impl, `SM70Impl(TritonAttentionImpl)`, calls the overlay's own route module
(`files/sm70_d512_attn.py`, `sm70_attention_forward`) and falls back to `super().forward` — the same route
code as the `TritonAttentionImpl.forward` edit, the same one logged line per fallback reason; only the delivery
differs. Selected with `--attention-backend CUSTOM` (`LLM(attention_backend="CUSTOM")`), in vLLM 0.19.1 and
0.20.0 alike (`vllm/v1/attention/backends/registry.py` has `CUSTOM` and `register_backend` in both).

vLLM finds the plugin through the `vllm.general_plugins` entry-point group (`vllm/plugins/__init__.py`),
loaded in every process (the API process, the engine core, each worker) by `load_general_plugins()`.
`write_dist_info(site)` makes the smallest installed distribution that carries the entry point: this module
plus a `*.dist-info` with METADATA and entry_points.txt in one directory; `importlib.metadata` finds it on any
`sys.path` entry, so the measurement puts that directory on the plugin arm's PYTHONPATH only (a deployment
would `pip install` a wheel into the engine's site-packages instead: the same files).

When the engine's tree does not carry the route module (the plugin arm runs on a tree without the overlay's
edits), `ensure_route_module()` loads the overlay's two files under their vLLM names from
`$OVERLAY_MANAGER_HOME/overlays/sm70-d512-attention/files` (or this checkout's).

Importing this module needs no vLLM: the classes are built on first attribute access (`SM70Backend`,
`SM70Impl`), which is how vLLM's `resolve_obj_by_qualname` reaches them.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

DIST = "sm70_backend_plugin"
VERSION = "0.0.0"
GROUP = "vllm.general_plugins"
ENTRY = "sm70_backend"
OVERLAY = "sm70-d512-attention"
PKG = "vllm.v1.attention.backends"
ROUTE = f"{PKG}.sm70_d512_attn"
LAUNCHER = f"{PKG}.sm70_d512_kernels"
_built: dict = {}


def entry_points_txt(module: str = DIST, func: str = "register") -> str:
    """entry_points.txt naming `module:func` in vLLM's general-plugins group."""
    return f"[{GROUP}]\n{ENTRY} = {module}:{func}\n"


def write_dist_info(site: Path, module_src: Path | None = None) -> Path:
    """This module and a minimal `<DIST>-<VERSION>.dist-info` (METADATA, entry_points.txt, RECORD) in `site`
    (made if absent); idempotent. Returns the dist-info directory."""
    site.mkdir(parents=True, exist_ok=True)
    src = Path(module_src or __file__)
    (site / f"{DIST}.py").write_bytes(src.read_bytes())
    info = site / f"{DIST}-{VERSION}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST}\nVersion: {VERSION}\n")
    (info / "entry_points.txt").write_text(entry_points_txt())
    (info / "RECORD").write_text(f"{DIST}.py,,\n{info.name}/METADATA,,\n{info.name}/entry_points.txt,,\n"
                                 f"{info.name}/RECORD,,\n")
    return info


def overlay_files(home: str | None = None) -> Path:
    """The overlay's files/ directory: under $OVERLAY_MANAGER_HOME (the engine run's project copy), else beside
    this checkout's benchmarks/."""
    base = Path(home or os.environ.get("OVERLAY_MANAGER_HOME") or Path(__file__).resolve().parents[1])
    return base / "overlays" / OVERLAY / "files"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    setattr(sys.modules[PKG], name.rsplit(".", 1)[1], mod)
    return mod


def ensure_route_module(home: str | None = None):
    """The route module under its vLLM name: the tree's (overlay applied) or the overlay's files loaded here."""
    if ROUTE in sys.modules:
        return sys.modules[ROUTE]
    import importlib

    importlib.import_module(PKG)
    if importlib.util.find_spec(ROUTE) is not None:
        return importlib.import_module(ROUTE)
    home = home or os.environ.get("OVERLAY_MANAGER_HOME")
    if home and home not in sys.path:   # the launcher imports manager.kernels.runtime (the route module does this too)
        sys.path.append(home)
    files = overlay_files(home)
    _load(LAUNCHER, files / "sm70_d512_kernels.py")
    return _load(ROUTE, files / "sm70_d512_attn.py")


def register() -> None:
    """The entry point: CUSTOM -> this module's SM70Backend (vLLM resolves the path lazily, in each process)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    ensure_route_module()
    register_backend(AttentionBackendEnum.CUSTOM, f"{__name__}.SM70Backend")


def build(triton_attn=None) -> tuple[type, type]:
    """(SM70Backend, SM70Impl) on `triton_attn` (vLLM's triton_attn module unless given: the CPU benchmark
    passes the stock one with its kernel call stubbed)."""
    key = id(triton_attn)
    if key in _built:
        return _built[key]
    if triton_attn is None:
        from vllm.v1.attention.backends import triton_attn
    route = ensure_route_module().sm70_attention_forward
    base_impl, base_backend = triton_attn.TritonAttentionImpl, triton_attn.TritonAttentionBackend
    encoder = (triton_attn.AttentionType.ENCODER_ONLY, triton_attn.AttentionType.ENCODER)

    class SM70Impl(base_impl):
        def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None, output_scale=None,
                    output_block_scale=None):
            # the edit's conditions: after the profiling run, encoder and output-quantization exits, with the
            # cache views Triton's forward makes (fp8 caches viewed as the platform's fp8 type)
            if (attn_metadata is not None and output is not None and output_scale is None
                    and output_block_scale is None and self.attn_type not in encoder):
                key_cache, value_cache = kv_cache.unbind(1)
                if self.kv_cache_dtype.startswith("fp8") and key_cache.dtype != self.fp8_dtype:
                    key_cache, value_cache = key_cache.view(self.fp8_dtype), value_cache.view(self.fp8_dtype)
                if route(self, query, key_cache, value_cache, output, attn_metadata, layer):
                    return output
            return super().forward(layer, query, key, value, kv_cache, attn_metadata, output, output_scale,
                                   output_block_scale)

    class SM70Backend(base_backend):
        @staticmethod
        def get_name() -> str:
            return "CUSTOM"

        @staticmethod
        def get_impl_cls():
            return SM70Impl

    SM70Impl.__module__ = SM70Backend.__module__ = __name__
    SM70Impl.__qualname__, SM70Backend.__qualname__ = "SM70Impl", "SM70Backend"
    _built[key] = (SM70Backend, SM70Impl)
    return _built[key]


def __getattr__(name: str):
    if name in ("SM70Backend", "SM70Impl"):
        backend, impl = build()
        return backend if name == "SM70Backend" else impl
    raise AttributeError(name)
