"""In-memory delivery for read-only containers: what a compose service (or a Kubernetes pod) needs.

In memory mode nothing is written into the image: the bundle's `memory/` directory goes first on the
server's PYTHONPATH, its `sitecustomize.py` installs the import hook (manager/inmemory/hook.py) in every
interpreter the engine starts, and the hook serves each target module of the selected overlays from the
bundle's signed prepared plan, after checking the original file's sha256 (docs/compose.md, "In-memory
delivery (read-only containers)"). The entrypoint checks every plan against the image's files before the
server starts (manager/inmemory/check.py: refuses in one line, exit 1), builds kernels into the cache
volume and execs the server; it never runs `overlay apply`.

Shared by the compose rendering (render.py) and the Kubernetes one (the same paths become emptyDir volumes).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from typing import Protocol


class _Plan(Protocol):
    """What the entrypoint needs of a plan (manager.compose.render.ServicePlan has it)."""

    @property
    def slug(self) -> str: ...
    @property
    def overlays(self) -> tuple[str, ...]: ...
    @property
    def kernel_overlays(self) -> tuple[str, ...]: ...
    @property
    def server_command(self) -> tuple[str, ...]: ...


# The bundle's directory that goes on PYTHONPATH (sitecustomize.py + the stdlib-only hook package).
MEMORY_DIR = "memory"
HOOK_PACKAGE = "overlay_memory"  # the name the hook's modules have in the bundle's memory/ (never `manager`)
# Where everything the engine writes at run time goes (XDG caches, vLLM's, Triton's, torch's): one tmpfs.
RUNTIME_CACHE = "/tmp/overlay-runtime"

# Absolute container paths vLLM, torch, Triton and huggingface write in memory mode: tmpfs in compose,
# emptyDir in Kubernetes. The environment below points the caches under /tmp; the home-directory paths are
# for code that ignores those variables (root's home: the images run as root unless the platform says).
MEMORY_WRITABLE_PATHS: tuple[str, ...] = ("/tmp", "/var/tmp", "/root/.cache", "/root/.config", "/root/.triton")


def memory_environment(bundle_dir: str, kernel_cache: str, overlay_ids: Sequence[str]) -> dict[str, str]:
    """The environment the server (and the entrypoint's check) needs for in-memory delivery.

    PYTHONPATH is not set here: the entrypoint prepends `<bundle>/memory` to whatever the site gives,
    right before exec, so a site's own PYTHONPATH (an engine venv, a mounted root) keeps working."""
    return {
        "OVERLAY_DELIVERY": "memory",
        "OVERLAY_MEMORY_IDS": " ".join(overlay_ids),
        "OVERLAY_MEMORY_CATALOG": f"{bundle_dir}/catalog",
        "OVERLAY_MEMORY_PLANS": f"{bundle_dir}/plans",
        "OVERLAY_PLAN_KEY": f"{bundle_dir}/plan-key",
        # bytecode of patched modules, named by the patched text's sha256 (never next to the read-only sources)
        "OVERLAY_MEMORY_PYCACHE": f"{kernel_cache}/memory-pycache",
        # plans the full engine records when a policy says `engine` (signed with the bundle's key)
        "OVERLAY_PLAN_CACHE": f"{kernel_cache}/plans",
        "XDG_CACHE_HOME": f"{RUNTIME_CACHE}/cache",
        "XDG_CONFIG_HOME": f"{RUNTIME_CACHE}/config",
        "VLLM_CACHE_ROOT": f"{RUNTIME_CACHE}/vllm",
        "VLLM_CONFIG_ROOT": f"{RUNTIME_CACHE}/vllm-config",
        "TRITON_CACHE_DIR": f"{RUNTIME_CACHE}/triton",
        "TORCHINDUCTOR_CACHE_DIR": f"{RUNTIME_CACHE}/inductor",
        "HF_HOME": f"{RUNTIME_CACHE}/hf",
    }


def _words(words: Sequence[str]) -> str:
    return " ".join(shlex.quote(str(w)) for w in words)


_PATH = re.compile(r"^/[A-Za-z0-9._/-]*$")


def memory_entrypoint_script(plan: _Plan, bundle_dir: str, kernel_cache: str) -> str:
    """The POSIX sh entrypoint of memory mode: the pre-start check of the plans against the image's files
    (one line and a non-zero exit on refusal), the kernel build into the cache, exec of the server with the
    hook's directory first on PYTHONPATH. No `overlay apply`. Every word is shell-quoted (shlex.quote)."""
    for path in (bundle_dir, kernel_cache):
        if not _PATH.match(path):
            raise ValueError(f"container path {path!r}: expected an absolute path of [A-Za-z0-9._/-]")
    check = (f"import sys; sys.path.insert(0, sys.argv[1]); from {HOOK_PACKAGE}.inmemory.check import main; "
             "main(sys.argv[2:])")
    lines = [
        "#!/bin/sh",
        f"# overlay-manager entrypoint for {plan.slug} (in-memory delivery): check plans, build kernels, exec "
        + " ".join(plan.server_command).replace("\n", " ") + ".",
        "set -eu",
        f'OVERLAY="${{OVERLAY_BIN:-{bundle_dir}/bin/overlay}}"',
        f'MEMORY="{bundle_dir}/{MEMORY_DIR}"',
    ]
    if plan.overlays:
        lines += [
            "# every target of the selected overlays against the bundle's signed plan: refuses in one line, exit 1",
            f'OVERLAY_MEMORY_PLAN=$("${{OVERLAY_PYTHON:-python3}}" -c {shlex.quote(check)} "$MEMORY" '
            f"{_words(plan.overlays)})",
            "export OVERLAY_MEMORY_PLAN",
        ]
    else:
        lines.append("# no overlay is needed by this deployment")
    if plan.kernel_overlays:
        lines.append(f'"$OVERLAY" build {_words(plan.kernel_overlays)} '
                     f'--cache "${{OVERLAY_KERNEL_CACHE:-{kernel_cache}}}"')
    if plan.overlays:
        lines += [
            "# the import hook (sitecustomize.py) in every interpreter the server starts",
            'PYTHONPATH="$MEMORY${PYTHONPATH:+:$PYTHONPATH}"',
            "export PYTHONPATH",
        ]
    lines.append(f'exec {_words(plan.server_command)} "$@"')
    return "\n".join(lines) + "\n"
