"""The vllm-v100 image (compose/images/vllm-v100), built by `overlay image build` on a real Docker engine.

One build per run (tests/helpers/containers.py `v100_image`: the project's debootstrap bookworm base +
python3-venv, the ~4.9 GB of wheels from the cache, reused when the image's context label matches) and
these checks on it: the audited wheel set is what is installed; `overlay verify --image` reports, on the
image's real 0.19.1 files, the statuses the catalog computes on the 0.19.1 sdist; `overlay engine audit
--image --sm 70` (when manager.engines is there); `overlay build` inside the image compiles the SM70
kernels with the image's own NVRTC 12; the rendered V100 entrypoint runs in it. No GPU is used: nothing
here ran on a V100.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from shlex import quote as _sq

import pytest

from manager.catalog import Catalog
from tests.helpers import REPO_ROOT
from tests.helpers import containers

PINS = {"vllm": "0.19.1", "torch": "2.10.0", "torchvision": "0.25.0", "torchaudio": "2.10.0"}

VERSIONS_PY = (
    "import json, importlib.metadata as m\n"
    "names = ['vllm', 'torch', 'torchvision', 'torchaudio', 'transformers', 'nvidia-cuda-nvrtc-cu12',\n"
    "         'nvidia-cuda-runtime-cu12', 'nvidia-cublas-cu12', 'triton']\n"
    "print(json.dumps({n: m.version(n) for n in names}))\n"
)

# reads each kernel image the in-image build wrote: a cubin's ELF e_machine (190 = EM_CUDA) and e_flags
# (the low byte is the SM), a PTX file's `.target` line
ARTIFACTS_PY = (
    "import json, re, struct, sys\n"
    "out = {}\n"
    "build = json.loads(sys.stdin.read())\n"
    "for item in build['items']:\n"
    "    data = open(item['path'], 'rb').read()\n"
    "    if item['kind'] == 'cubin':\n"
    "        machine, = struct.unpack_from('<H', data, 18); flags, = struct.unpack_from('<I', data, 48)\n"
    "        out[item['source'] + ' ' + item['arch']] = {'elf': data[:4] == b'\\x7fELF', 'machine': machine,\n"
    "                                                   'sm': flags & 0xff, 'bytes': len(data)}\n"
    "    else:\n"
    "        m = re.search(rb'^\\.target\\s+(\\w+)', data, re.M)\n"
    "        out[item['source'] + ' ' + item['arch']] = {'target': m.group(1).decode() if m else None,\n"
    "                                                   'bytes': len(data)}\n"
    "print(json.dumps({'build': build, 'artifacts': out}))\n"
)


@pytest.fixture(scope="session")
def catalog() -> Catalog:
    return Catalog(REPO_ROOT)


@pytest.fixture(scope="session")
def docker():
    return containers.docker_client()


@pytest.fixture(scope="session")
def v100(docker, catalog):
    return containers.v100_image(docker, catalog)


def _run(docker, image: str, script: str) -> str:
    """`sh -c SCRIPT` in the image, no network, no GPU; its stdout (the stderr tail on failure)."""
    c = docker.containers.run(image, ["-c", script], entrypoint=["/bin/sh"], network_mode="none", detach=True)
    try:
        rc = c.wait(timeout=600)["StatusCode"]
        out = c.logs(stdout=True, stderr=False).decode(errors="replace")
        err = c.logs(stdout=False, stderr=True).decode(errors="replace")
    finally:
        c.remove(force=True)
    assert rc == 0, f"{script[:200]!r} exited {rc}: {err[-2000:]}"
    return out


def _statuses_on_sdist(catalog: Catalog, version: str) -> dict[str, str]:
    """What the catalog says about each overlay on the pristine sdist files of `version`."""
    from manager.overlays.statuses import status_on_release

    return {o.id: o.status for o in status_on_release(version, catalog).overlays}


@pytest.mark.docker
def test_the_image_holds_the_audited_wheel_set_and_the_bundle_with_plans_for_0_19_1(docker, v100) -> None:
    assert v100.tag == "overlay-manager/vllm-v100:0.19.1-cu128"
    assert v100.python == "3.11" and v100.size_bytes > 5e9
    versions = json.loads(_run(docker, v100.tag, f"python3 - <<'PY'\n{VERSIONS_PY}PY").strip().splitlines()[-1])
    for name, pin in PINS.items():
        assert versions[name] == pin, (name, versions[name])
    transformers = tuple(int(x) for x in versions["transformers"].split(".")[:3])
    assert transformers >= (5, 5, 1), versions["transformers"]
    assert versions["nvidia-cuda-nvrtc-cu12"].startswith("12.") and versions["nvidia-cuda-runtime-cu12"].startswith("12.")
    meta = json.loads(_run(docker, v100.tag, "cat /opt/overlay/BUNDLE.json"))
    assert meta["python"] == "3.11"
    plans = _run(docker, v100.tag, "ls /opt/overlay/plans").split()
    assert plans and all(p.endswith(".json") for p in plans)
    # the default entrypoint's overlays on 0.19.1 have a prepared plan (an apply that replays it, below)
    assert any("vllm 0.19.1" in line and ": plan " in line for line in v100.context.plans), v100.context.plans


@pytest.mark.docker
def test_verify_reports_the_statuses_the_catalog_computes_on_the_0_19_1_sdist(
        docker, v100, catalog, cli_run) -> None:
    expected = _statuses_on_sdist(catalog, PINS["vllm"])
    res = cli_run("verify", "--image", v100.tag, "--json")
    rep = json.loads(res.stdout)
    assert rep["vllm"] == PINS["vllm"] and rep["torch"] == PINS["torch"], rep
    assert rep["python"].startswith("3.11.")
    # the wheel's installed files and the sdist's agree for every overlay of the catalog
    assert rep["overlays"] == expected
    failing = {k: v for k, v in expected.items() if v in ("drift", "partial", "modified", "missing-target", "error")}
    assert rep["failing"] == failing
    assert res.exit_code == (1 if failing else 0), res.stderr
    # the bundle baked into the image (no mount) sees the same
    inside = json.loads(_run(docker, v100.tag, "/opt/overlay/bin/overlay status --json"))
    assert {o["id"]: o["status"] for o in inside["overlays"]} == expected


@pytest.mark.docker
def test_engine_audit_finds_every_component_a_gemma4_step_needs_runs_on_sm70(v100, cli_run) -> None:
    if importlib.util.find_spec("manager.engines") is None:
        pytest.skip("manager.engines (`overlay engine audit`, issue 24 point 1) is not in this tree yet")
    res = cli_run("engine", "audit", "--image", v100.tag, "--sm", "70", "--json")
    # the command's contract (issue 24, point 1): exit 0 when every component a Gemma-4 step needs runs
    # on the SM; one JSON object, its verdict and the `components` list (role, verdict per component)
    rep = json.loads(res.stdout) if res.stdout.strip().startswith("{") else {}
    assert res.exit_code == 0, (rep.get("failing"), res.stderr[-2000:])
    assert rep["verdict"] == "runs" and rep["sm"] == 70
    needed = [c for c in rep["components"] if c.get("role") == "needed"]
    assert needed and all(c["verdict"] == "runs" for c in needed), [c for c in needed if c["verdict"] != "runs"]
    # the engine's own kernels are among them: vLLM's _C and torch's libtorch_cuda
    assert {"vllm/_C.abi3.so", "torch/lib/libtorch_cuda.so"} <= {c["binary"] for c in needed}


@pytest.mark.docker
def test_overlay_build_inside_the_image_compiles_the_sm70_kernels_with_its_nvrtc_12(docker, v100, catalog) -> None:
    from manager.overlays import load_overlays

    kernel_overlays = [o for o in load_overlays(catalog) if o.manifest.kernels is not None]
    assert kernel_overlays
    ids = " ".join(o.id for o in kernel_overlays)
    out = json.loads(_run(docker, v100.tag,
                          f"/opt/overlay/bin/overlay build {ids} --arch sm_70 --cache /tmp/kc --json >/tmp/b.json"
                          f" && python3 -c {_sq(ARTIFACTS_PY)} </tmp/b.json"))
    result, art = out["build"], out["artifacts"]
    # a cold cache: every object compiled here, by the NVRTC 12 of the image's nvidia-cuda-nvrtc-cu12 wheel
    assert result["items"] and result["compiled"] == len(result["items"]), result
    assert "12." in result["compiler"], result["compiler"]
    for ov in kernel_overlays:
        for src in ov.manifest.kernels.sources:
            cubin, ptx = art[f"{src.path} sm_70"], art[f"{src.path} compute_70"]
            assert cubin["elf"] and cubin["machine"] == 190 and cubin["sm"] == 70 and cubin["bytes"] > 0, (src.path, cubin)
            assert ptx["target"] == "sm_70" and ptx["bytes"] > 0, (src.path, ptx)


# a stand-in `vllm` first on PATH: the entrypoint's last step is `exec vllm serve ARGS`, and the real
# one cannot get past its device check without a GPU; it prints the argv it was exec'd with
STANDIN = "mkdir -p /tmp/standin && printf '#!/bin/sh\\necho \"exec: vllm $*\"\\n' >/tmp/standin/vllm && chmod +x /tmp/standin/vllm"
IMPORT_PATCHED = ("import vllm.v1.attention.backends.triton_attn as t, vllm.v1.attention.backends.sm70_d512_attn as s; "
                  "print('imported', t.__name__, s.__name__)")


def _start(docker, image: str, start: str, overlays: tuple[str, ...], after: str = "true") -> str:
    """Run `start` (an entrypoint) with `--port 8000`, then import the patched modules with the image's real
    vllm 0.19.1 and torch 2.10.0 (CPU-only import) and run `after`; returns the output (the entrypoint's
    stderr included) after checking the exec'd argv, the import and that every overlay is applied."""
    out = _run(docker, image, f"{STANDIN} && PATH=/tmp/standin:$PATH {start} --port 8000 2>&1"
                              f" && python3 -c {_sq(IMPORT_PATCHED)} 2>/dev/null && {after}"
                              " && echo '--- status ---' && /opt/overlay/bin/overlay status --json")
    lines = out.splitlines()
    assert "exec: vllm serve --port 8000" in lines, out[:2000]
    assert "imported vllm.v1.attention.backends.triton_attn vllm.v1.attention.backends.sm70_d512_attn" in lines
    out, _, status_json = out.partition("--- status ---\n")
    applied = {o["id"]: o["status"] for o in json.loads(status_json)["overlays"]}
    assert overlays and all(applied[i] == "applied" for i in overlays), applied
    return out


@pytest.mark.docker
def test_the_image_entrypoint_applies_its_overlays_builds_the_kernels_and_execs_vllm_serve(docker, v100, catalog) -> None:
    from manager.compose.image import load_recipe

    recipe = load_recipe(catalog, "vllm-v100")
    # `after`: the index of the kernels the entrypoint built into the image's kernel cache, on one line
    out = _start(docker, v100.tag, "/usr/local/bin/overlay-entrypoint", recipe.apply,
                 after=f"tr -d '\\n' </var/cache/overlay-kernels/index/{recipe.build[0]}.json && echo")
    # the first apply replayed the prepared plan baked into the image for 0.19.1, signed with the bundle's plan key
    assert "(prepared plan, hashes verified; signature verified (plan key " in out, out[:2000]
    index = json.loads(next(ln for ln in out.splitlines() if ln.startswith("{") and "sm_70" in ln))
    assert {"sm_70", "compute_70"} <= set(json.dumps(index).replace('"', " ").split()), index


@pytest.mark.docker
def test_the_rendered_entrypoint_of_each_deployment_on_this_image_runs_in_it(docker, v100, catalog) -> None:
    from manager.compose.plan import plan_all
    from manager.compose.registry import load_registry
    from manager.compose.render import render_entrypoint

    plans = [p for _, p in sorted(plan_all(load_registry(catalog), catalog).items()) if p.image == v100.tag]
    if not plans:
        pytest.skip(f"no deployment of compose/deployments.yaml names {v100.tag} yet (issue 24 points 2 and 6)")
    for plan in plans:
        _start(docker, v100.tag, f"/bin/sh -c {_sq(render_entrypoint(plan))} overlay-entrypoint",
                    plan.overlays + plan.kernel_overlays)


# ----------------------------------------------------------------------------- without a Docker engine


def _sdist_text(version: str, rel: str) -> str:
    import tarfile

    from manager import releases

    with tarfile.open(releases.sdist(version)) as tar:
        member = next(m for m in tar.getmembers() if m.name.split("/", 1)[-1] == rel)
        return tar.extractfile(member).read().decode()


def _requirement(text: str, name: str):
    from packaging.requirements import Requirement

    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            req = Requirement(line)
            if req.name.lower() == name:
                return req
    raise AssertionError(f"{name} not in the requirements")


def test_the_recipe_pins_satisfy_the_0_19_1_release_requirements(catalog) -> None:
    from packaging.version import Version

    from manager.compose.image import load_recipe

    recipe = load_recipe(catalog, "vllm-v100")
    assert recipe.tag == "overlay-manager/vllm-v100:0.19.1-cu128" and recipe.vllm_version == PINS["vllm"]
    pins = {str(r).split("==")[0]: str(r).split("==")[1] for r in recipe.requirements}
    assert {k: pins[k] for k in PINS} == PINS
    common = _sdist_text(recipe.vllm_version, "requirements/common.txt")
    cuda = _sdist_text(recipe.vllm_version, "requirements/cuda.txt")
    assert Version(pins["transformers"]) in _requirement(common, "transformers").specifier
    assert Version(pins["transformers"]) >= Version("5.5.1")
    for name in ("torch", "torchvision", "torchaudio"):
        assert Version(pins[name]) in _requirement(cuda, name).specifier, name


def test_a_recipe_naming_an_unknown_overlay_is_refused_before_anything_is_written(catalog, tmp_path) -> None:
    from manager.compose.image import load_recipe, write_context
    from manager.errors import ComposeError

    cat = tmp_path / "cat"
    for part in ("overlays", "profiles", "compose"):
        shutil.copytree(catalog.root / part, cat / part)
    yml = cat / "compose" / "images" / "vllm-v100" / "recipe.yaml"
    yml.write_text(yml.read_text().replace("apply: [dynamo-dict-caches", "apply: [no-such-overlay, dynamo-dict-caches"))
    recipe = load_recipe(Catalog(cat), "vllm-v100")
    with pytest.raises(ComposeError, match=r"recipe\.yaml: overlay 'no-such-overlay' is not in the catalog"):
        write_context(recipe, Catalog(cat), tmp_path / "ctx", "3.12")
    assert not (tmp_path / "ctx").exists()


@pytest.mark.parametrize("args, message", [
    (["image", "build", "no-such-recipe"], "no image recipe 'no-such-recipe'"),
    (["image", "build", "../etc"], "expected a lower-case name"),
    (["image", "wheels", "vllm-v100", "--python", "3"], "--python '3': expected a version like 3.12"),
])
def test_image_commands_refuse_bad_input_in_one_line(cli_run, args, message, tmp_path) -> None:
    res = cli_run(*args, "--wheels", str(tmp_path / "w")) if args[1] == "wheels" else cli_run(*args)
    assert res.exit_code == 1 and len(res.err_lines) == 1 and message in res.stderr, res.output
    assert not (tmp_path / "w").exists()


def test_the_wheel_lock_pins_every_wheel_by_its_sha256(tmp_path) -> None:
    import hashlib

    from manager.compose.wheels import _write_lock
    from manager.errors import ComposeError

    (tmp_path / "torch-2.10.0-3-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"t")
    (tmp_path / "nvidia_cuda_nvrtc_cu12-12.8.93-py3-none-manylinux2010_x86_64.whl").write_bytes(b"n")
    lines = _write_lock(tmp_path).read_text().splitlines()[1:]
    assert lines == [f"nvidia-cuda-nvrtc-cu12==12.8.93 --hash=sha256:{hashlib.sha256(b'n').hexdigest()}",
                     f"torch==2.10.0 --hash=sha256:{hashlib.sha256(b't').hexdigest()}"]
    (tmp_path / "not-a-wheel.whl").write_bytes(b"x")
    with pytest.raises(ComposeError, match="not a wheel file name"):
        _write_lock(tmp_path)


def test_the_wheel_server_lists_and_serves_the_directory_on_loopback(tmp_path) -> None:
    import urllib.request

    from manager.compose.wheels import WheelServer

    (tmp_path / "a-1.0-py3-none-any.whl").write_bytes(b"wheel bytes")
    with WheelServer(tmp_path, "0" * 64) as srv:
        base = f"http://127.0.0.1:{srv.port}/"
        assert srv.httpd.server_address[0] == "127.0.0.1"
        assert 'href="a-1.0-py3-none-any.whl"' in urllib.request.urlopen(base, timeout=5).read().decode()
        assert urllib.request.urlopen(base + "a-1.0-py3-none-any.whl", timeout=5).read() == b"wheel bytes"


def test_the_image_entrypoint_runs_the_rendered_entrypoints_steps(catalog, tmp_path) -> None:
    """recipe entrypoint.sh and the entrypoint `compose render` writes, run by sh with a recording
    `overlay` and `vllm`: the same calls in the same order (apply IDS, build IDS --cache, exec vllm serve ARGS)."""
    import os
    import subprocess

    from manager.compose.image import load_recipe
    from manager.compose.render import ServicePlan, render_entrypoint

    recipe = load_recipe(catalog, "vllm-v100")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("overlay", "vllm"):
        (bindir / name).write_text(f'#!/bin/sh\necho "{name} $*" >>"$CALLS"\n')
        (bindir / name).chmod(0o755)
    plan = ServicePlan(slug="v100", image=recipe.tag, serve_args=(), overlays=recipe.apply, kernel_overlays=recipe.build)
    scripts = {"recipe": (recipe.path / "entrypoint.sh").read_text(), "rendered": render_entrypoint(plan)}
    calls = {}
    for kind, script in scripts.items():
        log = tmp_path / f"{kind}.calls"
        env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", CALLS=str(log), OVERLAY_BIN=str(bindir / "overlay"),
                   OVERLAY_APPLY=" ".join(recipe.apply), OVERLAY_BUILD=" ".join(recipe.build),
                   OVERLAY_KERNEL_CACHE="/var/cache/overlay-kernels")
        subprocess.run(["/bin/sh", "-c", script, "overlay-entrypoint", "/models/m", "--port", "8000"], env=env, check=True)
        calls[kind] = log.read_text().splitlines()
    assert calls["recipe"] == calls["rendered"]
    assert calls["recipe"] == [f"overlay apply {' '.join(recipe.apply)}",
                               f"overlay build {' '.join(recipe.build)} --cache /var/cache/overlay-kernels",
                               "vllm serve /models/m --port 8000"]


@pytest.mark.docker
def test_a_base_image_that_is_not_present_is_named_in_one_line_and_nothing_is_built(docker, cli_run) -> None:
    base = "overlay-manager-test/no-such-base:0"
    res = cli_run("image", "build", "vllm-v100", "--base", base, "--tag", "overlay-manager-test/never-built:0")
    assert res.exit_code == 1 and len(res.err_lines) == 1, res.output
    assert f"base image {base!r} is not present locally" in res.stderr
    assert not docker.images.list(name="overlay-manager-test/never-built")
