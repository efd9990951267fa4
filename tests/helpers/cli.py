"""The `overlay` CLI as the tests run it.

- `run_cli(*args, env=None)`: the one in-process runner (test functions take it as the `cli_run`
  fixture, tests/conftest.py): `manager.cli.main` with its error handler, as the console script
  runs it when the fast path declines (exit 1 + one `error:` line for a user error, 3 + a crash log
  for a bug, 130 for Ctrl-C), stdout and stderr captured -> CliResult(exit_code, stdout, stderr).
- `overlay_process(*args)` / `overlay_popen(*args)`: `python -m manager ARGS` in a fresh process
  (the fast path, signals, hangs, concurrency), run or started.
- `run_entry(argv, watch)`: the console script's entry (`manager.fastpath.main`) as a process, and
  which of the `watch` modules it loaded.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from typing import NamedTuple
from collections.abc import Iterable, Mapping

from . import REPO_ROOT


class CliResult(NamedTuple):
    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        """Both streams (data on stdout, talk on stderr), for "it was said" checks and failure messages."""
        return self.stdout + self.stderr

    @property
    def err_lines(self) -> list[str]:
        """The non-blank lines on stderr."""
        return [ln for ln in self.stderr.splitlines() if ln.strip()]


def run_cli(*args: str, env: Mapping[str, str] | None = None) -> CliResult:
    """`overlay ARGS` in this process -> CliResult; `env` is added to os.environ for the call only."""
    from manager.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    code: int | str | None = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(list(args))
    except SystemExit as exc:
        code = exc.code
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return CliResult(code if isinstance(code, int) else 1 if code else 0, out.getvalue(), err.getvalue())


def _module(env: Mapping[str, str] | None) -> str:
    """`python -m` target: the CLI, or with OVERLAY_TEST_WRITE_DELAY set, the CLI behind the write-delay seam."""
    return "testing.faults" if env and "OVERLAY_TEST_WRITE_DELAY" in env else "manager"


def overlay_process(*args: str, env: Mapping[str, str] | None = None, timeout: float | None = 120,
                    inherit_env: bool = True) -> subprocess.CompletedProcess:
    """Run `python -m manager ARGS` (the `overlay` CLI) in a fresh process from the repository root.
    `env` is added to this process's environment (or, `inherit_env=False`, is all of it)."""
    full_env = dict(os.environ) if inherit_env else {}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", _module(env), *args],
        capture_output=True, text=True, env=full_env, timeout=timeout, cwd=REPO_ROOT,
    )


def overlay_popen(*args: str, env: Mapping[str, str] | None = None) -> subprocess.Popen:
    """Start `python -m manager ARGS` (stdout and stderr pipes); `env` is added to this process's environment."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.Popen(
        [sys.executable, "-m", _module(env), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env, cwd=REPO_ROOT,
    )


def run_entry(argv: list[str], watch: Iterable[str], env: Mapping[str, str] | None = None,
              timeout: float = 300) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`overlay ARGV` through the console script's entry (`manager.fastpath.main`) as a process,
    stderr a pipe (not a terminal); returns (the process, which of the `watch` modules it loaded)."""
    code = (
        "import sys\n"
        f"sys.argv = ['overlay'] + {list(argv)!r}\n"
        "from manager.fastpath import main\n"
        "try:\n"
        "    main()\n"
        "finally:\n"
        f"    print('LOADED=' + ','.join(sorted(m for m in {tuple(watch)!r} if m in sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env=dict(env) if env is not None else None, cwd=REPO_ROOT)
    loaded = next((line[7:] for line in proc.stdout.splitlines() if line.startswith("LOADED=")), None)
    return proc, [] if not loaded else loaded.split(",")
