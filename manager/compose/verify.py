"""`overlay verify --image`: what an image holds, checked from inside it before deploying.

Runs the image with the Python docker SDK (network off, no GPU), the bundle mounted
read-only at /opt/overlay, and reports the image's Python/glibc, the vLLM and
transformers versions it finds (package metadata, no import) and `overlay status --json`
as the bundled tool sees it inside. The check to run when bumping an engine pin.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..catalog import Catalog
from ..dockerclient import docker_client
from ..errors import ComposeError
from .render import BUNDLE_MOUNT

MARK = "--- overlay-status ---"
FAILING = ("drift", "partial", "modified", "missing-target", "error")

PROBE_PY = r"""
import json, os, platform, sys
from importlib import metadata
def v(name):
    try:
        return metadata.version(name)
    except Exception:
        return None
try:
    glibc = os.confstr("CS_GNU_LIBC_VERSION").split()[-1]
except Exception:
    glibc = None
print(json.dumps({"python": "%d.%d.%d" % sys.version_info[:3], "glibc": glibc, "machine": platform.machine(),
                  "vllm": v("vllm"), "transformers": v("transformers"), "torch": v("torch")}))
"""


def probe_script(with_status: bool) -> str:
    lines = ["python3 - <<'PY'", PROBE_PY.strip(), "PY"]
    if with_status:
        lines += [f"echo '{MARK}'", f"exec {BUNDLE_MOUNT}/bin/overlay status --json"]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class VerifyReport:
    image: str
    python: str | None
    glibc: str | None
    vllm: str | None
    transformers: str | None
    torch: str | None
    overlays: dict[str, str] = field(default_factory=dict)
    status: Any = None
    exit_code: int = 0
    error: str = ""

    @property
    def failing(self) -> dict[str, str]:
        """Overlays whose status means the image cannot take them as they are (drift, partial, ...)."""
        return {k: v for k, v in self.overlays.items() if v in FAILING}

    def as_dict(self) -> dict[str, object]:
        return {
            "image": self.image, "python": self.python, "glibc": self.glibc, "vllm": self.vllm,
            "transformers": self.transformers, "torch": self.torch, "overlays": self.overlays,
            "failing": self.failing, "status": self.status, "exit_code": self.exit_code, "error": self.error,
        }


def _client() -> Any:
    return docker_client("overlay verify", ComposeError)


def _run(client: Any, image: str, script: str, bundle: Path | None, timeout: int) -> tuple[int, str, str]:
    from docker.errors import ImageNotFound

    try:
        client.images.get(image)
    except ImageNotFound:
        raise ComposeError(f"image {image!r} is not present locally; `docker pull {image}` first") from None
    volumes = {str(bundle): {"bind": BUNDLE_MOUNT, "mode": "ro"}} if bundle else {}
    container = client.containers.run(
        image, entrypoint=["/bin/sh", "-c", script], network_mode="none", volumes=volumes,
        environment={"HF_HUB_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1"}, detach=True,
    )
    try:
        try:
            rc = int(container.wait(timeout=timeout)["StatusCode"])
        except Exception as exc:  # noqa: BLE001 - timeouts come as requests exceptions
            raise ComposeError(f"image {image!r}: the check did not finish in {timeout}s "
                               f"({type(exc).__name__})") from None
        stdout = container.logs(stdout=True, stderr=False).decode(errors="replace")
        stderr = container.logs(stdout=False, stderr=True).decode(errors="replace")
    finally:
        container.remove(force=True)
    return rc, stdout, stderr


def _summarise(status: Any) -> dict[str, str]:
    if isinstance(status, dict) and isinstance(status.get("overlays"), list):
        return {str(o.get("id")): str(o.get("status")) for o in status["overlays"] if isinstance(o, dict)}
    return {}


def platform_for_glibc(glibc: str | None, machine: str = "x86_64") -> str:
    try:
        major, minor = (int(x) for x in (glibc or "").split(".")[:2])
    except ValueError:
        raise ComposeError(f"cannot read the image's glibc version ({glibc!r}); pass --bundle") from None
    if major != 2 or minor < 17:
        raise ComposeError(f"the image's glibc {glibc} is older than manylinux_2_17; no wheels for it")
    return f"manylinux_{2}_{28 if minor >= 28 else 17}_{machine}"


def verify_image(image: str, catalog: Catalog, bundle: Path | None = None, timeout: int = 300) -> VerifyReport:
    client = _client()
    if bundle is None:
        rc, out, err = _run(client, image, probe_script(False), None, timeout)
        if rc != 0:
            raise ComposeError(f"image {image!r}: python3 probe failed (exit {rc}): "
                               f"{(err or out).strip().splitlines()[-1:]}")
        info = json.loads(out.strip().splitlines()[-1])
        from .bundle import build_bundle
        from ..releases import cache_dir

        py = ".".join(info["python"].split(".")[:2])
        plat = platform_for_glibc(info.get("glibc"), info.get("machine") or "x86_64")
        bundle = build_bundle(cache_dir() / "bundles" / f"py{py}-{plat}", py, plat, catalog).path
    else:
        bundle = Path(bundle).resolve()
        if not (bundle / "bin" / "overlay").is_file():
            raise ComposeError(f"{bundle}: not an overlay bundle (no bin/overlay); build one with `overlay bundle`")
    rc, out, err = _run(client, image, probe_script(True), bundle, timeout)
    head, _, tail = out.partition(MARK)
    try:
        info = json.loads(head.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise ComposeError(f"image {image!r}: python3 probe printed no JSON: {(err or out).strip()[-200:]}") from None
    status: Any = None
    error = ""
    try:
        status = json.loads(tail) if tail.strip() else None
    except ValueError:
        status = None
    if status is None:
        error = (err.strip().splitlines() or [f"exit {rc}"])[-1] or "overlay status printed no JSON"
    return VerifyReport(
        image=image, python=info.get("python"), glibc=info.get("glibc"), vllm=info.get("vllm"),
        transformers=info.get("transformers"), torch=info.get("torch"), overlays=_summarise(status),
        status=status, exit_code=rc, error=error,
    )
