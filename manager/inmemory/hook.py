"""The import hook: each module of a verified in-memory plan is executed from its patched text.

`install()` runs from the bundle's `memory/sitecustomize.py` at the start of every interpreter the engine runs
(API server, engine core, workers; spawned ones run it themselves, forked ones inherit it and re-announce what
they hold). It puts a finder first on `sys.meta_path` that answers only for the plan's modules:

- an existing module is served only where the normal path finder would find it (the same file: another copy
  of vLLM on the path is left alone); its original bytes are read and their sha256 checked against the plan at
  import time, the hunks applied and the result's sha256 checked, then the code is compiled under the original
  file name (tracebacks, `inspect.getsource`, Triton's `@triton.jit` source hashing read it through linecache,
  which is given the patched lines);
- a created file is a module (or package) of its package, at the path the plan names (which does not exist);
- bytecode of patched text is never written next to the sources: only into `$OVERLAY_MEMORY_PYCACHE`, named by
  the sha256 of the patched text and the file name, or nowhere;
- each module served leaves `sys._overlay_memory` ({module: [overlay ids]}, the runtime marker), and with
  OVERLAY_TRACE=1 one line per overlay on stderr (manager/inmemory/marker.py), which `overlay trace` reads back.

Standard library only (manager/inmemory/__init__.py); loaded modules: os, sys, marshal and what the plan check
needs (json, the builtin sha256). A failure here never stops the interpreter: the pre-start check has refused
already, and a module whose bytes changed since raises ImportError naming overlay, file and hashes.
"""

from __future__ import annotations

import os
import sys

from .marker import line as _marker_line
from .memplan import ENV_CATALOG, ENV_PLAN, ENV_PLANS, MemoryPlan, MemoryRefused, Target, env_ids, find_root, select

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

ENV_PYCACHE = "OVERLAY_MEMORY_PYCACHE"
_MAGIC = b"overlay-memory-pyc/1\0"


def _trace(module: str, overlays: list[str]) -> None:
    if os.environ.get("OVERLAY_TRACE") == "1":
        for oid in overlays:
            sys.stderr.write(_marker_line(oid, os.getpid(), module) + "\n")
        sys.stderr.flush()


class MemoryLoader:
    """Executes one target's patched text under the original file name."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._source: bytes | None = None

    def source_bytes(self) -> bytes:
        if self._source is None:
            try:
                self._source = self.target.patched()
            except MemoryRefused as exc:
                raise ImportError(str(exc), name=self.target.module, path=self.target.full) from None
        return self._source

    # the loader protocol (importlib.abc.InspectLoader + ExecutionLoader, duck-typed: importlib.abc loads more)
    def create_module(self, spec: Any) -> None:
        return None

    def is_package(self, fullname: str) -> bool:
        return self.target.is_package

    def get_filename(self, fullname: str) -> str:
        return self.target.full

    def get_source(self, fullname: str) -> str:
        data = self.source_bytes()
        if b"coding" in b"\n".join(data.split(b"\n", 2)[:2]):  # a PEP 263 declaration: the tokenizer's decoding
            from importlib.util import decode_source

            return str(decode_source(data))
        return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")

    def get_code(self, fullname: str) -> Any:
        import marshal

        data = self.source_bytes()
        cache = _cache_file(self.target)
        if cache is not None:
            try:
                with open(cache, "rb") as fh:
                    blob = fh.read()
                if blob.startswith(_MAGIC):
                    return marshal.loads(blob[len(_MAGIC):])
            except (OSError, ValueError, EOFError, TypeError):
                pass
        code = compile(data, self.target.full, "exec", dont_inherit=True)
        if cache is not None:
            _write_cache(cache, _MAGIC + marshal.dumps(code))
        return code

    def exec_module(self, module: Any) -> None:
        code = self.get_code(module.__name__)
        _remember_lines(self.target.full, self.get_source(module.__name__))
        _LOADED[module.__name__] = list(self.target.overlays)
        _trace(module.__name__, self.target.overlays)
        exec(code, module.__dict__)


def _cache_file(t: Target) -> str | None:
    d = os.environ.get(ENV_PYCACHE)
    if not d:
        return None
    from ..state import sha256

    name = sha256(f"{t.post}\0{t.full}".encode()).hexdigest()[:32]
    return os.path.join(d, f"{name}.{sys.implementation.cache_tag}.pyc")


def _write_cache(path: str, blob: bytes) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "wb") as fh:
            fh.write(blob)
        os.replace(tmp, path)
    except OSError:  # a read-only or full cache: no bytecode, never an error
        try:
            os.unlink(tmp)
        except OSError:
            pass


# --- linecache: the patched lines for the original file name ----------------------------------------
_LINES: dict[str, list[str]] = {}


def _remember_lines(filename: str, text: str) -> None:
    import linecache

    lines = text.splitlines(True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    _LINES[filename] = lines
    # mtime None: linecache.checkcache keeps the entry (it stats only entries with an mtime)
    linecache.cache[filename] = (len(text), None, lines, filename)
    if not getattr(linecache.updatecache, "_overlay_memory", False):
        original = linecache.updatecache

        def updatecache(filename: str, module_globals: Any = None) -> list[str]:
            lines = _LINES.get(filename)
            if lines is None:
                return list(original(filename, module_globals))
            linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)
            return lines

        updatecache._overlay_memory = True  # type: ignore[attr-defined]
        linecache.updatecache = updatecache


# --- the finder -------------------------------------------------------------------------------------
_LOADED: dict[str, list[str]] = {}


class MemoryFinder:
    """First on sys.meta_path; answers only for the plan's modules."""

    def __init__(self, plan: MemoryPlan) -> None:
        self.plan = plan

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        t = self.plan.modules.get(fullname)
        if t is None:
            return None
        ModuleSpec, PathFinder = _machinery()

        if t.new:
            parent = os.path.dirname(t.full[: -len("/__init__.py")] if t.is_package else t.full)
            search = [parent] if path is None else [os.path.realpath(p) for p in path]
            if os.path.realpath(parent) not in search:
                return None
        else:
            spec = PathFinder.find_spec(fullname, path)
            if spec is None or spec.origin is None or os.path.realpath(spec.origin) != os.path.realpath(t.full):
                return None  # another copy of the package: not the file the plan was checked against
        spec = ModuleSpec(fullname, MemoryLoader(t), origin=t.full, is_package=t.is_package)  # type: ignore[arg-type]
        spec.has_location = True
        if t.is_package:
            spec.submodule_search_locations = [os.path.dirname(t.full)]
        return spec

    def invalidate_caches(self) -> None:
        pass


def _machinery() -> Any:
    """ModuleSpec and PathFinder from the interpreter's frozen importlib (importlib.machinery costs ~3 ms)."""
    bootstrap = sys.modules.get("_frozen_importlib")
    external = sys.modules.get("_frozen_importlib_external")
    if bootstrap is None or external is None:  # pragma: no cover - another implementation
        from importlib.machinery import ModuleSpec, PathFinder

        return ModuleSpec, PathFinder
    return bootstrap.ModuleSpec, external.PathFinder


def _announce_after_fork() -> None:
    for module, overlays in _LOADED.items():
        _trace(module, overlays)


def install(environ: Any = None) -> MemoryFinder | None:
    """The hook for the overlays `$OVERLAY_MEMORY_IDS` names (None when it names none). The plan is the file
    `$OVERLAY_MEMORY_PLAN` (chosen and checked by the entrypoint) or, without it, looked up as the check does."""
    env = os.environ if environ is None else environ
    ids = env_ids(env)
    if not ids:
        return None
    plan = select(ids, find_root(env), catalog=env.get(ENV_CATALOG), plans=env.get(ENV_PLANS),
                  plan_path=env.get(ENV_PLAN) or None, environ=env)
    finder = MemoryFinder(plan)
    sys.meta_path.insert(0, finder)
    sys._overlay_memory = _LOADED  # type: ignore[attr-defined]  # the runtime marker: {module: [overlay ids]}
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_announce_after_fork)
    return finder


def main() -> None:
    """sitecustomize's entry: install, or one line on stderr (the interpreter goes on without the overlays; the
    entrypoint's check has refused already where that matters)."""
    try:
        install()
    except MemoryRefused as exc:
        sys.stderr.write(f"overlay-memory: not installed: {exc}\n")
