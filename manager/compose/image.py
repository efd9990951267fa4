"""`overlay image`: build an engine image from a recipe of the catalog (compose/images/<name>/).

A recipe directory holds a Dockerfile on a plain Python base (`ARG BASE`), its `requirements.txt`
(the audited wheel pins), `entrypoint.sh` (the three steps of the rendered entrypoint: apply,
build kernels, exec vllm serve) and `recipe.yaml` (tag, vLLM version, the default entrypoint's
overlays). Building assembles a context directory:

    Dockerfile requirements.txt entrypoint.sh   from the recipe
    overlay-bundle/                             `overlay bundle` for the base image's python, with the
                                                prepared plans of the deployments and of the recipe's
                                                default overlays on its vLLM version
    requirements.lock                           only with a wheel dir: every wheel, `==` + sha256

and builds it with the Docker SDK (the `[verify]` extra), never pulling. With a wheel dir the
~4.9 GB of wheels are downloaded once (`pip download` for the base's python and glibc, hashes
checked by pip against the index) into `<dir>/<python>-<platform>-<key>/`, and the build installs
them offline: the directory is served read-only on 127.0.0.1 for the build's `pip install
--no-index --require-hashes` (host network), so no wheel enters a layer. Without one the build's
pip downloads the pins from PyPI. An image whose `io.overlay-manager.context` label equals the
context's digest is not rebuilt.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator

from ..catalog import Catalog
from ..dockerclient import docker_client
from ..errors import ComposeError, ManagerError
from .recipe import Recipe
from .wheels import LOCK, WheelServer, WheelSet, sha256_file, wheel_set

RECIPE_FILES = ("Dockerfile", "requirements.txt", "entrypoint.sh")
CONTEXT_LABEL = "io.overlay-manager.context"
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class BaseInfo:
    image: str
    python: str    # X.Y
    glibc: str
    machine: str

    @property
    def wheel_platform(self) -> str:
        """The newest manylinux tag the base's glibc runs (pip adds the older ones: platform_tags)."""
        major, minor = (int(x) for x in self.glibc.split(".")[:2])
        return f"manylinux_{major}_{minor}_{self.machine}"

    @property
    def bundle_platform(self) -> str:
        from .verify import platform_for_glibc

        return platform_for_glibc(self.glibc, self.machine)


@dataclass(frozen=True)
class ImageContext:
    path: Path
    python: str
    digest: str
    plans: tuple[str, ...]
    bundle_bytes: int


@dataclass(frozen=True)
class ImageBuild:
    tag: str
    base: str
    python: str
    size_bytes: int
    seconds: float
    cached: bool                 # the tag already held this context: nothing was built
    wheels: WheelSet | None
    context: ImageContext

    def as_dict(self) -> dict[str, object]:
        w = self.wheels
        return {
            "tag": self.tag, "base": self.base, "python": self.python, "size_bytes": self.size_bytes,
            "seconds": round(self.seconds, 1), "cached": self.cached, "context_digest": self.context.digest,
            "plans": list(self.context.plans),
            "wheels": None if w is None else {"path": str(w.path), "count": w.count, "size_bytes": w.size_bytes,
                                               "cached": w.cached},
        }


# ----------------------------------------------------------------------------- recipe


def load_recipe(catalog: Catalog, name: str) -> Recipe:
    from .. import safeyaml

    if not _NAME_RE.match(name):
        raise ComposeError(f"image recipe {name!r}: expected a lower-case name like vllm-v100")
    root = catalog.images_dir
    path = root / name
    if not (path / "recipe.yaml").is_file():
        known = sorted(p.name for p in root.glob("*") if (p / "recipe.yaml").is_file()) if root.is_dir() else []
        raise ComposeError(f"no image recipe {name!r} in {root} (known: {', '.join(known) or 'none'})")
    for f in RECIPE_FILES:
        if not (path / f).is_file():
            raise ComposeError(f"{path / f}: missing from the recipe")
    meta = safeyaml.load((path / "recipe.yaml").read_text())
    if not isinstance(meta, dict):
        raise ComposeError(f"{path / 'recipe.yaml'}: expected a mapping")
    unknown = set(meta) - {"tag", "vllm_version", "apply", "build"}
    if unknown:
        raise ComposeError(f"{path / 'recipe.yaml'}: unknown key {sorted(unknown)[0]!r}")
    for key in ("tag", "vllm_version"):
        if not isinstance(meta.get(key), str) or not meta[key]:
            raise ComposeError(f"{path / 'recipe.yaml'}: {key}: expected a string")
    ids: dict[str, tuple[str, ...]] = {}
    for key in ("apply", "build"):
        val = meta.get(key) or []
        if not isinstance(val, list) or not all(isinstance(i, str) and _ID_RE.match(i) for i in val):
            raise ComposeError(f"{path / 'recipe.yaml'}: {key}: expected a list of overlay ids")
        ids[key] = tuple(val)
    reqs = tuple(ln.strip() for ln in (path / "requirements.txt").read_text().splitlines()
                 if ln.strip() and not ln.lstrip().startswith("#"))
    return Recipe(name, path, meta["tag"], meta["vllm_version"], ids["apply"], ids["build"], reqs)


# ----------------------------------------------------------------------------- context


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file() and not p.is_symlink():
            rel = p.relative_to(path).as_posix()
            if "__pycache__" in rel:  # bytecode follows the sources (and embeds their mtimes)
                continue
            h.update(rel.encode() + b"\0" + format(p.stat().st_mode & 0o777, "o").encode() + b"\0")
            h.update(sha256_file(p).encode() + b"\n")
    return h.hexdigest()


def check_recipe_ids(recipe: Recipe, catalog: Catalog) -> None:
    """recipe.yaml's apply/build ids: in the catalog, and the build ids are kernel overlays."""
    from ..overlays import load_overlays

    known = {o.id: o for o in load_overlays(catalog)}
    for oid in (*recipe.apply, *recipe.build):
        if oid not in known:
            raise ComposeError(f"{recipe.path / 'recipe.yaml'}: overlay {oid!r} is not in the catalog")
    for oid in recipe.build:
        if known[oid].manifest.kernels is None:
            raise ComposeError(f"{recipe.path / 'recipe.yaml'}: build: {oid!r} has no kernels: section")


def _recipe_key(recipe: Recipe) -> bytes:
    """The plan key of the recipe's bundles: one per recipe, kept in the cache (`plan-keys/`), so a
    context assembled again is byte-identical (its digest decides whether the image is rebuilt).
    Whoever holds the image holds this key (manager/overlays/plankey.py)."""
    from ..overlays.plankey import PlanKeyError, kept_key
    from ..releases import cache_dir

    try:
        return kept_key(cache_dir() / "plan-keys" / f"image-{recipe.name}").secret
    except (PlanKeyError, OSError) as exc:
        raise ComposeError(f"the plan key of recipe {recipe.name}: {exc}") from None


def _recipe_plans(recipe: Recipe, catalog: Catalog, dest: Path) -> str:
    """The prepared plan of the default entrypoint's `overlay apply` on the recipe's vLLM version;
    refuses ids that do not apply there."""
    from ..overlays import load_overlays
    from ..overlays.prepare import prepare
    from .bundle import bundle_plan_key

    if not recipe.apply:
        return f"{recipe.name}: vllm {recipe.vllm_version}: no default overlays"
    try:
        (made,) = prepare(load_overlays(catalog), [recipe.vllm_version], list(recipe.apply), dest,
                          key=bundle_plan_key(dest.parent))
    except ManagerError as exc:
        raise ComposeError(f"{recipe.path / 'recipe.yaml'}: apply {' '.join(recipe.apply)} on vllm "
                           f"{recipe.vllm_version}: {exc}") from None
    bad = [f"{i} {s}" for i, s in made.statuses if i in recipe.apply and s not in ("applied", "pending")]
    if bad:
        raise ComposeError(f"{recipe.path / 'recipe.yaml'}: on vllm {recipe.vllm_version}: {', '.join(bad)}")
    return (f"{recipe.name} default entrypoint: vllm {recipe.vllm_version} {' '.join(recipe.apply)}: "
            f"plan {Path(made.path).name}")


def write_context(recipe: Recipe, catalog: Catalog, out: Path, python: str, platform: str = "manylinux_2_28_x86_64",
                  lock: Path | None = None) -> ImageContext:
    """The build context in `out` (created; must be new or empty)."""
    from .bundle import build_bundle

    from .bundle import _check_python

    python = _check_python(python)
    check_recipe_ids(recipe, catalog)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ComposeError(f"-o {out}: exists and is not an empty directory")
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ComposeError(f"-o {out}: cannot create the directory: {exc.strerror}") from None
    try:
        for f in RECIPE_FILES:
            shutil.copy2(recipe.path / f, out / f)
        if lock is not None:
            shutil.copy2(lock, out / LOCK)
        bundle = build_bundle(out / "overlay-bundle", python, platform, catalog, plan_key=_recipe_key(recipe))
        lines = (*bundle.plans, _recipe_plans(recipe, catalog, out / "overlay-bundle" / "plans"))
    except BaseException:
        if created:
            shutil.rmtree(out, ignore_errors=True)
        else:  # the empty directory given stays, emptied again
            for child in out.iterdir():
                shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink()
        raise
    return ImageContext(out, python, _digest(out), lines, bundle.size_bytes)


# ----------------------------------------------------------------------------- build


def _client() -> Any:
    return docker_client("overlay image build", ComposeError, timeout=3600)


def _local_image(client: Any, image: str) -> Any:
    from docker.errors import ImageNotFound

    try:
        return client.images.get(image)
    except ImageNotFound:
        return None


def probe_base(client: Any, base: str) -> BaseInfo:
    """The base image's python3 (X.Y), glibc and machine, read by running it (no network)."""
    if _local_image(client, base) is None:
        raise ComposeError(f"base image {base!r} is not present locally; `docker pull {base}` first")
    code = ("import os, platform, sys; print('%d.%d' % sys.version_info[:2], "
            "os.confstr('CS_GNU_LIBC_VERSION').split()[-1], platform.machine())")
    try:
        out = client.containers.run(base, ["python3", "-c", code], entrypoint=[], network_mode="none", remove=True)
    except Exception as exc:  # noqa: BLE001 - ContainerError, APIError: one line either way
        raise ComposeError(f"base image {base!r}: `python3` did not run: {str(exc).splitlines()[0]}") from None
    parts = out.decode(errors="replace").split()
    if len(parts) != 3 or not re.fullmatch(r"3\.\d{1,2}", parts[0]) or not re.fullmatch(r"2\.\d+", parts[1]):
        raise ComposeError(f"base image {base!r}: unexpected python3 probe output {out[:200]!r}")
    return BaseInfo(base, parts[0], parts[1], parts[2])


def _stream(start: Callable[[], Iterator[dict]], on_log: Callable[[str], None] | None) -> None:
    from docker.errors import DockerException

    try:
        _follow(start(), on_log)
    except DockerException as exc:  # the engine refused the build (API error, lost connection)
        raise ComposeError(f"docker build failed: {str(exc).splitlines()[0]}") from None


def _follow(chunks: Iterator[dict], on_log: Callable[[str], None] | None) -> None:
    tail: list[str] = []
    for chunk in chunks:
        if "error" in chunk:
            detail = " | ".join(ln.strip() for ln in tail[-3:] if ln.strip())
            raise ComposeError(f"docker build failed: {str(chunk['error']).strip()}"
                               + (f" (after: {detail})" if detail else ""))
        line = chunk.get("stream")
        if line:
            tail = (tail + line.splitlines())[-20:]
            if on_log is not None:
                for ln in line.splitlines():
                    if ln.strip():
                        on_log(ln)


def build_image(name: str, catalog: Catalog, base: str | None = None, tag: str | None = None,
                wheels: Path | None = None, on_log: Callable[[str], None] | None = None) -> ImageBuild:
    """Build recipe `name` FROM `base` (default the Dockerfile's) as `tag` (default the recipe's)."""
    recipe = load_recipe(catalog, name)
    base = base or _dockerfile_base(recipe)
    tag = tag or recipe.tag
    client = _client()
    info = probe_base(client, base)
    base_id = _local_image(client, base).id
    wset = wheel_set(recipe, info.python, info.wheel_platform, wheels) if wheels is not None else None
    with tempfile.TemporaryDirectory(prefix=f"overlay-image-{name}-") as tmp:
        ctx = write_context(recipe, catalog, Path(tmp) / "context", info.python, info.bundle_platform,
                            wset.lock if wset else None)
        digest = hashlib.sha256(f"{ctx.digest}\n{base_id}\n{bool(wset)}".encode()).hexdigest()
        ctx = ImageContext(ctx.path, ctx.python, digest, ctx.plans, ctx.bundle_bytes)
        have = _local_image(client, tag)
        if have is not None and (have.labels or {}).get(CONTEXT_LABEL) == digest:
            return ImageBuild(tag, base, info.python, int(have.attrs.get("Size") or 0), 0.0, True, wset, ctx)
        args = {"BASE": base, "OVERLAY_APPLY": " ".join(recipe.apply), "OVERLAY_BUILD": " ".join(recipe.build)}
        start = time.monotonic()
        kw: dict[str, Any] = dict(path=str(ctx.path), tag=tag, rm=True, forcerm=True, pull=False, decode=True,
                                  labels={CONTEXT_LABEL: digest})
        if wset is None:
            _stream(lambda: client.api.build(buildargs=args, **kw), on_log)
        else:
            with WheelServer(wset.path, sha256_file(wset.lock)) as srv:
                args["PIP_INSTALL_ARGS"] = (f"--no-index --find-links http://127.0.0.1:{srv.port}/ "
                                            f"--trusted-host 127.0.0.1 --require-hashes -r /opt/{recipe.name}/{LOCK}")
                _stream(lambda: client.api.build(buildargs=args, network_mode="host", **kw), on_log)
        seconds = time.monotonic() - start
    img = _local_image(client, tag)
    if img is None:
        raise ComposeError(f"docker build reported success but {tag!r} is not present")
    return ImageBuild(tag, base, info.python, int(img.attrs.get("Size") or 0), seconds, False, wset, ctx)


def _dockerfile_base(recipe: Recipe) -> str:
    m = re.search(r"(?m)^ARG BASE=(\S+)\s*$", (recipe.path / "Dockerfile").read_text())
    if not m:
        raise ComposeError(f"{recipe.path / 'Dockerfile'}: no `ARG BASE=<image>` line; pass --base")
    return m.group(1)

