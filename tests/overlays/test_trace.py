"""OVERLAY_TRACE=1 runtime marker: guard placement, once-per-process logging, determinism, reading logs back."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from manager.errors import OverlayError
from manager.overlays.trace import add_guards, read_trace, read_trace_file

SNIPPET_DEF = '''\
def helper(x):
    """Doc."""
    return x + 1
'''
SNIPPET_IFS = '''\
# a comment above
if x == 1:
    y = "one"
if x == 2:
    y = "two"
'''
SNIPPET_CALL = "helper(3)\n"


def _run(code: str, trace: str | None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("OVERLAY_TRACE", None)
    if trace is not None:
        env["OVERLAY_TRACE"] = trace
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)


def test_guard_goes_after_the_docstring_of_a_def():
    out = add_guards(SNIPPET_DEF, "ov", 2, "ed")
    lines = out.splitlines()
    assert lines[1].strip() == '"""Doc."""'
    assert lines[2].strip().startswith('if __import__("os").environ.get("OVERLAY_TRACE") == "1"')
    assert lines[-1].strip() == "return x + 1"


def test_guard_goes_inside_each_if_branch_and_keeps_comments_first():
    out = add_guards(SNIPPET_IFS, "ov", 2, "ed")
    assert out.startswith("# a comment above\nif x == 1:\n    if __import__")
    assert out.count("overlay-trace: ov v2 ed") == 2


def test_guard_goes_before_plain_statements():
    out = add_guards(SNIPPET_CALL, "ov", 2, "ed")
    assert out.startswith("if __import__") and out.rstrip().endswith("helper(3)")


def test_guards_are_deterministic_and_do_not_depend_on_the_environment(monkeypatch):
    a = add_guards(SNIPPET_IFS, "ov", 2, "ed")
    monkeypatch.setenv("OVERLAY_TRACE", "1")
    assert add_guards(SNIPPET_IFS, "ov", 2, "ed") == a


def _program(snippet: str) -> str:
    return "helper = lambda v: v\n" + "for x in (1, 2, 1, 2):\n" + textwrap.indent(
        add_guards(snippet, "my-overlay", 3, "branches"), "    ")


def test_traced_block_logs_once_per_process_when_enabled():
    proc = _run(_program(SNIPPET_IFS), "1")
    lines = read_trace(proc.stderr)
    assert len(lines) == 1, proc.stderr
    ln = lines[0]
    assert (ln.overlay, ln.version, ln.edit, ln.module) == ("my-overlay", 3, "branches", "__main__")
    assert ln.pid > 0


def test_traced_block_is_silent_without_the_variable_or_with_another_value():
    assert _run(_program(SNIPPET_IFS), None).stderr == ""
    assert _run(_program(SNIPPET_IFS), "0").stderr == ""


def test_branch_not_taken_logs_nothing():
    code = "x = 3\n" + add_guards(SNIPPET_IFS, "ov", 1, "ed")
    assert _run(code, "1").stderr == ""


def test_read_trace_ignores_log_prefixes_and_other_lines():
    log = ("INFO 11-30 [core.py:1] loading\n"
           "(EngineCore_DP0 pid=77) overlay-trace: gemma4-convertor-per-layer v2 head-size-compat pid=77 "
           "module=vllm.transformers_utils.model_arch_config_convertor\n"
           "overlay-trace: broken line\n")
    (ln,) = read_trace(log)
    assert ln.overlay == "gemma4-convertor-per-layer" and ln.pid == 77 and ln.edit == "head-size-compat"


def test_read_trace_file_reports_missing_expected_overlays(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("overlay-trace: a v1 e pid=1 module=m\n")
    s = read_trace_file(str(log), ("a", "b"))
    assert s.overlays == ("a",) and s.missing == ("b",)
    with pytest.raises(OverlayError, match="cannot read the log"):
        read_trace_file(str(tmp_path / "absent.log"))


def test_cli_trace_prints_lines_and_exits_1_on_missing_expectation(tmp_path, cli_run):
    # --expect names catalog overlays (an unknown id is a usage error: tests/cli/test_newcomer_defects.py)
    log = tmp_path / "server.log"
    log.write_text("x overlay-trace: dynamo-dict-caches v3 e pid=5 module=m\n")
    ok = cli_run("trace", str(log), "--expect", "dynamo-dict-caches")
    assert ok.exit_code == 0 and "dynamo-dict-caches v3 e pid=5 module=m" in ok.stdout
    bad = cli_run("trace", str(log), "--expect", "gemma4-unified-port", "--json")
    assert bad.exit_code == 1 and '"missing": [\n    "gemma4-unified-port"\n  ]' in bad.stdout
