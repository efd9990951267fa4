"""The stdlib-only container-restart path of `overlay apply` (manager/fastpath.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from manager import fastpath
from manager.overlays import apply, load_overlays
from tests.helpers.catalogs import CUDA_PY, PR40886, shipped_catalog
from tests.helpers.cli import run_entry


@pytest.fixture
def applied(tmp_path, vllm_root):
    cat = shipped_catalog(tmp_path / "cat")
    root = vllm_root("0.20.0")
    apply(load_overlays(cat), root)
    return cat.root, root


def _argv(cat: Path, root: Path, *extra: str) -> list[str]:
    return ["--catalog", str(cat), "apply", *extra, "--root", str(root)]


def test_fastpath_answers_a_warm_apply_from_the_ledger(applied):
    cat, root = applied
    done = fastpath.nothing_to_do(_argv(cat, root))
    assert done is not None and sorted(s for _, s in done) == ["applied"] * 3


def test_fastpath_follows_named_ids_and_their_recorded_requires(applied):
    cat, root = applied
    assert fastpath.nothing_to_do(_argv(cat, root, PR40886)) == [(PR40886, "applied")]
    assert fastpath.nothing_to_do(_argv(cat, root, "no-such-overlay")) is None


def test_fastpath_declines_when_a_target_changed(applied):
    cat, root = applied
    p = root / CUDA_PY
    p.write_text(p.read_text() + "\n# touched\n")
    assert fastpath.nothing_to_do(_argv(cat, root)) is None


def test_fastpath_declines_when_an_overlay_directory_changed(applied, tmp_path):
    cat, root = applied
    # the catalog holds symlinks: replace one overlay by an edited copy
    import shutil

    link = cat / "overlays" / PR40886
    src = link.resolve()
    link.unlink()
    shutil.copytree(src, link)
    (link / "overlay.yaml").write_text((link / "overlay.yaml").read_text() + "\n# edited\n")
    assert fastpath.nothing_to_do(_argv(cat, root)) is None


def test_fastpath_declines_after_an_interrupted_apply_and_for_other_commands(applied):
    cat, root = applied
    assert fastpath.nothing_to_do(_argv(cat, root, "--dry-run")) is None
    assert fastpath.nothing_to_do(["--catalog", str(cat), "status", "--root", str(root)]) is None
    (root / ".overlay-manager" / "journal.json").write_text("{}")
    assert fastpath.nothing_to_do(_argv(cat, root)) is None


def test_fastpath_declines_when_the_package_version_changed(applied):
    cat, root = applied
    meta = next(root.glob("vllm-*.dist-info")) / "METADATA"
    meta.write_text(meta.read_text().replace("0.20.0", "0.20.1"))
    assert fastpath.nothing_to_do(_argv(cat, root)) is None


def test_warm_apply_process_imports_neither_click_pydantic_nor_libcst(applied):
    """...nor the json package (the ledger is read with json's C scanner: fastpath.json_loads)."""
    cat, root = applied
    code = (
        "import sys, runpy\n"
        f"sys.argv = ['overlay'] + {json.dumps(_argv(cat, root))}\n"
        "try:\n"
        "    runpy.run_module('manager', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "heavy = sorted(m for m in ('click', 'rich', 'pydantic', 'libcst', 'yaml', 'json') if m in sys.modules)\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY=\n" in proc.stdout
    assert "nothing to do (ledger hashes match)" in proc.stderr


def test_warm_apply_on_a_bare_python_does_not_import_re(applied):
    """A bare python (an image's, no site .pth) has not imported re at start-up; the warm check
    needs no regular expression (state.package_version imports re only to read a _version.py)."""
    cat, root = applied
    code = (
        "import sys\n"
        f"sys.argv = ['overlay'] + {json.dumps(_argv(cat, root))}\n"
        "assert 're' not in sys.modules\n"
        "from manager.fastpath import main\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "print('RE=' + str('re' in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(fastpath.__file__).resolve().parent.parent)}
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "RE=False" in proc.stdout and "nothing to do (ledger hashes match)" in proc.stderr


def _entry(argv: list[str]) -> tuple[subprocess.CompletedProcess, list[str]]:
    return run_entry(argv, ("click", "rich", "manager.cli"), env={**os.environ, "OVERLAY_PLANS": "",
                                                                   "OVERLAY_PLAN_CACHE": ""})


def test_a_first_apply_without_a_plan_runs_the_engine_without_the_cli_and_says_what_the_cli_says(tmp_path, vllm_root):
    from manager import releases

    cat = shipped_catalog(tmp_path / "cat").root
    lean_root = vllm_root("0.20.0")
    proc, loaded = _entry(_argv(cat, lean_root))
    assert proc.returncode == 0, proc.stderr
    assert loaded == []  # neither click nor rich nor the CLI's modules
    cli_root = releases.copy_release("0.20.0", tmp_path / "cli")
    cli_proc = subprocess.run([sys.executable, "-c", "from manager.cli import main; main()", *_argv(cat, cli_root)],
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "OVERLAY_PLANS": "", "OVERLAY_PLAN_CACHE": ""})
    assert cli_proc.returncode == 0, cli_proc.stderr
    assert proc.stderr == cli_proc.stderr and "updated" in proc.stderr  # the CLI's lines, plain
    for t in ("vllm/model_executor/models/gemma4.py", CUDA_PY):
        assert (lean_root / t).read_bytes() == (cli_root / t).read_bytes()


def test_the_cli_less_apply_reports_errors_through_the_cli_handler(tmp_path, vllm_root):
    cat = shipped_catalog(tmp_path / "cat").root
    root = vllm_root("0.20.0")
    proc, _ = _entry(_argv(cat, root, "no-such-overlay"))
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: unknown overlay 'no-such-overlay'") and "Traceback" not in proc.stderr
    proc, _ = _entry(_argv(cat, tmp_path / "nowhere"))
    assert proc.returncode == 1 and proc.stderr.startswith("error: --root") and not (root / ".overlay-manager").exists()


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@given(_JSON_VALUES, st.sampled_from([None, 0, 2]), st.booleans(), st.sampled_from(["", " ", "\n", "\t\r\n "]))
@settings(max_examples=300, deadline=None)
def test_warm_check_json_reader_equals_json_loads(value, indent, ascii_only, ws):
    """fastpath.json_loads (the C scanner, without importing the json package) reads what
    json.loads reads, ledgers written with indent=2 included."""
    raw = (ws + json.dumps(value, indent=indent, ensure_ascii=ascii_only) + ws).encode()
    assert fastpath.json_loads(raw) == json.loads(raw)


@given(st.binary(max_size=40) | st.text(alphabet='{}[]",:0123456789.eE-+ \ntrufalsn\\u', max_size=40).map(str.encode))
@settings(max_examples=300, deadline=None)
def test_warm_check_json_reader_fails_where_json_loads_fails(raw):
    try:
        want = json.loads(raw)
    except ValueError:
        with pytest.raises(ValueError):
            fastpath.json_loads(raw)
    else:
        got = fastpath.json_loads(raw)
        assert got == want
