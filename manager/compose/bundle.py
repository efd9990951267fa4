"""`overlay bundle`: this tool + its runtime dependencies for an image's Python, plus the catalog.

Layout of a bundle directory (mounted read-only at /opt/overlay in containers):

    bin/overlay      POSIX sh wrapper: PYTHONPATH=<bundle>/site OVERLAY_CATALOG=<bundle>/catalog
                     python3 -c 'from manager.fastpath import main; main()'
    site/            wheels for --python-version/--platform (fetched once by pip, or by uv where only uv is
                     here; then unpacked without pip: uv tool/pipx venvs have none), + `manager`,
                     byte-compiled with that python when one runs here (then the wrapper sets no PYTHONPYCACHEPREFIX)
    catalog/         overlays/, profiles/, compose/
    plans/           prepared plans of `overlay apply IDS` for each deployment's pinned release
                     (manager/overlays/plans.py); the wrapper points $OVERLAY_PLANS at them
    memory/          in-memory delivery (manager/inmemory): sitecustomize.py and the stdlib-only hook as the
                     package `overlay_memory` (never `manager`: the engine's python must not see site/)
    release-files/   <sha256> copies of the upstream files `release-file` edits need (no network in an image)
    plan-key         32 random bytes made for this bundle (manager/overlays/plankey.py): plans/ is signed
                     with it, and the wrapper exports $OVERLAY_PLAN_KEY (default: this file), so a plan
                     recorded into the shared plan cache is signed with it and only plans it signed are used
    BUNDLE.json      what was bundled (python, platform, versions, the plan key's id)

Wheels are downloaded once into `<cache>/bundle-wheels/<python>-<platform>/` and reused offline.
The image's own python3 runs the bundle without network access.

Size: over 400 lines: the site/ installer (pip, or uv where the tool's venv has no pip, then unpacking wheels
without pip) lives here beside the layout it fills; splitting it out is the next step if it grows.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from .. import __version__
from ..catalog import Catalog
from ..errors import ComposeError
from ..overlays.plankey import PlanKey, PlanKeyError, create_key_file, load_key
from ..releases import cache_dir

PLAN_KEY_FILE = "plan-key"

CATALOG_PARTS = ("overlays", "profiles", "compose")
_PLATFORM_RE = re.compile(r"^manylinux_(\d+)_(\d+)_(x86_64|aarch64)$")

WRAPPER = """#!/bin/sh
# overlay-manager bundle wrapper: runs the bundled tool with this image's python3, offline.
here=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd)
PYTHONPATH="$here/site${PYTHONPATH:+:$PYTHONPATH}"
OVERLAY_CATALOG="${OVERLAY_CATALOG:-$here/catalog}"
OVERLAY_RELEASE_FILES="${OVERLAY_RELEASE_FILES:-$here/release-files}"
# prepared plans of the first apply; a first apply without one is recorded into the kernel cache volume
OVERLAY_PLANS="${OVERLAY_PLANS:-$here/plans}"
OVERLAY_PLAN_CACHE="${OVERLAY_PLAN_CACHE:-${OVERLAY_KERNEL_CACHE:+$OVERLAY_KERNEL_CACHE/plans}}"
# the key that signs what is recorded there and must have signed any plan used (this bundle's own)
OVERLAY_PLAN_KEY="${OVERLAY_PLAN_KEY:-$here/plan-key}"
# bytecode: site/ carries its own, compiled for this python when the bundle was built, next to the
# sources; the image's python keeps its stdlib's (a PYTHONPYCACHEPREFIX would make it ignore both).
# A bundle without it (no such python where it was built) is mounted read-only: keep bytecode in a
# writable place then, or wherever $OVERLAY_PYCACHE says.
if [ -n "${OVERLAY_PYCACHE:-}" ] || [ ! -d "$here/site/manager/__pycache__" ]; then
  PYTHONPYCACHEPREFIX="${OVERLAY_PYCACHE:-${TMPDIR:-/tmp}/overlay-pycache}"
  export PYTHONPYCACHEPREFIX
fi
export PYTHONPATH OVERLAY_CATALOG OVERLAY_RELEASE_FILES OVERLAY_PLANS OVERLAY_PLAN_CACHE OVERLAY_PLAN_KEY
# the console script's entry (not `-m manager`: runpy costs ~5 ms of every container start)
""" + ("""exec "${OVERLAY_PYTHON:-python3}" -c 'import sys; from manager.fastpath import main; """
       """sys.argv[0] = "overlay"; main()' "$@"\n""")


@dataclass(frozen=True)
class BundleResult:
    path: Path
    python: str
    platform: str
    packages: dict[str, str]
    size_bytes: int
    wheels_cached: bool
    plans: tuple[str, ...] = ()  # one line per deployment: its release, overlays and plan (or why none)


def platform_tags(platform: str) -> list[str]:
    """pip does not widen `--platform manylinux_2_28_x86_64` to older glibc tags; list them explicitly."""
    m = _PLATFORM_RE.match(platform)
    if not m:
        return [platform]
    major, minor, arch = int(m.group(1)), int(m.group(2)), m.group(3)
    if major != 2 or minor < 5:
        raise ComposeError(f"--platform {platform}: expected manylinux_2_<N>_<arch> with N >= 5")
    tags = [f"manylinux_2_{n}_{arch}" for n in range(minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags += [f"{legacy[n]}_{arch}" for n in sorted(legacy, reverse=True)
             if n <= minor and (arch == "x86_64" or n == 17)]
    return tags


# What `apply`, `status` and `build` import at container start: the core dependencies except
# jinja2 (only `compose render` uses it). The extras stay out: [verify] and [upstream] run on the
# host, and [kernels]' NVRTC 12 comes with the image's CUDA-12 torch (or --nvrtc).
BUNDLE_DISTS = ("click", "rich", "pyyaml", "libcst", "pydantic", "packaging", "filelock")
NOT_BUNDLED = ("jinja2",)


def _dist_name(req: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0].strip().lower().replace("_", "-")


def runtime_requirements() -> list[str]:
    """The requirements the bundle installs: BUNDLE_DISTS with the specifiers of the installed metadata."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        declared = [r for r in (requires("overlay-manager") or []) if "extra ==" not in r]
    except PackageNotFoundError:  # running from a bare checkout: no metadata, take the names as they are
        declared = []
    by_name = {_dist_name(r): r.split(";", 1)[0].strip() for r in declared}
    return [by_name.get(name, name) for name in BUNDLE_DISTS]


def pip_command() -> list[str] | None:
    """A pip to run: this interpreter's (`python -m pip`), else `pip3`/`pip` on PATH, else `python3 -m
    pip` of another interpreter on PATH; None when there is none. `pip download`/`install --target`
    with --python-version/--platform do not depend on which interpreter runs pip, and the venvs of
    `uv tool install` (and pipx's, made without pip) have none of their own."""
    import importlib.util

    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    for name in ("pip3", "pip"):
        exe = shutil.which(name)
        if exe:
            return [exe]
    for name in ("python3", "python"):
        exe = shutil.which(name)
        if exe and os.path.realpath(exe) != os.path.realpath(sys.executable):
            probe = subprocess.run([exe, "-m", "pip", "--version"], capture_output=True, text=True)
            if probe.returncode == 0:
                return [exe, "-m", "pip"]
    return None


NO_INSTALLER = ("fetching the bundle's wheels needs pip or uv and neither is here (this python has no pip, "
                "none is on PATH): install uv (https://docs.astral.sh/uv/) or pip, then run this again")


def _run_installer(argv: list[str], what: str) -> None:
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if not ln.startswith("WARNING")]
        raise ComposeError(f"{what} failed (exit {proc.returncode}): {' | '.join(lines[-3:])}")


def _pip(args: list[str], what: str) -> None:
    pip = pip_command()
    if pip is None:
        raise ComposeError(f"{what}: " + NO_INSTALLER)
    _run_installer([*pip, *args], what)


def uv_platform(platform: str) -> str:
    """uv's --python-platform for a manylinux tag: manylinux_2_28_x86_64 -> x86_64-manylinux_2_28."""
    m = _PLATFORM_RE.match(platform)
    if not m:
        raise ComposeError(f"--platform {platform}: uv takes manylinux_2_<N>_<arch> platforms only")
    return f"{m.group(3)}-manylinux_{m.group(1)}_{m.group(2)}"


def install_wheels(wheels: Path, target: Path) -> list[str]:
    """`pip install --target` of every wheel in `wheels`, without pip: a wheel is a zip whose root
    goes to site-packages as it is and whose `<dist>.data/purelib|platlib` go there too (scripts,
    headers and data are not needed in a bundle). Returns the wheel names."""
    import zipfile

    target.mkdir(parents=True, exist_ok=True)
    names = []
    for whl in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(whl) as zf:
            zf.extractall(target)  # zipfile drops absolute paths and '..' parts
        names.append(whl.name)
    for data in list(target.glob("*.data")):
        for part in ("purelib", "platlib"):
            src = data / part
            if src.is_dir():
                shutil.copytree(src, target, dirs_exist_ok=True)
        shutil.rmtree(data)
    return names


def _check_python(python: str) -> str:
    if not re.fullmatch(r"3\.\d{1,2}", python):
        raise ComposeError(f"--python {python!r}: expected a version like 3.12")
    return python


def _wheel_dir(python: str, platform: str, reqs: list[str]) -> tuple[Path, bool]:
    key = hashlib.sha256("\n".join(sorted(reqs)).encode()).hexdigest()[:12]
    d = cache_dir() / "bundle-wheels" / f"py{python}-{platform}-{key}"
    return d, (d / ".complete").exists()


def wheel_cache(python: str, platform: str, reqs: list[str]) -> tuple[Path, bool]:
    """Download (once) every wheel the requirements need for python/platform; returns (dir, was_cached)."""
    d, complete = _wheel_dir(python, platform, reqs)
    marker = d / ".complete"
    if complete:
        return d, True
    d.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(d) + ".lock"):
        if marker.exists():
            return d, True
        d.mkdir(parents=True, exist_ok=True)
        plat_args = [a for t in platform_tags(platform) for a in ("--platform", t)]
        _pip(
            ["download", "-q", "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
             *plat_args, "-d", str(d), *reqs],
            what=f"pip download of the bundle's wheels for python {python} / {platform}",
        )
        marker.write_text("\n".join(reqs) + "\n")
    return d, False


def _install_site(site: Path, python: str, platform: str, reqs: list[str]) -> bool:
    """The bundle's site/: from the wheel cache (pip fills it once, then no pip is needed), else with
    `uv pip install --target` when only uv is here (uv's cache serves the next build). Returns whether
    the wheels were already cached."""
    _, complete = _wheel_dir(python, platform, reqs)
    if not complete and pip_command() is None:
        uv = shutil.which("uv")
        if uv is None:
            raise ComposeError(NO_INSTALLER)
        _run_installer(
            [uv, "pip", "install", "-q", "--python", sys.executable, "--target", str(site), "--python-version", python,
             "--python-platform", uv_platform(platform), "--only-binary", ":all:", "--no-compile", *reqs],
            what=f"uv pip install --target of the bundle for python {python} / {platform}",
        )
        return False
    wheels, cached = wheel_cache(python, platform, reqs)
    install_wheels(wheels, site)
    return cached


def _copy_package(dest: Path) -> None:
    src = Path(__file__).resolve().parents[1]
    # an installed wheel's manager/_catalog is not copied: the bundle's catalog/ is the one it reads
    shutil.copytree(src, dest / "manager", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "_catalog"))


# The modules the in-memory hook runs (standard library only), as `overlay_memory.<path>` in the bundle's memory/.
MEMORY_MODULES = ("__init__.py", "state.py", "overlays/plankey.py", "overlays/plans.py", "overlays/durable.py",
                  "overlays/targets.py", "inmemory/__init__.py", "inmemory/memplan.py", "inmemory/hook.py",
                  "inmemory/check.py", "inmemory/marker.py")


def write_memory_dir(dest: Path) -> None:
    """memory/: sitecustomize.py and the hook's package `overlay_memory` (manager/compose/memory.py)."""
    from .memory import HOOK_PACKAGE

    src = Path(__file__).resolve().parents[1]
    pkg = dest / HOOK_PACKAGE
    (pkg / "overlays").mkdir(parents=True)
    (pkg / "inmemory").mkdir()
    (pkg / "overlays" / "__init__.py").write_text('"""The overlay modules the in-memory hook needs."""\n')
    for rel in MEMORY_MODULES:
        shutil.copyfile(src / rel, pkg / rel)
    shutil.copyfile(src / "inmemory" / "sitecustomize.py", dest / "sitecustomize.py")


def _copy_catalog(catalog: Catalog, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for part in CATALOG_PARTS:  # a user catalog's compose/, the shipped overlays/ and profiles/ under it
        src = {"overlays": catalog.overlays_dir, "profiles": catalog.profiles_dir}.get(part, catalog.root / part)
        if src.is_dir():
            shutil.copytree(src, dest / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"))


def _copy_release_files(catalog: Catalog, dest: Path) -> list[str]:
    """The upstream files the catalog's `release-file` edits copy, fetched now through
    manager.releases (cached sdists, sha256-verified) and stored by sha256: the image has no network."""
    from ..overlays import load_overlays
    from ..releases import release_file

    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for ov in load_overlays(catalog):
        for e in ov.manifest.edits:
            if e.kind == "release-file" and not (dest / e.sha256).exists():
                (dest / e.sha256).write_bytes(release_file(e.release, e.path, e.sha256))
                out.append(e.sha256)
    return out


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _installed_versions(site: Path) -> dict[str, str]:
    out = {}
    for info in sorted(site.glob("*.dist-info")):
        meta = info / "METADATA"
        if not meta.is_file():
            continue
        name = version = None
        for line in meta.read_text(errors="replace").splitlines():
            if line.startswith("Name:"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("Version:"):
                version = line.split(":", 1)[1].strip()
            if name and version:
                break
        if name and version:
            out[name] = version
    return out


def bundle_plan_key(bundle: Path) -> PlanKey:
    """The plan key of a bundle (its `plan-key`), to sign plans added to its `plans/`."""
    try:
        return load_key(Path(bundle) / PLAN_KEY_FILE)
    except PlanKeyError as exc:
        raise ComposeError(f"bundle {bundle}: {exc}") from None


def write_plans(dest: Path, catalog: Catalog, plan_key: PlanKey | None = None) -> tuple[str, ...]:
    """Prepared plans of each deployment's `overlay apply IDS` on its engine's pinned vLLM release,
    signed with `plan_key` (the bundle's; None: unsigned).

    A deployment whose release cannot be downloaded or whose overlays do not apply gets no
    plan (its first start runs the full engine, as without a bundle); the line says why."""
    from ..compose.plan import plan_all
    from ..compose.registry import load_registry
    from ..errors import ManagerError
    from ..overlays import load_overlays
    from ..overlays.prepare import prepare

    dest.mkdir(parents=True, exist_ok=True)
    registry = load_registry(catalog)
    if not registry.deployments:
        return ()
    every = load_overlays(catalog)
    lines, done = [], {}
    for slug, plan in plan_all(registry, catalog).items():
        key = (plan.vllm_version, tuple(plan.overlays))
        if not plan.overlays or not plan.vllm_version:
            lines.append(f"{slug}: no overlays to apply")
            continue
        if key not in done:
            try:
                (made,) = prepare(every, [plan.vllm_version], list(plan.overlays), dest, key=plan_key)
                done[key] = f"plan {Path(made.path).name}"
            except ManagerError as exc:
                done[key] = f"no plan ({exc})"
        lines.append(f"{slug}: vllm {plan.vllm_version} {' '.join(plan.overlays)}: {done[key]}")
    return tuple(lines)


def _compile_site(site: Path, python: str) -> str | None:
    """Byte-compile `site` for the bundle's python into its normal __pycache__ directories (as
    `pip install` does), with that python: this one when it is that version, else `python<X.Y>` on
    PATH. Returns the cache tag (e.g. cpython-311), or None when no such python runs here: the
    bundle then carries no bytecode and its wrapper keeps it in a writable PYTHONPYCACHEPREFIX."""
    code = ("import compileall, sys\n"
            f"if '%d.%d' % sys.version_info[:2] != {python!r}: sys.exit(2)\n"
            "compileall.compile_dir(sys.argv[1], quiet=2, workers=0)\n"  # a file that does not compile: none
            "print(sys.implementation.cache_tag)\n")
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for exe in ([sys.executable] if here == python else []) + [shutil.which(f"python{python}")]:
        if exe is None:
            continue
        proc = subprocess.run([exe, "-c", code, str(site)], capture_output=True, text=True,
                              env={k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"})
        if proc.returncode == 0 and proc.stdout.strip():
            return proc.stdout.strip()
    for cache in list(site.rglob("__pycache__")):  # nothing half-compiled by a python that failed
        shutil.rmtree(cache, ignore_errors=True)
    return None


def _write_key(path: Path, secret: bytes | None) -> PlanKey:
    if secret is None:
        return create_key_file(path)
    if len(secret) != 32:
        raise ComposeError(f"plan key: {len(secret)} bytes, expected 32")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
    with os.fdopen(fd, "wb") as fh:
        fh.write(secret)
    return load_key(path)


def build_bundle(out: Path, python: str, platform: str, catalog: Catalog, plans: bool = True,
                 plan_key: bytes | None = None) -> BundleResult:
    """Build a bundle directory at `out` (replaced atomically if it is an earlier bundle).

    Its plan key is new (random) unless `plan_key` gives its 32 bytes (`overlay image`: one key per
    recipe, kept in the cache, so that a context built again is byte-identical)."""
    python = _check_python(python)
    out = Path(out).resolve()
    if out.exists() and any(out.iterdir()) and not (out / "BUNDLE.json").is_file():
        raise ComposeError(f"{out}: exists and is not an overlay bundle; refusing to replace it")
    reqs = runtime_requirements()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        cached = _install_site(tmp / "site", python, platform, reqs)
        shutil.rmtree(tmp / "site" / "bin", ignore_errors=True)  # console scripts of the host python: unused
        _copy_package(tmp / "site")
        bytecode = _compile_site(tmp / "site", python)
        write_memory_dir(tmp / "memory")
        _compile_site(tmp / "memory", python)
        _copy_catalog(catalog, tmp / "catalog")
        _copy_release_files(catalog, tmp / "release-files")
        key = _write_key(tmp / PLAN_KEY_FILE, plan_key)
        plan_lines = write_plans(tmp / "plans", Catalog(tmp / "catalog"), key) if plans else ()
        (tmp / "bin").mkdir()
        wrapper = tmp / "bin" / "overlay"
        wrapper.write_text(WRAPPER)
        wrapper.chmod(0o755)
        packages = _installed_versions(tmp / "site")
        meta = {
            "tool": "overlay-manager",
            "version": __version__,
            "python": python,
            "platform": platform,
            "packages": packages,
            "plans": list(plan_lines),
            "bytecode": bytecode,
            "plan_key": {"file": PLAN_KEY_FILE, "key_id": key.key_id},
        }
        (tmp / "BUNDLE.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        for p in [tmp, *tmp.rglob("*")]:
            if p.is_dir():
                p.chmod(0o755)
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return BundleResult(out, python, platform, packages, _dir_size(out), cached, tuple(plan_lines))
