"""Render deployments to docker-compose YAML with jinja2, injection-safe by construction.

Two templates ship as package resources (manager/templates): `entrypoint.sh.j2`
(the POSIX shell script the container runs) and `compose.yml.j2`.

Safety does not rest on template authors remembering to quote:
- the environment uses StrictUndefined (a missing variable is an error);
- its `finalize` hook sees the result of every `{{ ... }}` expression and refuses
  anything that is not a `Quoted` value. Only the quoting filters build `Quoted`:
  `sh` (POSIX single-quoting), `yq` (a YAML double-quoted scalar with Compose's
  `$` escaped to `$$`), `interp` (a validated `${NAME:-default}` Compose
  interpolation) and `lit` (a value that matches a closed safe pattern, e.g. a
  slug or an integer). A template that prints a raw string fails to render;
- after rendering, the YAML is parsed and checked against an allow-list of keys,
  so even a template bug cannot add `privileged: true` or a host mount.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field, replace
from typing import TypeVar
from collections.abc import Mapping

import jinja2
import yaml

from ..errors import ComposeError

# Paths inside the container (fixed: the entrypoint, bundle and healthcheck agree on them).
BUNDLE_MOUNT = "/opt/overlay"
MODELS_MOUNT = "/models"
KERNEL_CACHE = "/var/cache/overlay-kernels"
CONTAINER_PORT = 8000

_SAFE_LITERAL = re.compile(r"^[A-Za-z0-9/][A-Za-z0-9._/-]*$")
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")


_T = TypeVar("_T")


class Quoted(str):
    """A string already quoted for the context it is printed in (the only thing `finalize` lets through)."""


def _yaml_scalar(value: object) -> Quoted:
    value = _defined(value)
    if isinstance(value, bool):
        return Quoted("true" if value else "false")
    if isinstance(value, int):
        return Quoted(str(value))
    if isinstance(value, float):
        return Quoted(repr(value))
    if not isinstance(value, str):
        raise ComposeError(f"cannot render {type(value).__name__} value {value!r} as a YAML scalar")
    # `$` -> `$$` stops Compose interpolation; everything outside printable ASCII is escaped.
    return Quoted('"' + "".join(_escape_char(c) for c in value.replace("$", "$$")) + '"')


def _escape_char(c: str) -> str:
    if c == '"' or c == "\\":
        return "\\" + c
    o = ord(c)
    if 0x20 <= o <= 0x7E:
        return c
    if o <= 0xFF:
        return f"\\x{o:02x}"
    if o <= 0xFFFF:
        return f"\\u{o:04x}"
    return f"\\U{o:08x}"


def _defined(value: _T) -> _T:
    if isinstance(value, jinja2.Undefined):
        str(value)  # StrictUndefined raises UndefinedError naming the variable
    return value


def yq(value: object) -> Quoted:
    """Any scalar as an inert YAML value (Compose interpolation disabled)."""
    return _yaml_scalar(value)


_BLOCK_OK = re.compile(r"^[\x20-\x7e\n]*$")


def yblock(value: str, indent: int) -> Quoted:
    """A multi-line string as a YAML literal block (`|`) indented by `indent` spaces, `$` escaped.

    Falls back to a double-quoted scalar whenever the text could not round-trip exactly
    through a literal block (control characters, leading spaces, trailing blank lines).
    """
    value = _defined(value)
    if not isinstance(value, str):
        raise ComposeError(f"yblock: {value!r} is not a string")
    text = value.replace("$", "$$")
    lines = text.split("\n")
    if (
        not _BLOCK_OK.match(text)
        or not text.endswith("\n")
        or text.endswith("\n\n")
        or not lines[0]
        or lines[0].startswith(" ")
        or any(line != line.rstrip(" ") for line in lines)
    ):
        return _yaml_scalar(value)
    pad = " " * indent
    body = "\n".join((pad + line) if line else "" for line in lines[:-1])
    return Quoted("|\n" + body)


def sh(value: object) -> Quoted:
    """A POSIX shell word that expands to exactly `value`."""
    value = _defined(value)
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ComposeError(f"cannot render {value!r} as a shell word")
    text = str(value)
    if "\x00" in text:
        raise ComposeError(f"shell word {text!r} contains NUL")
    return Quoted(shlex.quote(text))


def interp(name: str, default: object) -> Quoted:
    """`${NAME:-default}` for Compose, as a quoted YAML scalar; NAME and default are validated."""
    if not _ENV_NAME.match(name):
        raise ComposeError(f"interpolation variable {name!r} is not an upper-case variable name")
    d = str(default)
    if not re.fullmatch(r"[A-Za-z0-9._/:@+-]*", d):
        raise ComposeError(f"interpolation default {d!r} contains characters Compose would interpret")
    return Quoted("${" + name + ":-" + d + "}")


def lit(value: object) -> Quoted:
    """A value from a closed alphabet (slugs, ids, integers): printed as is, rejected otherwise."""
    value = _defined(value)
    if isinstance(value, bool):
        raise ComposeError(f"lit: {value!r} is a bool")
    text = str(value)
    if not _SAFE_LITERAL.match(text) or text.lower() in ("true", "false", "null", "yes", "no", "on", "off", "~"):
        raise ComposeError(f"{text!r} is not a plain identifier and cannot be printed unquoted")
    return Quoted(text)


def comment(value: object) -> Quoted:
    """Free text for one `# ...` comment line: control characters (newlines included) become spaces."""
    text = str(_defined(value))
    return Quoted("".join(ch if ch.isprintable() else " " for ch in text))


def _finalize(value: object) -> Quoted:
    if isinstance(value, Quoted):
        return value
    raise ComposeError(
        f"template printed an unquoted value {value!r}; pass it through yq, sh, interp or lit"
    )


_ENV: jinja2.Environment | None = None


def environment() -> jinja2.Environment:
    global _ENV
    if _ENV is None:
        env = jinja2.Environment(
            loader=jinja2.PackageLoader("manager", "templates"),
            undefined=jinja2.StrictUndefined,
            finalize=_finalize,
            autoescape=False,
            keep_trailing_newline=True,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        env.filters.update(yq=yq, sh=sh, lit=lit, yblock=yblock, comment=comment)
        env.globals.update(interp=interp)
        _ENV = env
    return _ENV


@dataclass(frozen=True)
class ServicePlan:
    """Everything a compose service needs, computed from the registry + profiles + fits()."""

    slug: str
    image: str
    serve_args: tuple[str, ...]
    overlays: tuple[str, ...] = ()
    kernel_overlays: tuple[str, ...] = ()
    gpus: int = 1
    tp: int = 1
    port: int = 8000
    status: str = "experimental"
    note: str = ""
    engine: str = ""
    vllm_version: str = ""
    model: str = ""
    hardware: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    shm_size: str | None = None
    verdict: str = ""
    failing: tuple[str, ...] = ()
    # What fits() could not verify or what fails: printed as WARNING lines in the file's header.
    warnings: tuple[str, ...] = ()
    # How the entrypoint starts the server (the engine profile's `server`), and what the engine runs on:
    # a "cpu" plan never gets an NVIDIA device reservation.
    server_command: tuple[str, ...] = ("vllm", "serve")
    device: str = "cuda"
    # "files": the entrypoint runs `overlay apply` (a writable image); "memory": read-only root, the overlays
    # served from the bundle's plans by the import hook (manager/compose/memory.py)
    delivery: str = "files"


@dataclass(frozen=True)
class RenderOptions:
    """`gpu=False` leaves out the NVIDIA device reservation (machines without the NVIDIA runtime, CI);
    a CPU engine's plan never has one."""

    gpu: bool = True
    delivery: str | None = None  # overrides the plan's (`compose render --delivery`)


DELIVERIES = ("files", "memory")


def render_entrypoint(plan: ServicePlan) -> str:
    """The POSIX sh script run as the container's entrypoint (before Compose `$` escaping)."""
    if plan.delivery == "memory":
        from .memory import memory_entrypoint_script

        return memory_entrypoint_script(plan, BUNDLE_MOUNT, KERNEL_CACHE)
    text = environment().get_template("entrypoint.sh.j2").render(
        plan=plan, bundle=BUNDLE_MOUNT, kernel_cache=KERNEL_CACHE
    )
    return text


def _env_items(plan: ServicePlan) -> list[tuple[str, str]]:
    base = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "OVERLAY_KERNEL_CACHE": KERNEL_CACHE,
    }
    if plan.tp > 1:
        base.update(NCCL_IB_DISABLE="1", VLLM_WORKER_MULTIPROC_METHOD="spawn")
    if plan.kernel_overlays:
        # the routed vLLM code imports manager.kernels from the bundle to launch the kernels
        base["OVERLAY_MANAGER_HOME"] = f"{BUNDLE_MOUNT}/site"
    if plan.delivery == "memory":
        from .memory import memory_environment

        base.update(memory_environment(BUNDLE_MOUNT, KERNEL_CACHE, plan.overlays))
    base.update(plan.env)
    for k in base:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            raise ComposeError(f"{plan.slug}: environment name {k!r} is not a valid variable name")
    return sorted(base.items())


def render_compose(plan: ServicePlan, options: RenderOptions = RenderOptions()) -> str:
    """The compose file text for one deployment (validated against the key allow-list)."""
    if plan.gpus < plan.tp:
        raise ComposeError(f"{plan.slug}: tp={plan.tp} needs at least {plan.tp} GPUs, registry gives {plan.gpus}")
    if not plan.server_command:
        raise ComposeError(f"{plan.slug}: no server command")
    gpu = options.gpu and plan.device == "cuda"
    if options.delivery is not None:
        if options.delivery not in DELIVERIES:
            raise ComposeError(f"--delivery {options.delivery!r}: expected one of {', '.join(DELIVERIES)}")
        plan = replace(plan, delivery=options.delivery)
    script = render_entrypoint(plan)
    health = (
        "import sys, urllib.request; "
        f"sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:{CONTAINER_PORT}/health', timeout=5).status == 200 "
        "else 1)"
    )
    text = environment().get_template("compose.yml.j2").render(
        plan=plan,
        gpu=gpu,
        script=script,
        env=_env_items(plan),
        device_ids=[str(i) for i in range(plan.gpus)],
        health=health,
        bundle=BUNDLE_MOUNT,
        models=MODELS_MOUNT,
        kernel_cache=KERNEL_CACHE,
        container_port=CONTAINER_PORT,
        memory=plan.delivery == "memory",
        tmpfs=_memory_paths(),
    )
    validate_compose_text(text, plan.slug, gpu=gpu)
    return text


def _memory_paths() -> tuple[str, ...]:
    from .memory import MEMORY_WRITABLE_PATHS

    return MEMORY_WRITABLE_PATHS


# What a generated file may contain: anything else means the template (or an injection) went wrong.
_TOP_KEYS = {"services", "volumes"}
_SERVICE_KEYS = {
    "image", "entrypoint", "command", "environment", "ports", "volumes", "init", "restart",
    "healthcheck", "ipc", "shm_size", "deploy", "labels", "stop_grace_period", "read_only", "tmpfs",
}


def validate_compose_text(text: str, slug: str, gpu: bool = True) -> dict:
    """Parse rendered YAML and check its structure: only the expected keys, one service, no host privileges."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ComposeError(f"{slug}: rendered compose is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict) or set(data) - _TOP_KEYS:
        raise ComposeError(f"{slug}: rendered compose has unexpected top-level keys "
                           f"{sorted(set(data or {}) - _TOP_KEYS)}")
    services = data.get("services")
    if not isinstance(services, dict) or list(services) != [slug]:
        raise ComposeError(f"{slug}: rendered compose must hold exactly the service {slug!r}, "
                           f"got {list(services or {})}")
    svc = services[slug]
    extra = set(svc) - _SERVICE_KEYS
    if extra:
        raise ComposeError(f"{slug}: rendered service has unexpected keys {sorted(extra)}")
    if ("deploy" in svc) != gpu:
        raise ComposeError(f"{slug}: GPU reservation {'missing' if gpu else 'present'} (gpu={gpu})")
    for vol in svc.get("volumes", []):
        src = str(vol).split(":", 1)[0]
        if src.startswith("/"):
            raise ComposeError(f"{slug}: volume {vol!r} binds an absolute host path; use an overridable variable")
    return data
