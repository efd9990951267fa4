"""`overlay bundle`: this tool + dependencies for another Python/platform, runnable offline by a bare python3."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from manager.catalog import Catalog
from manager.compose.bundle import build_bundle, platform_tags, runtime_requirements
from manager.errors import ComposeError
from tests.helpers import containers as dh

pytestmark = pytest.mark.network  # wheels come from PyPI once, then from the cache

SYSTEM_PY = "/usr/bin/python3"


@pytest.fixture(scope="module")
def bundle() -> Path:
    return dh.bundle_dir(Catalog.locate())


def test_platform_tags_widen_to_older_glibc_and_legacy_aliases() -> None:
    tags = platform_tags("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert "manylinux_2_29_x86_64" not in tags
    assert platform_tags("macosx_11_0_arm64") == ["macosx_11_0_arm64"]


def test_bundle_layout_holds_site_catalog_wrapper_and_manifest(bundle: Path) -> None:
    meta = json.loads((bundle / "BUNDLE.json").read_text())
    assert meta["python"] == "3.11" and meta["platform"] == "manylinux_2_28_x86_64"
    names = {n.lower().replace("_", "-") for n in meta["packages"]}
    for req in runtime_requirements():
        name = req.split(">")[0].split("=")[0].split("<")[0].strip().lower()
        assert name in names, name
    assert (bundle / "site" / "manager" / "templates" / "compose.yml.j2").is_file()
    assert (bundle / "catalog" / "compose" / "deployments.yaml").is_file()
    assert (bundle / "catalog" / "profiles").is_dir() and (bundle / "catalog" / "overlays").is_dir()
    assert os.access(bundle / "bin" / "overlay", os.X_OK)
    # bytecode only for the bundle's python, compiled from the bundle's own sources (nothing of the host's)
    assert meta["bytecode"] == "cpython-311"
    cached = [p for p in bundle.rglob("*.pyc")]
    assert cached and all(p.parent.name == "__pycache__" and ".cpython-311." in p.name for p in cached)
    assert all((p.parent.parent / (p.name.split(".")[0] + ".py")).is_file() for p in cached)
    assert not [p for p in bundle.rglob("__pycache__") if p.relative_to(bundle).parts[0] not in ("site", "memory")]
    # in-memory delivery: the hook's sitecustomize and its stdlib-only package, never named `manager`
    assert (bundle / "memory" / "sitecustomize.py").is_file()
    assert (bundle / "memory" / "overlay_memory" / "inmemory" / "hook.py").is_file()
    assert not (bundle / "memory" / "manager").exists()
    libcst = next((bundle / "site").glob("libcst-*.dist-info"))
    assert tuple(int(x) for x in libcst.name.split("-")[1].split(".")[:2]) >= (1, 8)


@pytest.mark.skipif(not Path(SYSTEM_PY).exists(), reason="needs a bare system python3")
def test_bundle_runs_under_a_python_without_our_dependencies_and_without_network(bundle: Path, tmp_path: Path) -> None:
    bare = subprocess.run([SYSTEM_PY, "-c", "import libcst"], capture_output=True)
    assert bare.returncode != 0, "the system python already has libcst; the test would prove nothing"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "OVERLAY_PYTHON": SYSTEM_PY,
           "http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9"}
    res = subprocess.run([str(bundle / "bin" / "overlay"), "compose", "list", "--json"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    slugs = {d["slug"] for d in json.loads(res.stdout)["deployments"]}
    assert "gemma4-26b-a4b-awq-3090-tp2" in slugs


@pytest.mark.skipif(not Path(SYSTEM_PY).exists(), reason="needs a bare system python3")
def test_the_wrapper_runs_from_the_bundles_bytecode_and_the_images_stdlib_bytecode(bundle: Path, tmp_path: Path) -> None:
    """No PYTHONPYCACHEPREFIX when the bundle carries bytecode (a prefix makes python ignore the
    stdlib's own __pycache__ too): nothing is compiled or written, neither in the bundle nor in a
    prefix directory, and the image's python reads its stdlib bytecode."""
    before = {p: p.stat().st_mtime_ns for p in bundle.rglob("*")}
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path), "OVERLAY_PYTHON": SYSTEM_PY}
    probe = tmp_path / "probe"
    probe.write_text("#!/bin/sh\nexec /usr/bin/python3 -c 'import os, sys, json, manager.fastpath as f; "
                     "print(sys.pycache_prefix, os.path.isfile(json.__cached__), f.__cached__)'\n")
    probe.chmod(0o755)
    wrapper = (bundle / "bin" / "overlay").read_text().replace('"${OVERLAY_PYTHON:-python3}" -c', f'"{probe}" -c')
    (tmp_path / "overlay").write_text(wrapper.replace('here=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd)',
                                                      f'here={bundle}'))
    res = subprocess.run(["sh", str(tmp_path / "overlay")], env=env, capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    prefix, stdlib_pyc, cached = res.stdout.split()
    assert prefix == "None" and stdlib_pyc == "True"
    assert cached.startswith(str(bundle / "site" / "manager" / "__pycache__"))
    res = subprocess.run([str(bundle / "bin" / "overlay"), "compose", "list", "--json"], env=env,
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert {p: p.stat().st_mtime_ns for p in bundle.rglob("*")} == before  # nothing (re)compiled into it
    assert not (tmp_path / "overlay-pycache").exists()


def test_rebuilding_replaces_an_earlier_bundle_but_refuses_a_foreign_directory(bundle: Path, tmp_path: Path) -> None:
    out = tmp_path / "b"
    first = build_bundle(out, "3.11", "manylinux_2_28_x86_64", Catalog.locate())
    assert first.wheels_cached  # the module fixture downloaded them
    (out / "stale-file").write_text("x")
    build_bundle(out, "3.11", "manylinux_2_28_x86_64", Catalog.locate())
    assert not (out / "stale-file").exists() and (out / "BUNDLE.json").is_file()
    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ComposeError, match="not an overlay bundle"):
        build_bundle(foreign, "3.11", "manylinux_2_28_x86_64", Catalog.locate())
    assert (foreign / "notes.txt").read_text() == "mine"


def test_bad_python_version_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(ComposeError, match="expected a version like 3.12"):
        build_bundle(tmp_path / "b", "python3", "manylinux_2_28_x86_64", Catalog.locate())


def test_bundle_for_python_312_resolves_libcst_at_least_1_8(tmp_path: Path) -> None:
    res = build_bundle(tmp_path / "b312", "3.12", "manylinux_2_28_x86_64", Catalog.locate())
    assert tuple(int(x) for x in res.packages["libcst"].split(".")[:2]) >= (1, 8)
    assert list((res.path / "site").glob("libcst/native*.cpython-312-x86_64-linux-gnu.so")) or list(
        (res.path / "site").rglob("*.cpython-312-x86_64-linux-gnu.so")
    )


@pytest.mark.docker
def test_bundle_runs_in_the_test_image_with_network_off(bundle: Path) -> None:
    client = dh.docker_client()
    image = dh.vllm_image(client)
    out = client.containers.run(
        image, ["/opt/overlay/bin/overlay", "--version"], network_mode="none", remove=True,
        volumes={str(bundle): {"bind": "/opt/overlay", "mode": "ro"}},
    )
    assert b"overlay" in out and b"0." in out


def test_cli_bundle_writes_the_directory(tmp_path: Path, cli_run) -> None:
    res = cli_run("bundle", "--python", "3.11", "-o", str(tmp_path / "cb"), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["python"] == "3.11" and (tmp_path / "cb" / "bin" / "overlay").exists()
    assert data["size_bytes"] > 1_000_000
    shutil.rmtree(tmp_path / "cb")


def test_without_pip_or_uv_and_no_cached_wheels_the_bundle_is_one_line_naming_what_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from manager.compose import bundle as b

    monkeypatch.setattr(b, "pip_command", lambda: None)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("OVERLAY_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ComposeError) as err:
        build_bundle(tmp_path / "b", "3.12", "manylinux_2_28_x86_64", Catalog.locate(), plans=False)
    assert "install uv" in str(err.value) and "pip" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "b").exists()


def test_wheels_unpack_without_pip_including_their_purelib_and_platlib_data(tmp_path: Path) -> None:
    import zipfile

    from manager.compose.bundle import install_wheels

    whl = tmp_path / "w" / "demo-1.0-py3-none-any.whl"
    whl.parent.mkdir()
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr("demo/__init__.py", "X = 1\n")
        zf.writestr("demo-1.0.dist-info/METADATA", "Name: demo\nVersion: 1.0\n")
        zf.writestr("demo-1.0.data/platlib/demo_ext.py", "Y = 2\n")
        zf.writestr("demo-1.0.data/scripts/demo", "#!/bin/sh\n")
    assert install_wheels(whl.parent, tmp_path / "site") == [whl.name]
    site = tmp_path / "site"
    assert (site / "demo" / "__init__.py").is_file() and (site / "demo_ext.py").read_text() == "Y = 2\n"
    assert not list(site.glob("*.data"))


def test_uv_platform_names_follow_uvs_spelling() -> None:
    from manager.compose.bundle import uv_platform

    assert uv_platform("manylinux_2_28_x86_64") == "x86_64-manylinux_2_28"
    with pytest.raises(ComposeError):
        uv_platform("win_amd64")


@pytest.mark.skipif(not Path(SYSTEM_PY).exists(), reason="needs a bare system python3")
def test_the_wrapper_exports_the_bundles_plan_key_and_its_plans_are_signed_with_it(bundle: Path, tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    probe.write_text("#!/bin/sh\nexec /usr/bin/python3 -c 'import os; print(os.environ.get(\"OVERLAY_PLAN_KEY\"))'\n")
    probe.chmod(0o755)
    wrapper = (bundle / "bin" / "overlay").read_text().replace('"${OVERLAY_PYTHON:-python3}" -c', f'"{probe}" -c')
    (tmp_path / "overlay").write_text(wrapper.replace('here=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd)',
                                                      f'here={bundle}'))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    res = subprocess.run(["sh", str(tmp_path / "overlay")], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"{bundle}/plan-key"
    given = subprocess.run(["sh", str(tmp_path / "overlay")], env={**env, "OVERLAY_PLAN_KEY": "/run/secrets/k"},
                           capture_output=True, text=True, timeout=60)
    assert given.stdout.strip() == "/run/secrets/k"  # a key given by the user wins
    from manager.overlays.plankey import load_key, mac_problem

    key = load_key(bundle / "plan-key")
    assert (bundle / "plan-key").stat().st_mode & 0o777 == 0o444
    assert json.loads((bundle / "BUNDLE.json").read_text())["plan_key"] == {"file": "plan-key", "key_id": key.key_id}
    plans = sorted((bundle / "plans").glob("*.json"))
    assert plans
    for p in plans:
        assert mac_problem(json.loads(p.read_text()), p.stem, key) is None, p


@pytest.mark.skipif(not Path(SYSTEM_PY).exists(), reason="needs a bare system python3")
def test_a_cache_plan_recorded_by_one_bundle_is_refused_under_another_bundles_key(bundle: Path, tmp_path: Path) -> None:
    """Two bundles share the plan cache (the kernel-cache volume): each records under its own key id,
    and a plan of one put where the other looks is refused in one line; the engine applies."""
    from manager.overlays import load_overlays, select
    from manager.overlays.plankey import load_key
    from tests.helpers.catalogs import PR40886
    from tests.overlays.test_prepared_plans import _fresh, _tree

    other = build_bundle(tmp_path / "other", "3.11", "manylinux_2_28_x86_64", Catalog.locate(), plans=False).path
    key_a, key_b = load_key(bundle / "plan-key"), load_key(other / "plan-key")
    assert key_a.key_id != key_b.key_id
    every = load_overlays(Catalog(bundle / "catalog"))
    cache = tmp_path / "cache"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "OVERLAY_PYTHON": SYSTEM_PY,
           "OVERLAY_PLAN_CACHE": str(cache), "OVERLAY_PLANS": "/nonexistent"}

    def start(b: Path, root: Path) -> subprocess.CompletedProcess:
        return subprocess.run([str(b / "bin" / "overlay"), "apply", PR40886, "--root", str(root)],
                              env=env, capture_output=True, text=True, timeout=300)

    root_a, root_b, ref = _fresh(tmp_path, every, "a"), _fresh(tmp_path, every, "b"), _fresh(tmp_path, every, "ref")
    from manager.overlays import apply

    apply(select(every, [PR40886]), ref, explicit=True)
    first = start(bundle, root_a)
    assert first.returncode == 0 and "recorded" in first.stderr, first.stderr
    (recorded,) = (cache / key_a.key_id).glob("*.json")
    planted = cache / key_b.key_id / recorded.name
    planted.parent.mkdir()
    shutil.copy(recorded, planted)
    second = start(other, root_b)
    assert second.returncode == 0, second.stderr
    refused = [ln for ln in second.stderr.splitlines() if "refused" in ln]
    assert len(refused) == 1 and str(planted) in refused[0], second.stderr
    assert f"signed with key id {key_a.key_id}, this key is {key_b.key_id}" in refused[0]
    assert "running the full engine" in refused[0] and "(prepared plan" not in second.stderr
    assert _tree(root_b) == _tree(root_a) == _tree(ref)
