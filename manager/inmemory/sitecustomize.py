# overlay-manager in-memory delivery (docs/compose.md, "In-memory delivery (read-only containers)").
# `overlay bundle` copies this file into its memory/ directory, which the memory-mode entrypoint puts first on
# PYTHONPATH: every interpreter of the server runs it at start-up. It installs the import hook
# (overlay_memory/inmemory/hook.py) when $OVERLAY_MEMORY_IDS names overlays, then runs the sitecustomize it
# shadows (the image's own), if there is one. Standard library only.


def _overlay_memory_start() -> None:
    import os
    import sys

    if os.environ.get("OVERLAY_MEMORY_IDS"):
        from overlay_memory.inmemory.hook import main  # type: ignore[import-not-found]  # the bundle's copy

        main()
    here = os.path.dirname(os.path.abspath(__file__))
    # the path finder the interpreter already has (importing importlib.machinery costs ~3 ms at every start)
    path_finder = next(f for f in sys.meta_path if getattr(f, "__name__", "") == "PathFinder")
    spec = path_finder.find_spec("sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != here])
    if spec is not None and spec.loader is not None:
        module = sys.modules[__name__]
        module.__file__ = spec.origin
        spec.loader.exec_module(module)  # type: ignore[arg-type]


if __name__ == "sitecustomize":  # only as the interpreter's sitecustomize (not when imported as manager.inmemory.*)
    _overlay_memory_start()
