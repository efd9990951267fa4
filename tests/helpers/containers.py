"""Docker test infrastructure for the compose tests (and benchmarks/compose.py).

- `docker_client()`: a docker SDK client, or pytest.skip when no engine answers
  (pytest.fail instead when OVERLAY_REQUIRE_DOCKER=1, as CI sets it).
- `base_image()`: Debian bookworm minbase + python3 built with debootstrap and
  `docker import` (no registry needed), cached by tag.
- `engine_runtime_image()`: the same + the system libraries vLLM's CPU build needs, for the
  real-engine compose test (the engine's Python packages are mounted, not baked).
- `vllm_image(version)`: the base + the real `vllm` package sources of a PyPI
  release in site-packages + a stand-in `vllm` executable (below) + a real
  transformers wheel's files, cached by a tag derived from its inputs.
- `drift_image(version)`: the same with the `moe.gate_up_proj` anchor line of
  gemma4.py altered, so the PR #40886 overlay cannot apply (a drift fixture).
- `bundle_dir()`: an overlay bundle for the image's python (3.11), built once per run.
- `venv_base_image()`: the base + python3-venv (ensurepip), the base the vllm-v100 recipe is built
  from in CI (its Dockerfile makes a venv); `v100_image()`: that build, once per run, from the
  cached wheels (`overlay image build vllm-v100 --base <it> --wheels <cache>`).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import pytest

from manager import releases

REQUIRE_ENV = "OVERLAY_REQUIRE_DOCKER"
BASE_TAG = "overlay-manager-test/bookworm-python3:1"
ENGINE_RUNTIME_REPO = "overlay-manager-test/vllm-cpu-runtime"
ENGINE_RUNTIME_PACKAGES = ("python3", "libnuma1", "g++", "libpython3.11-dev", "openssl")
VENV_BASE_REPO = "overlay-manager-test/bookworm-python3-venv"
VENV_BASE_PACKAGES = ("python3", "python3-venv")
IMAGE_REPO = "overlay-manager-test/vllm-standin"
SITE = "/usr/local/lib/python3.11/dist-packages"
IMAGE_PYTHON = "3.11"
IMAGE_PLATFORM = "manylinux_2_28_x86_64"
TRANSFORMERS_VERSION = "5.5.0"
ANCHOR = 'if "moe.gate_up_proj" in name and weight.dim() == 3:'
DRIFTED = 'if "moe.gate_up_proj" in name and weight.ndim == 3:  # drifted for the test'

# The stand-in `vllm` executable: `vllm serve MODEL [args]` answers /health and reports
# the overlay sentinels (`# overlay:<id> v<N>`) it finds in the installed vllm package.
STANDIN = r'''#!/usr/bin/env python3
"""Stand-in for vLLM's `vllm` command in the overlay-manager test image."""
import http.server, importlib.util, json, os, re, sys

SENTINEL = re.compile(r"#\s*overlay:([A-Za-z0-9._-]+)\s+v(\d+)")


def sentinels():
    spec = importlib.util.find_spec("vllm")  # locates the package without importing it
    root = os.path.dirname(spec.origin)
    found = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            with open(path, encoding="utf-8", errors="replace") as fh:
                for m in SENTINEL.finditer(fh.read()):
                    found.setdefault(m.group(1), {"version": int(m.group(2)), "files": []})
                    rel = os.path.relpath(path, os.path.dirname(root))
                    if rel not in found[m.group(1)]["files"]:
                        found[m.group(1)]["files"].append(rel)
    return root, found


def main(argv):
    if len(argv) < 2 or argv[1] != "serve":
        print("stand-in vllm: only `vllm serve` is implemented", file=sys.stderr)
        return 2
    args = argv[2:]
    port = int(args[args.index("--port") + 1]) if "--port" in args else 8000
    root, found = sentinels()
    state = {"argv": args, "package": root, "sentinels": found, "pid": os.getpid()}
    print("stand-in vllm serving on port %d; overlay sentinels: %s" % (port, sorted(found)), flush=True)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/health":
                body, code = b"", 200
            elif self.path == "/overlays":
                body, code = json.dumps(state).encode(), 200
            else:
                body, code = b"not found", 404
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler).serve_forever()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
'''


# ----------------------------------------------------------------------------- engine


def _fail_or_skip(reason: str):
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {reason}")
    pytest.skip(reason)


def engine_client():
    """A docker SDK client when an engine answers, else None (no pytest involvement)."""
    try:
        import docker

        client = docker.from_env(timeout=120)
        client.ping()
        return client
    except Exception:  # noqa: BLE001
        return None


def docker_client():
    client = engine_client()
    if client is None:
        _fail_or_skip("no Docker engine answers (start dockerd; see docs/compose.md)")
    return client


def need_tools(*names: str) -> None:
    for name in names:
        if shutil.which(name) is None:
            _fail_or_skip(f"{name} is not installed")


# ----------------------------------------------------------------------------- images


def _has_image(client, tag: str) -> bool:
    from docker.errors import ImageNotFound

    try:
        client.images.get(tag)
        return True
    except ImageNotFound:
        return False


def debian_mirror() -> str:
    """The Debian mirror apt already uses on this machine."""
    candidates = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in candidates:
        try:
            text = path.read_text()
        except OSError:
            continue
        for m in re.finditer(r"(?m)^\s*(?:URIs:\s*|deb\s+(?:\[[^\]]*\]\s+)?)(https?://\S+)", text):
            if "security" not in m.group(1):
                return m.group(1)
    return "http://deb.debian.org/debian"


def _lock(name: str):
    from filelock import FileLock

    return FileLock(str(releases.cache_dir() / f"{name}.lock"))


def debootstrap_image(client, tag: str, packages: tuple[str, ...]) -> str:
    """Debian bookworm minbase + `packages`, via debootstrap + docker import (cached by tag)."""
    if _has_image(client, tag):
        return tag
    need_tools("debootstrap")
    with _lock("test-base-image-" + re.sub(r"[^A-Za-z0-9.-]", "-", tag)):
        if _has_image(client, tag):
            return tag
        with tempfile.TemporaryDirectory(prefix="om-debootstrap-") as tmp:
            root = Path(tmp) / "root"
            proc = subprocess.run(
                ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", "bookworm", str(root),
                 debian_mirror()],
                capture_output=True, text=True,
            )
            if proc.returncode != 0:
                pytest.fail(f"debootstrap failed: {proc.stderr.strip().splitlines()[-3:]}")
            shutil.rmtree(root / "var" / "cache" / "apt" / "archives", ignore_errors=True)
            tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
            imp = subprocess.run(["docker", "import", "-", tag], stdin=tar.stdout, capture_output=True, text=True)
            tar.wait()
            if imp.returncode != 0 or tar.returncode != 0:
                pytest.fail(f"docker import failed: {imp.stderr.strip()}")
    return tag


def base_image(client) -> str:
    """Debian bookworm minbase + python3 (cached by tag)."""
    return debootstrap_image(client, BASE_TAG, ("python3",))


def engine_runtime_image(client) -> str:
    """bookworm + python3 + what vLLM's CPU build needs from the system, for a mounted engine environment.

    Found by running the cached vllm-cpu venv in the plain base image: `libnuma.so.1` (vllm._C_AVX2 links it),
    a C++ compiler and Python's headers (the CPU worker's warm-up compiles the sampler with torch inductor:
    "InvalidCxxCompiler: No working C++ compiler found ... 'g++'") and `openssl` (inductor's codecache runs
    `openssl sha512`). vLLM's own docker/Dockerfile.cpu (0.20.0 sdist) installs gcc-12/g++-12 and libnuma too.
    The engine's ~6 GB of Python packages are not in the image: tests mount the cached venv read-only.
    """
    tag = f"{ENGINE_RUNTIME_REPO}:{hashlib.sha256(' '.join(ENGINE_RUNTIME_PACKAGES).encode()).hexdigest()[:10]}"
    return debootstrap_image(client, tag, ENGINE_RUNTIME_PACKAGES)


def venv_base_image(client) -> str:
    """bookworm + python3 + python3-venv: Debian splits ensurepip out of python3, and the
    vllm-v100 recipe installs the engine into a venv (the python:3.12-slim base has it built in)."""
    tag = f"{VENV_BASE_REPO}:{hashlib.sha256(' '.join(VENV_BASE_PACKAGES).encode()).hexdigest()[:10]}"
    return debootstrap_image(client, tag, VENV_BASE_PACKAGES)


_V100 = None


def v100_image(client, catalog):
    """The vllm-v100 recipe built from venv_base_image with the cached wheels, once per process; an
    image whose context label matches is reused (manager.compose.image), so later runs build nothing.
    Returns manager.compose.image.ImageBuild."""
    global _V100
    if _V100 is None:
        from manager.compose.image import build_image, load_recipe
        from manager.compose.wheels import default_wheel_root

        base = venv_base_image(client)
        with _lock("test-v100-image"):
            _V100 = build_image("vllm-v100", catalog, base=base,
                                wheels=default_wheel_root(load_recipe(catalog, "vllm-v100")))
    return _V100


def _transformers_files() -> Path:
    """The files of a real transformers wheel (pure Python) for the image's site-packages, cached."""
    dest = releases.cache_dir() / "test-transformers" / TRANSFORMERS_VERSION
    if (dest / ".complete").exists():
        return dest
    with _lock("test-transformers"):
        if (dest / ".complete").exists():
            return dest
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                 f"transformers=={TRANSFORMERS_VERSION}", "-d", tmp], check=True, capture_output=True,
            )
            wheel = next(Path(tmp).glob("transformers-*.whl"))
            shutil.rmtree(dest, ignore_errors=True)
            with zipfile.ZipFile(wheel) as zf:
                # only the dist-info: the image needs transformers' metadata, not its 10 MB of code
                zf.extractall(dest, members=[n for n in zf.namelist() if ".dist-info/" in n])
        (dest / ".complete").write_text("ok\n")
    return dest


def _add_tree(tar: tarfile.TarFile, src: Path, arcname: str) -> None:
    tar.add(str(src), arcname=arcname, filter=lambda ti: None if "__pycache__" in ti.name else ti)


def _build(client, tag: str, base: str, files: dict[str, Path | bytes]) -> str:
    """Build `tag` FROM `base` copying `files` (arcname -> path or bytes) into the image root."""
    dockerfile = f"FROM {base}\nCOPY rootfs/ /\nRUN chmod 0755 /usr/local/bin/vllm && mkdir -p /models\n"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for arc, src in {"Dockerfile": dockerfile.encode(), **files}.items():
            if isinstance(src, bytes):
                info = tarfile.TarInfo(arc)
                info.size = len(src)
                info.mode = 0o755
                tar.addfile(info, io.BytesIO(src))
            else:
                _add_tree(tar, src, arc)
    buf.seek(0)
    client.images.build(fileobj=buf, custom_context=True, tag=tag, rm=True, network_mode="none", pull=False)
    return tag


def _tag(kind: str, version: str, *parts: bytes) -> str:
    h = hashlib.sha256(b"\0".join([STANDIN.encode(), *parts])).hexdigest()[:10]
    return f"{IMAGE_REPO}:{kind}-{version}-{h}"


def vllm_image(client, version: str = "0.20.0") -> str:
    """Base + real vllm sources of `version` + a transformers dist-info + the stand-in `vllm` (cached)."""
    tag = _tag("pristine", version, TRANSFORMERS_VERSION.encode())
    if _has_image(client, tag):
        return tag
    base = base_image(client)
    tree = releases.pristine_tree(version)
    tf = _transformers_files()
    files: dict[str, Path | bytes] = {"rootfs/usr/local/bin/vllm": STANDIN.encode()}
    for child in tree.iterdir():
        if not child.name.startswith("."):
            files[f"rootfs{SITE}/{child.name}"] = child
    for child in tf.iterdir():
        if not child.name.startswith("."):
            files[f"rootfs{SITE}/{child.name}"] = child
    with _lock("test-vllm-image"):
        if not _has_image(client, tag):
            _build(client, tag, base, files)
    return tag


def drift_image(client, version: str = "0.20.0") -> str:
    """vllm_image with gemma4.py's `moe.gate_up_proj` anchor line altered (PR #40886's overlay drifts)."""
    tag = _tag("drift", version, TRANSFORMERS_VERSION.encode(), DRIFTED.encode())
    if _has_image(client, tag):
        return tag
    parent = vllm_image(client, version)
    rel = "vllm/model_executor/models/gemma4.py"
    text = (releases.pristine_tree(version) / rel).read_text()
    assert text.count(ANCHOR) == 1, f"{rel} of {version}: anchor not found once"
    files: dict[str, Path | bytes] = {
        f"rootfs{SITE}/{rel}": text.replace(ANCHOR, DRIFTED).encode(),
        "rootfs/usr/local/bin/vllm": STANDIN.encode(),
    }
    with _lock("test-vllm-image"):
        if not _has_image(client, tag):
            _build(client, tag, parent, files)
    return tag


# ----------------------------------------------------------------------------- bundle

_BUNDLE: Path | None = None


def bundle_dir(catalog) -> Path:
    """An overlay bundle for the test image's python, built once per process (wheels cached)."""
    global _BUNDLE
    if _BUNDLE is None or not (_BUNDLE / "bin" / "overlay").exists():
        from manager.compose.bundle import build_bundle

        out = Path(tempfile.mkdtemp(prefix="om-bundle-")) / "bundle"
        _BUNDLE = build_bundle(out, IMAGE_PYTHON, IMAGE_PLATFORM, catalog).path
    return _BUNDLE


# ----------------------------------------------------------------------------- compose runs


def compose_env(bundle: Path, models: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(MODELS_DIR=str(models), OVERLAY_BUNDLE=str(bundle), HEALTH_INTERVAL="1s", BIND_ADDRESS="127.0.0.1")
    env.update(extra)
    return env


def compose(project: str, file: Path | list[Path], *args: str, env: dict[str, str],
            timeout: int = 180) -> subprocess.CompletedProcess:
    """`docker-compose -p PROJECT -f FILE [-f OVERRIDE ...] ARGS` (a list: later files override earlier ones)."""
    need_tools("docker-compose")
    files = [a for f in (file if isinstance(file, list) else [file]) for a in ("-f", str(f))]
    return subprocess.run(
        ["docker-compose", "-p", project, *files, *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )


def project_container(client, project: str):
    found = client.containers.list(all=True, filters={"label": f"com.docker.compose.project={project}"})
    assert len(found) == 1, f"project {project}: expected one container, found {len(found)}"
    return found[0]


def wait_until(container, predicate, timeout: float, what: str) -> dict:
    import time

    deadline = time.monotonic() + timeout
    while True:
        container.reload()
        state = container.attrs["State"]
        if predicate(state):
            return state
        if state.get("Error"):
            raise AssertionError(f"container failed to start: {state['Error']}")
        if time.monotonic() > deadline:
            logs = container.logs().decode(errors="replace")[-2000:]
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; state={state}; logs:\n{logs}")
        time.sleep(0.2)


def healthy(state: dict) -> bool:
    if state.get("Status") == "exited":
        raise AssertionError(f"container exited with {state.get('ExitCode')} before becoming healthy")
    return (state.get("Health") or {}).get("Status") == "healthy"


def exec_out(container, *cmd: str) -> str:
    rc, out = container.exec_run(list(cmd), demux=False)
    text = out.decode(errors="replace")
    assert rc == 0, f"{cmd} exited {rc}: {text[-1000:]}"
    return text
