"""Prepare, on a CPU machine, everything the H200 engine run (benchmarks/engine_gpu.py) carries.

    python3 benchmarks/engine_gpu_prepare.py --out DIR [--part-mib 55] [--call-mib 60] [--tp 1|2] [--kinds A,B]

The H200 machine has python3 3.12, torch 2.11.0+cu130, triton and transformers 5.17 but no vLLM,
pydantic or libcst, reaches no network, and takes at most 64 MiB of files per command. This script
builds, under DIR:

1. the vLLM 0.20.0 CUDA wheel from PyPI (`pip download --no-deps`, sha256-checked) unpacked without
   `vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so` (FA2, 191 MB) but with FA3 (model-registry inspection
   imports `vllm.vllm_flash_attn`, which refuses to import with neither), re-packed as one .tar.xz
   and split into parts of at most --part-mib MiB;
2. the dependency wheels the machine lacks (DEPENDENCY_WHEELS: cp312 manylinux/any, `--no-deps`,
   one pinned version each), pydantic/pydantic-core and libcst (manylinux_2_28) for the overlay tool;
3. the compute_70 PTX of the sm70-d512-attention and sm70-w4-gemm kernels (`overlay build`'s library,
   NVRTC 12 from PyPI wheels) as one packed kernel cache;
4. the tiny checkpoints (dense, moe, ct-w4a16-moe with group 32 and 16, each with its dequantized
   reference; dense-h256 and moe-h128, the dense / moe models with 256- / 128-wide sliding layers beside the
   512-wide global ones, for the attention family's engine A/B; ct-nvfp4-moe, ct-nvfp4-dense and ct-w4a16-dense
   for the 4-bit route) from `testing.checkpoints` (`--kinds` stages a subset); with `--tp 2` instead the kinds whose
   shapes tensor parallelism of 2 divides (dense-tp2, moe-tp2, ct-w4a16-moe-tp2: group 32 only, the factory has no
   group-16 TP=2 kind), for `engine_gpu.sh run --tp 2` on two GPUs;
5. the project source this run needs (manager/, overlays/, the two engine_gpu scripts);

then bin-packs all pieces into consecutive device calls of at most --call-mib MiB each (the largest
first), stages them as DIR/call1 … DIR/callN plus DIR/common (manifest.json with every piece's sha256,
and the GPU-side scripts), and prints the command and carry list of every call. Nothing is written
outside DIR and the download cache (<OVERLAY_CACHE>/engine-gpu).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# not benchmarks/ itself: its kernels.py would shadow the `kernels` package transformers probes for (hub kernels)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks"]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MIB = 1 << 20

VLLM_VERSION = "0.20.0"
# https://pypi.org/simple/vllm/ (2026-11-30): the only x86_64 wheel of 0.20.0 and its sha256.
VLLM_WHEEL = "vllm-0.20.0-cp38-abi3-manylinux_2_35_x86_64.whl"
VLLM_WHEEL_SHA256 = "24d28892e210200f6e1bd13f699c42a74cd2bb7364c11248e2348f677c7f6dfb"
FA2 = "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"
FA3 = "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"

# What vLLM 0.20.0 imports at start that the H200 image (device KINDS.md package list, 2026-11-17)
# lacks, with the overlay tool's own needs; versions resolved from PyPI on 2026-11-30 within vLLM's
# Requires-Dist (pydantic-core is pydantic 2.12.5's exact pin). Not carried, since nothing these runs
# start imports them: the heavy GPU extras (flashinfer, tilelang, cutlass-dsl, quack, apache-tvm-ffi).
# xgrammar IS needed (42 MB): `import vllm.entrypoints.llm` failed without it on the H200 (2026-11-30,
# "No module named 'xgrammar'"); 0.1.33 because 0.2.x needs apache-tvm-ffi >= 0.1.11 (vLLM pins 0.1.9).
# openai 2.x and anthropic 0.x: openai >= 3 and anthropic >= 1 import `httpx2`, which the image lacks
# (seen on the H200, 2026-11-30: "ModuleNotFoundError: No module named 'httpx2'" from openai/_types.py).
DEPENDENCY_WHEELS = (
    "annotated-types==0.8.0", "anthropic==0.125.0", "astor==0.8.1",
    "blake3==1.0.11", "cachetools==8.0.2", "cbor2==6.3.0", "compressed-tensors==0.15.0.1",
    "depyf==0.20.0", "dill==0.4.1", "diskcache==5.6.3", "distro==1.9.0", "docker==7.2.0",
    "docstring-parser==0.18.0", "fastapi==0.165.0", "gguf==0.19.0", "ijson==3.6.0",
    "interegular==0.3.3", "jiter==0.19.0", "jmespath==1.1.0",
    "jsonschema==4.26.0", "jsonschema-specifications==2025.9.1", "lark==1.2.2", "libcst==1.9.0",
    "llguidance==1.3.0", "lm-format-enforcer==0.11.3", "loguru==0.7.3", "mistral-common==1.13.1",
    "model-hosting-container-standards==0.1.16", "msgspec==0.23.0", "openai==2.54.0",
    "openai-harmony==0.0.8", "opentelemetry-api==1.45.2", "outlines-core==0.2.14",
    "partial-json-parser==0.2.1.1.post7", "prometheus-fastapi-instrumentator==8.1.0",
    "pybase64==1.5.1", "pycountry==26.2.16", "pydantic==2.12.5", "pydantic-core==2.41.5",
    "pydantic-extra-types==2.11.1", "python-json-logger==4.2.0", "pyzmq==27.3.0", "referencing==0.37.0",
    "rpds-py==2026.9.1", "setproctitle==1.3.8", "sniffio==1.3.1", "starlette==1.10.0",
    "supervisor==4.3.0", "typing-inspection==0.4.5", "watchfiles==1.3.0", "xgrammar==0.1.33",
)
# libcst >= 1.8 ships only manylinux_2_28 wheels for cp312 (pip matches each N exactly).
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64",
             "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux_2_5_x86_64", "manylinux1_x86_64", "any")

# factory kinds (testing/checkpoints.py): ct-w4a16-moe is group 32 (the Marlin MoE path),
# ct-w4a16-moe-g16 takes the non-Marlin path; the ct kinds carry their dequantized model in dequantized/.
CHECKPOINT_KINDS = ("dense", "moe", "ct-w4a16-moe", "ct-w4a16-moe-g16", "dense-h256", "moe-h128", "ct-nvfp4-moe",
                    "ct-nvfp4-dense", "ct-w4a16-dense")
# kinds this script adds to the factory (testing.checkpoints' own float recipe with other sliding-layer head dims):
# name -> (moe, config overrides). KV page sizes still divide (sliding 2 x 256 = global 1 x 512; 2 x 128 = 256).
EXTRA_KINDS = {"dense-h256": (False, {"head_dim": 256}), "moe-h128": (True, {"head_dim": 128})}
KERNEL_OVERLAYS = ("sm70-d512-attention", "sm70-w4-gemm")
# per tensor-parallel size, the kinds whose head counts, expert shapes and MoE intermediate size divide by it
# (checkpoints.py's TP2 shapes); the GPU side (engine_gpu.py TP_CHECKPOINTS) maps the same names to its runs
CHECKPOINT_KINDS_TP = {1: CHECKPOINT_KINDS, 2: ("dense-tp2", "moe-tp2", "ct-w4a16-moe-tp2")}
PROJECT_FILES = ("manager", "overlays", "benchmarks/engine_gpu.py", "benchmarks/engine_gpu.sh", "pyproject.toml",
                 "benchmarks/sm70_backend_plugin.py")   # phase r's plugin (issue 32 point 3)
GPU_SCRIPTS = ("benchmarks/engine_gpu.py", "benchmarks/engine_gpu.sh")


class PrepareError(RuntimeError):
    """A preparation step that cannot go on (one line, naming the file or package)."""


@dataclass(frozen=True)
class Piece:
    name: str       # file name under DIR/callN
    size: int
    sha256: str
    group: str      # the logical file it belongs to (parts of one split file share it)
    index: int = 0  # order within the group


@dataclass(frozen=True)
class CarryPlan:
    calls: tuple[tuple[str, ...], ...]
    sizes: tuple[int, ...]
    limit: int
    fixed: int      # bytes every call carries anyway (the repository, DIR/common)


@dataclass(frozen=True)
class Manifest:
    vllm_version: str
    pieces: tuple[Piece, ...]
    groups: dict = field(default_factory=dict)   # group -> {"kind": ..., "sha256": whole-file sha256}
    plan: CarryPlan | None = None


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(MIB), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_root() -> Path:
    from manager.releases import cache_dir

    return cache_dir() / "engine-gpu"


def _pip(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, env=env)


def _download(dest: Path, specs: list[str]) -> None:
    plat = [x for p in PLATFORMS for x in ("--platform", p)]
    proc = _pip("download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
                "--implementation", "cp", "--abi", "cp312", "--abi", "abi3", "--abi", "none",
                *plat, "-d", str(dest), *specs)
    if proc.returncode != 0:
        last = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.startswith("ERROR")]
        raise PrepareError(f"pip download {' '.join(specs[:3])}{' …' if len(specs) > 3 else ''}: "
                           f"{last[-1] if last else proc.stderr[-300:]}")


def fetch_vllm_wheel(cache: Path) -> Path:
    """The vLLM CUDA wheel, downloaded once into the cache and checked against its PyPI sha256."""
    dest = cache / "wheels"
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / VLLM_WHEEL
    if not wheel.exists():
        plat = ("--platform", "manylinux_2_35_x86_64")
        proc = _pip("download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
                    "--implementation", "cp", *plat, "-d", str(dest), f"vllm=={VLLM_VERSION}")
        if proc.returncode != 0 or not wheel.exists():
            raise PrepareError(f"pip download vllm=={VLLM_VERSION}: {(proc.stderr or proc.stdout)[-300:]}")
    got = sha256_file(wheel)
    if got != VLLM_WHEEL_SHA256:
        raise PrepareError(f"{wheel}: sha256 {got} is not PyPI's {VLLM_WHEEL_SHA256}")
    return wheel


def _wheel_name(spec: str) -> str:
    return spec.split("==")[0].lower().replace("-", "_").replace(".", "_")


def fetch_dependency_wheels(cache: Path, specs: tuple[str, ...] = DEPENDENCY_WHEELS) -> list[Path]:
    """Every pinned dependency wheel (downloaded once); exactly one wheel per name."""
    check_one_version_each(specs)
    dest = cache / "deps"
    dest.mkdir(parents=True, exist_ok=True)
    have = {_dist_of(p): p for p in dest.glob("*.whl")}
    missing = [s for s in specs if _wheel_name(s) not in have or _version_of(have[_wheel_name(s)]) != s.split("==")[1]]
    if missing:
        _download(dest, missing)
        have = {_dist_of(p): p for p in dest.glob("*.whl")}
    out = []
    for s in specs:
        p = have.get(_wheel_name(s))
        if p is None or _version_of(p) != s.split("==")[1]:
            raise PrepareError(f"{s}: no matching wheel in {dest} after download")
        out.append(p)
    return out


def _dist_of(wheel: Path) -> str:
    return wheel.name.split("-")[0].lower().replace(".", "_")


def _version_of(wheel: Path) -> str:
    return wheel.name.split("-")[1]


# The H200 image's Python packages (device KINDS.md, "Python packages already there", read 2026-11-17).
IMAGE_PACKAGES = frozenset([
    "absl-py", "accelerate", "aiofiles", "aiohappyeyeballs", "aiohttp", "aiosignal", "annotated-doc", "anyio", "attrs",
    "botorch", "build", "certifi", "charset-normalizer", "chex", "click", "cloudpickle", "cmake", "colorama",
    "contourpy", "coverage", "cuda-bindings", "cuda-core", "cuda-pathfinder", "cuda-toolkit", "cupy-cuda13x", "cycler",
    "cython", "diffrax", "e3nn", "einops", "equinox", "etils", "execnet", "filelock", "flatbuffers", "flax",
    "fonttools", "formulaic", "frozenlist", "fsspec", "gpytorch", "grpcio", "h11", "h5py", "hf-xet", "httpcore",
    "httpx", "huggingface-hub", "humanize", "hypothesis", "idna", "imageio", "iniconfig", "interface-meta", "jax",
    "jax-cuda13-pjrt", "jax-cuda13-plugin", "jaxlib", "jaxtyping", "jinja2", "joblib", "kiwisolver", "lazy-loader",
    "lightning", "lightning-utilities", "linear-operator", "lineax", "llvmlite", "lxml", "markdown", "markdown-it-py",
    "markupsafe", "matplotlib", "mdurl", "meson", "ml-dtypes", "mpi4py", "mpmath", "msgpack", "multidict",
    "multipledispatch", "mypy-extensions", "nanobind", "narwhals", "networkx", "ninja", "numba", "numba-cuda", "numpy",
    "numpyro", "nvidia-cublas", "nvidia-cuda-cupti", "nvidia-cuda-nvrtc", "nvidia-cuda-runtime", "nvidia-cudnn-cu13",
    "nvidia-cufft", "nvidia-cufile", "nvidia-curand", "nvidia-cusolver", "nvidia-cusparse", "nvidia-cusparselt-cu13",
    "nvidia-ml-py", "nvidia-nccl-cu13", "nvidia-nvjitlink", "nvidia-nvshmem-cu13", "nvidia-nvtx", "onnx", "onnx-ir",
    "onnxruntime", "onnxscript", "opencv-python-headless", "optax", "opt-einsum", "opt-einsum-fx", "optimistix",
    "orbax-checkpoint", "packaging", "pandas", "pathspec", "patsy", "peft", "pillow", "pip", "pluggy", "portalocker",
    "prometheus-client", "propcache", "protobuf", "psutil", "pyarrow", "pybind11", "py-cpuinfo", "pygments",
    "pyparsing", "pyproject-hooks", "pyre-extensions", "pytest", "pytest-benchmark", "pytest-cov", "pytest-mock",
    "pytest-timeout", "pytest-xdist", "python-dateutil", "pytorch-lightning", "pyyaml", "regex", "requests", "rich",
    "sacrebleu", "safetensors", "scikit-build-core", "scikit-image", "scikit-learn", "scipy", "seaborn",
    "sentencepiece", "sentence-transformers", "setuptools", "shellingham", "simplejson", "six", "sortedcontainers",
    "statsmodels", "sympy", "tabulate", "tensorboard", "tensorboard-data-server", "tensorstore", "threadpoolctl",
    "tifffile", "tiktoken", "timm", "tokenizers", "toolz", "torch", "torchaudio", "torchdiffeq", "torch-geometric",
    "torchmetrics", "torchvision", "tqdm", "transformers", "treescope", "triton", "typer", "typing-extensions",
    "typing-inspect", "urllib3", "uvloop", "wadler-lindig", "werkzeug", "wheel", "wrapt", "xarray", "xxhash", "yarl",
    "zipp",
])


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def unmet_requirements(wheels: list[Path], image: frozenset[str] = IMAGE_PACKAGES) -> list[str]:
    """Requires-Dist lines (no extras; markers for CPython 3.12 on Linux x86_64) that neither a carried
    wheel nor the image satisfies by name: "<wheel>: <requirement>"."""
    from packaging.requirements import Requirement

    env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}
    have = {_norm(_dist_of(w)) for w in wheels} | {_norm(n) for n in image}
    out = []
    for w in wheels:
        with zipfile.ZipFile(w) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            lines = z.read(meta).decode("utf-8", "replace").splitlines()
        for ln in lines:
            if not ln.startswith("Requires-Dist:"):
                continue
            req = Requirement(ln.split(":", 1)[1].strip())
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            if _norm(req.name) not in have:
                out.append(f"{w.name}: {req}")
    return out


def check_one_version_each(specs) -> None:
    seen: dict[str, str] = {}
    for s in specs:
        if "==" not in s:
            raise PrepareError(f"DEPENDENCY_WHEELS: {s!r} is not pinned (name==version)")
        name = _wheel_name(s)
        if name in seen:
            raise PrepareError(f"DEPENDENCY_WHEELS: {name} listed twice ({seen[name]}, {s}); "
                               "pip --target stops on two versions")
        seen[name] = s


def strip_vllm_wheel(wheel: Path, dest: Path, drop: tuple[str, ...] = (FA2,), need: str = FA3) -> dict:
    """Unpack the wheel without the dropped members into dest (a directory); returns what was kept."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        if need not in names:
            raise PrepareError(f"{wheel.name}: {need} missing (vllm.vllm_flash_attn needs one FlashAttention library)")
        for d in drop:
            if d not in names:
                raise PrepareError(f"{wheel.name}: {d} not in the wheel (nothing to strip; wrong wheel?)")
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        kept = 0
        size = 0
        for info in z.infolist():
            if info.filename in drop or info.is_dir():
                continue
            z.extract(info, dest)
            kept += 1
            size += info.file_size
        dropped = sum(z.getinfo(d).file_size for d in drop)
    return {"files": kept, "bytes": size, "dropped": list(drop), "dropped_bytes": dropped}


def pack_dir(src: Path, out: Path, members: list[str] | None = None) -> Path:
    """tar.xz of src (or of the named members of src); multi-threaded xz when the binary exists."""
    names = members if members is not None else sorted(p.name for p in src.iterdir())
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    if shutil.which("xz"):
        with open(tmp, "wb") as f:
            tar = subprocess.Popen(["tar", "-C", str(src), "-cf", "-", "--sort=name", *names], stdout=subprocess.PIPE)
            xz = subprocess.run(["xz", "-6", "-T0", "-c"], stdin=tar.stdout, stdout=f)
            tar.stdout.close()
            if tar.wait() != 0 or xz.returncode != 0:
                raise PrepareError(f"packing {src} into {out.name} failed")
    else:
        with tarfile.open(tmp, "w:xz") as t:
            for n in names:
                t.add(src / n, arcname=n)
    os.replace(tmp, out)
    return out


def split_file(path: Path, part_bytes: int, outdir: Path, group: str) -> list[Piece]:
    """Cut path into consecutive parts of at most part_bytes (group.partNN) and return them in order."""
    if part_bytes <= 0:
        raise PrepareError(f"part size must be positive, got {part_bytes}")
    outdir.mkdir(parents=True, exist_ok=True)
    pieces = []
    with open(path, "rb") as f:
        i = 0
        while True:
            chunk = f.read(part_bytes)
            if not chunk and i > 0:
                break
            name = f"{group}.part{i:02d}"
            (outdir / name).write_bytes(chunk)
            pieces.append(Piece(name, len(chunk), hashlib.sha256(chunk).hexdigest(), group, i))
            i += 1
            if len(chunk) < part_bytes:
                break
    return pieces


def plan_calls(pieces: list[Piece], limit: int, fixed: int = 0) -> CarryPlan:
    """Bin-pack pieces into calls of at most `limit` bytes each (incl. `fixed`), largest first.

    First-fit decreasing; the parts of a split file may land in different calls (the GPU side
    joins a group once all its parts arrived). A piece that cannot fit any call is an error.
    """
    room = limit - fixed
    calls: list[list[Piece]] = []
    for p in sorted(pieces, key=lambda p: (-p.size, p.group, p.index)):
        if p.size > room:
            raise PrepareError(f"{p.name}: {p.size / MIB:.1f} MiB does not fit a call "
                               f"({limit / MIB:.1f} MiB minus {fixed / MIB:.1f} MiB carried every call)")
        for c in calls:
            if sum(x.size for x in c) + p.size <= room:
                c.append(p)
                break
        else:
            calls.append([p])
    return CarryPlan(tuple(tuple(x.name for x in c) for c in calls),
                     tuple(fixed + sum(x.size for x in c) for c in calls), limit, fixed)


def build_kernel_cache(dest: Path, nvrtc: str | None = None) -> dict:
    """compute_70 PTX of the kernel overlays (overlay build's library) into dest."""
    from manager.kernels import builder

    if nvrtc is None:
        nvrtc = str(nvrtc12())
    r = builder.build(ROOT / "overlays", list(KERNEL_OVERLAYS), archs=["compute_70"], cache=dest,
                      nvrtc_path=nvrtc, progress=False)
    return {"compiled": r.compiled, "objects": [(i.source, i.arch, i.kind, i.key) for i in r.items]}


def nvrtc12() -> Path:
    """NVRTC 12 from PyPI wheels (the same install the kernel tests use)."""
    from tests.helpers.nvrtc12 import nvrtc12_lib  # ROOT is on sys.path (above)

    return nvrtc12_lib()


def build_checkpoints(dest: Path, kinds: tuple[str, ...] = CHECKPOINT_KINDS) -> dict:
    """The tiny checkpoints from the factory (testing.checkpoints), one directory per kind."""
    try:
        from testing import checkpoints as factory
    except ImportError as exc:
        raise PrepareError(f"testing.checkpoints: {exc} (the factory is not on this branch yet)") from exc
    for name, (moe, overrides) in EXTRA_KINDS.items():
        if name in kinds and name not in factory.kinds():
            factory.register_kind(name, factory._float_kind(moe, name, overrides))
    out = {}
    for kind in kinds:
        # bfloat16 storage halves what travels; bf16 values are exact in the fp16 engine and fp32 reference
        info = factory.build_checkpoint(kind, dest / kind, seed=0, dtype="bfloat16")
        out[kind] = {"quantization": info.quantization, "dtype": info.dtype,
                     "transformers": info.transformers_version,
                     "reference": str(Path(info.reference_path).relative_to(dest))}
    return out


def copy_project(dest: Path) -> None:
    for rel in PROJECT_FILES:
        src = ROOT / rel
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, out, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"), dirs_exist_ok=True)
        else:
            shutil.copy2(src, out)


def _fixed_bytes(common: Path, repo_bytes: int) -> int:
    return repo_bytes + sum(p.stat().st_size for p in common.rglob("*") if p.is_file())


def repo_bytes(repo: Path) -> int:
    """Bytes a device call sends anyway: the checkout's tracked and untracked-not-ignored files."""
    proc = subprocess.run(["git", "-C", str(repo), "ls-files", "-co", "--exclude-standard", "-z"],
                          capture_output=True)
    if proc.returncode != 0:
        raise PrepareError(f"{repo}: not a git checkout ({proc.stderr.decode()[-200:].strip()})")
    total = 0
    for rel in proc.stdout.split(b"\0"):
        if rel:
            p = repo / rel.decode()
            if p.is_file():
                total += p.stat().st_size
    return total


def call_command(n: int, last: bool, stage: str, tp: int = 1) -> str:
    """The shell command of device call n (receive its pieces; the last one also runs, at --tp when > 1)."""
    base = f"bash {stage}/common/engine_gpu.sh receive {stage}/call{n}"
    return base + (f" && bash {stage}/common/engine_gpu.sh run" + (f" --tp {tp}" if tp != 1 else "") if last else "")


def checkpoint_kinds(tp: int) -> tuple[str, ...]:
    """The factory kinds staged for tensor-parallel size tp (CHECKPOINT_KINDS_TP)."""
    if tp not in CHECKPOINT_KINDS_TP:
        raise PrepareError(f"--tp {tp}: no checkpoint kinds whose shapes divide by {tp} "
                           f"(staged sizes: {', '.join(map(str, CHECKPOINT_KINDS_TP))})")
    return CHECKPOINT_KINDS_TP[tp]


def select_kinds(tp: int, only: tuple[str, ...] | None) -> tuple[str, ...]:
    """The staged kinds: checkpoint_kinds(tp), or the named subset of them (PrepareError naming any other)."""
    kinds = checkpoint_kinds(tp)
    if not only:
        return kinds
    bad = [k for k in only if k not in kinds]
    if bad:
        raise PrepareError(f"--kinds: {', '.join(bad)} not among the --tp {tp} kinds ({', '.join(kinds)})")
    return tuple(only)


def prepare(out: Path, part_mib: float, call_mib: float, repo: Path | None, checkpoints: bool,
            kernels: bool, stage: str = ".gpu", tp: int = 1, only_kinds: tuple[str, ...] | None = None) -> Manifest:
    kinds = select_kinds(tp, only_kinds)
    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    work.mkdir(exist_ok=True)
    staged = out / "pieces"
    if staged.exists():
        shutil.rmtree(staged)
    staged.mkdir()
    cache = cache_root()
    groups: dict[str, dict] = {}
    pieces: list[Piece] = []

    def add_group(path: Path, group: str, kind: str) -> None:
        parts = split_file(path, int(part_mib * MIB), staged, group)
        pieces.extend(parts)
        groups[group] = {"kind": kind, "sha256": sha256_file(path), "size": path.stat().st_size,
                         "parts": [p.name for p in parts]}

    # 1. vLLM without FA2
    wheel = fetch_vllm_wheel(cache)
    packed = cache / f"vllm-{VLLM_VERSION}-nofa2.tar.xz"
    info_path = packed.with_suffix(".json")
    if not packed.exists() or not info_path.exists():
        tree = work / "vllm-tree"
        info = strip_vllm_wheel(wheel, tree)
        pack_dir(tree, packed)
        info_path.write_text(json.dumps(info))
        shutil.rmtree(tree)
    groups_info = {"vllm_strip": json.loads(info_path.read_text())}
    add_group(packed, "vllm", "tar.xz")

    # 2. dependency wheels: one uncompressed tar (wheels are zip files already)
    wheels = fetch_dependency_wheels(cache)
    unmet = unmet_requirements(wheels)
    if unmet:
        raise PrepareError("dependency wheels need what neither they nor the H200 image provide: " + "; ".join(unmet))
    deps_tar = work / "deps.tar"
    with tarfile.open(deps_tar, "w") as t:
        for w in sorted(wheels):
            t.add(w, arcname=w.name)
    add_group(deps_tar, "deps", "wheels.tar")

    # 3. kernel cache, 4. checkpoints, 5. project
    if kernels:
        kc = work / "kernels"
        if kc.exists():
            shutil.rmtree(kc)
        groups_info["kernels"] = build_kernel_cache(kc)
        add_group(pack_dir(kc, work / "kernels.tar.xz"), "kernels", "tar.xz")
    if checkpoints:
        ck = work / "checkpoints"
        if ck.exists():
            shutil.rmtree(ck)
        groups_info["checkpoints"] = build_checkpoints(ck, kinds)
        add_group(pack_dir(ck, work / "checkpoints.tar.xz"), "checkpoints", "tar.xz")
    proj = work / "project"
    if proj.exists():
        shutil.rmtree(proj)
    copy_project(proj)
    add_group(pack_dir(proj, work / "project.tar.xz"), "project", "tar.xz")

    # common: the scripts and the manifest, carried by every call
    common = out / "common"
    if common.exists():
        shutil.rmtree(common)
    common.mkdir()
    for rel in GPU_SCRIPTS:
        shutil.copy2(ROOT / rel, common / Path(rel).name)
    fixed = _fixed_bytes(common, repo_bytes(repo) if repo else 0) + 64 * 1024  # + the manifest
    plan = plan_calls(pieces, int(call_mib * MIB), fixed)
    for d in out.glob("call*"):
        shutil.rmtree(d)
    by_name = {p.name: p for p in pieces}
    for n, names in enumerate(plan.calls, 1):
        d = out / f"call{n}"
        d.mkdir()
        for name in names:
            os.replace(staged / name, d / name)
    manifest = Manifest(VLLM_VERSION, tuple(pieces), groups, plan)
    doc = {
        "vllm_version": VLLM_VERSION,
        "tp": tp,
        "pieces": [asdict(p) | {"call": next(i for i, c in enumerate(plan.calls, 1) if p.name in c)}
                   for p in pieces],
        "groups": groups,
        "info": groups_info,
        "plan": {"calls": [list(c) for c in plan.calls], "sizes": list(plan.sizes), "limit": plan.limit,
                 "fixed": plan.fixed,
                 "commands": [call_command(n, n == len(plan.calls), stage, tp) for n in range(1, len(plan.calls) + 1)],
                 "carry": [[f"{stage}/common", f"{stage}/call{n}"] for n in range(1, len(plan.calls) + 1)]},
    }
    (common / "manifest.json").write_text(json.dumps(doc, indent=1))
    shutil.rmtree(staged)
    del by_name
    return manifest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="staging directory (e.g. <checkout>/.gpu)")
    ap.add_argument("--part-mib", type=float, default=55.0, help="largest part of a split file (MiB)")
    ap.add_argument("--call-mib", type=float, default=60.0, help="most bytes one device call carries (MiB)")
    ap.add_argument("--repo", type=Path, default=None,
                    help="the checkout the device calls send (its files count against every call)")
    ap.add_argument("--no-checkpoints", action="store_true")
    ap.add_argument("--no-kernels", action="store_true")
    ap.add_argument("--stage", default=".gpu", help="the staging directory's path inside the checkout")
    ap.add_argument("--tp", type=int, default=1,
                    help="tensor-parallel size the run will use: stages the checkpoint kinds that divide by it (1, 2)")
    ap.add_argument("--kinds", default="",
                    help="comma list: stage only these checkpoint kinds (default: all of --tp's)")
    args = ap.parse_args(argv)
    only = tuple(k.strip() for k in args.kinds.split(",") if k.strip()) or None
    if not 1 <= args.part_mib <= args.call_mib <= 64:
        print(f"--part-mib {args.part_mib} / --call-mib {args.call_mib}: need 1 <= part <= call <= 64", file=sys.stderr)
        return 1
    try:
        select_kinds(args.tp, only)   # before anything is written
        m = prepare(args.out.resolve(), args.part_mib, args.call_mib, args.repo, not args.no_checkpoints,
                    not args.no_kernels, args.stage, args.tp, only)
    except PrepareError as exc:
        print(f"engine_gpu_prepare: {exc}", file=sys.stderr)
        return 1
    doc = json.loads((args.out / "common" / "manifest.json").read_text())
    for n, (names, size) in enumerate(zip(m.plan.calls, m.plan.sizes, strict=False), 1):
        print(f"call {n}: {size / MIB:5.1f} MiB  {' '.join(names)}", file=sys.stderr)
        print(f"  command: {doc['plan']['commands'][n - 1]}\n  carry:   {doc['plan']['carry'][n - 1]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
