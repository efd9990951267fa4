"""Hostile inputs (issue 10, items 8-10 and 12): every case ends in exit 1 with one line on stderr
that names the file (or the option value) and the problem, within a time limit (no hang), and
leaves the root and the catalog byte-for-byte as they were.

The table CASES is the source of docs/reliability.md's table (`python -m tests.package.test_hostile_inputs`
prints the counts). Each case runs the real CLI (`python -m manager`, the fast path included) in a
subprocess with a timeout, so a hang is a failure, not a stuck suite. Cases that need a failing
system call root cannot provoke (EACCES, ENOSPC) run in-process with that call patched (FAULTS).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable

import pytest

from tests.helpers import REPO_ROOT
from tests.helpers.cli import overlay_process, run_cli

HANG_LIMIT_S = float(os.environ.get("OVERLAY_TEST_HANG_LIMIT", "90"))  # a case that takes longer counts as a hang

MANIFEST = """\
id: demo
title: demo overlay
summary: a small overlay for hostile-input tests
vendored_on: 2026-11-29
versions: ">=0.19"
targets: [vllm/a.py]
drop_when: never
probes:
  - target: vllm/a.py
    contains: "native_fix_marker"
sentinel_version: 1
edits:
  - kind: insert
    name: one
    scope: f
    anchor: "return y"
    position: before
    code: snippets/one.py
"""
TARGET = "def f(x):\n    y = x + 1\n    return y\n"

BILLION_LAUGHS = (
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
    )
)


@dataclass(frozen=True)
class Env:
    tmp: Path
    root: Path
    cat: Path

    @property
    def target(self) -> Path:
        return self.root / "vllm" / "a.py"

    @property
    def overlay(self) -> Path:
        return self.cat / "overlays" / "demo"

    @property
    def state(self) -> Path:
        return self.root / ".overlay-manager"


def make_env(tmp: Path) -> Env:
    root, cat = tmp / "root", tmp / "cat"
    (root / "vllm").mkdir(parents=True)
    (root / "vllm-0.20.0.dist-info").mkdir()
    (root / "vllm-0.20.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.20.0\n\n")
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm" / "a.py").write_text(TARGET)
    od = cat / "overlays" / "demo"
    (od / "snippets").mkdir(parents=True)
    (od / "overlay.yaml").write_text(MANIFEST)
    (od / "snippets" / "one.py").write_text("y = y * 2\n")
    for sub in ("profiles", "compose"):
        shutil.copytree(REPO_ROOT / sub, cat / sub, ignore=shutil.ignore_patterns("generated"))
    return Env(tmp, root, cat)


def snapshot(*dirs: Path) -> dict[str, str]:
    """Type and content hash of every entry under dirs (FIFOs and sockets are never opened)."""
    out = {}
    for d in dirs:
        for dirpath, dirnames, filenames in os.walk(d):
            dirnames.sort()
            for name in sorted(dirnames + filenames):
                p = Path(dirpath) / name
                st = p.lstat()
                if stat.S_ISREG(st.st_mode):
                    out[str(p)] = "f:" + hashlib.sha256(p.read_bytes()).hexdigest() + f":{stat.S_IMODE(st.st_mode):o}"
                elif stat.S_ISLNK(st.st_mode):
                    out[str(p)] = "l:" + os.readlink(p)
                else:
                    out[str(p)] = f"t:{stat.S_IFMT(st.st_mode):o}"
    return out


# --- setups ---------------------------------------------------------------------------------------


def _w(p: Path, data: bytes | str) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    p.write_bytes(data)


def _replace_dir(p: Path) -> None:
    p.unlink()
    p.mkdir()
    (p / "x").write_text("x")


def _fifo(p: Path) -> None:
    p.unlink()
    os.mkfifo(p)


def _manifest(env: Env, old: str, new: str) -> None:
    p = env.overlay / "overlay.yaml"
    text = p.read_text()
    assert old in text, old
    p.write_text(text.replace(old, new))


def _ledger(data) -> Callable[[Env], None]:
    def setup(env: Env) -> None:
        _w(env.state / "ledger.json", data if isinstance(data, (bytes, str)) else json.dumps(data))

    return setup


def _journal(data) -> Callable[[Env], None]:
    def setup(env: Env) -> None:
        _w(env.state / "journal.json", data if isinstance(data, (bytes, str)) else json.dumps(data))

    return setup


def _applied_then(mutate: Callable[[Env], None]) -> Callable[[Env], None]:
    """Apply the overlay for real first (so a ledger exists), then break something."""

    def setup(env: Env) -> None:
        r = _run_here(env, ["apply", "--root", str(env.root)])
        assert r.returncode == 0, r.stderr
        mutate(env)

    return setup


def _profile(env: Env, kind: str, name: str, data: bytes | str | None) -> None:
    p = env.cat / "profiles" / kind / name
    if data is None:
        p.mkdir()
    else:
        _w(p, data)


@dataclass(frozen=True)
class Case:
    id: str
    setup: Callable[[Env], None]
    argv: Callable[[Env], list[str]]
    expect: tuple[str, ...]  # substrings of the one error line (after "error: ")
    kind: str = "crash"  # what it did before issue 10: crash (exit 3) | hang | misleading | markup
    status_error: bool = False  # argv is `status --json`: expect a target with status `error`, exit 1


def ROOT(*args: str) -> Callable[[Env], list[str]]:
    return lambda env: [*args, "--root", str(env.root)]


def _latin1(env: Env) -> None:
    """latin-1 bytes without a coding declaration (with one, the file is read and written in its
    codec: tests/overlays/test_apply_revert_data_safety.py)."""
    _w(env.target, b"def f(x):\n    y = x + 1\n    s = '\xe9'\n    return y\n")


CASES: list[Case] = [
    # --- targets -------------------------------------------------------------------------------
    Case("target-latin1-status", _latin1, ROOT("status", "--json"), ("vllm/a.py", "UTF-8"), status_error=True),
    Case("target-latin1-apply", _latin1, ROOT("apply"), ("vllm/a.py", "UTF-8")),
    Case("target-binary-apply", lambda e: _w(e.target, b"\xff\xfe\x00garbage\x80"), ROOT("apply"), ("vllm/a.py",)),
    Case("target-nul-status", lambda e: _w(e.target, TARGET.replace("return y", "return\0 y")), ROOT("status", "--json"),
         ("vllm/a.py", "NUL", "line 3"), status_error=True),
    Case("target-nul-apply", lambda e: _w(e.target, TARGET.replace("return y", "return\0 y")), ROOT("apply"),
         ("vllm/a.py", "NUL", "line 3")),
    Case("target-fifo-apply", lambda e: _fifo(e.target), ROOT("apply"), ("vllm/a.py", "not a regular file"), "hang"),
    Case("target-fifo-status", lambda e: _fifo(e.target), ROOT("status", "--json"), ("vllm/a.py", "not a regular file"), "hang", status_error=True),
    Case("target-fifo-after-apply", _applied_then(lambda e: _fifo(e.target)), ROOT("apply"),
         ("vllm/a.py", "not a regular file"), "hang"),
    Case("target-directory-status", lambda e: _replace_dir(e.target), ROOT("status", "--json"),
         ("vllm/a.py", "directory"), "misleading", status_error=True),
    Case("target-directory-apply", lambda e: _replace_dir(e.target), ROOT("apply"),
         ("vllm/a.py", "directory"), "misleading"),
    # --- snippets, manifests --------------------------------------------------------------------
    Case("snippet-not-utf8", lambda e: _w(e.overlay / "snippets" / "one.py", b"y = '\xff'\n"), ROOT("apply"),
         ("snippets/one.py", "UTF-8")),
    Case("snippet-does-not-parse-status", lambda e: _w(e.overlay / "snippets" / "one.py", "y = = 2\n"),
         ROOT("status", "--json"), ("snippets/one.py", "parse"), "misleading", status_error=True),
    Case("snippet-is-directory", lambda e: (e.overlay / "snippets" / "one.py").unlink()
         or (e.overlay / "snippets" / "one.py").mkdir(), ROOT("apply"), ("snippets/one.py",)),
    Case("manifest-not-utf8", lambda e: _w(e.overlay / "overlay.yaml", MANIFEST.replace("demo overlay", "d\xe9mo").encode("latin-1")),
         lambda e: ["list"], ("overlay.yaml", "UTF-8")),
    Case("manifest-is-directory", lambda e: _replace_dir(e.overlay / "overlay.yaml"), lambda e: ["list"],
         ("overlay.yaml", "directory")),
    Case("manifest-bad-date", lambda e: _manifest(e, "2026-11-29", "2026-02-30"), lambda e: ["list"],
         ("overlay.yaml", "2026-02-30")),
    Case("manifest-billion-laughs", lambda e: _w(e.overlay / "overlay.yaml", MANIFEST + "notes:\n  " + BILLION_LAUGHS.replace("\n", "\n  ")),
         lambda e: ["list"], ("overlay.yaml", "alias"), "hang"),
    Case("manifest-alias", lambda e: _manifest(e, "title: demo overlay", "title: &t demo overlay\nsummary2: *t"),
         lambda e: ["list"], ("overlay.yaml", "alias")),
    Case("probe-catastrophic-regex", lambda e: (_manifest(e, '"native_fix_marker"', "'^(a+)+$'"),
                                               _w(e.target, TARGET + 's = """\n' + "a" * 30 + '!\n"""\n')),
         ROOT("status", "--json"), ("vllm/a.py", "(a+)+"), "hang", status_error=True),
    # --- state: ledger, journal, lock, originals ------------------------------------------------------
    Case("ledger-is-a-list", _ledger([]), ROOT("apply"), ("ledger.json",)),
    Case("ledger-files-is-a-list", _ledger({"files": []}), ROOT("apply"), ("ledger.json", "files")),
    Case("ledger-entry-missing-keys", _ledger({"files": {"vllm/a.py": {}}}), ROOT("revert"), ("ledger.json", "vllm/a.py")),
    Case("ledger-entry-not-a-mapping", _ledger({"files": {"vllm/a.py": 7}}), ROOT("apply"), ("ledger.json", "vllm/a.py")),
    Case("ledger-overlays-is-a-list", _ledger({"files": {}, "overlays": []}), ROOT("apply"), ("ledger.json", "overlays")),
    Case("ledger-observed-is-a-number", _ledger({"files": {}, "observed": 5}), ROOT("apply"), ("ledger.json", "observed")),
    Case("ledger-not-utf8", _ledger(b'{"files": {"\xff": 1}}'), ROOT("apply"), ("ledger.json",)),
    Case("ledger-is-directory", lambda e: (e.state / "ledger.json").mkdir(parents=True), ROOT("apply"), ("ledger.json",)),
    Case("journal-is-a-list", _journal([1, 2]), ROOT("apply"), ("journal.json",)),
    Case("journal-entry-missing-keys", _journal({"vllm/a.py": {"pre_sha256": "x"}}), ROOT("apply"), ("journal.json", "vllm/a.py")),
    Case("journal-is-directory", lambda e: (e.state / "journal.json").mkdir(parents=True), ROOT("apply"), ("journal.json",)),
    Case("lock-is-directory", lambda e: (e.state / "lock").mkdir(parents=True), ROOT("apply"), ("lock",)),
    Case("state-dir-is-a-file", lambda e: _w(e.state, "x"), ROOT("apply"), (".overlay-manager",)),
    Case("originals-is-a-file", lambda e: _w(e.state / "originals", "x"), ROOT("apply"), ("originals",)),
    # --- profiles, compose ----------------------------------------------------------------------
    Case("profile-not-utf8", lambda e: _profile(e, "hardware", "bad.yaml", b"id: bad\nname: \xff\n"),
         lambda e: ["profiles", "validate"], ("bad.yaml", "UTF-8")),
    Case("profile-billion-laughs", lambda e: _profile(e, "hardware", "bad.yaml", BILLION_LAUGHS),
         lambda e: ["profiles", "validate"], ("bad.yaml", "alias"), "hang"),
    Case("profile-is-directory", lambda e: _profile(e, "hardware", "bad.yaml", None),
         lambda e: ["profiles", "validate"], ("bad.yaml",)),
    Case("registry-not-utf8", lambda e: _w(e.cat / "compose" / "deployments.yaml", b"deployments: {\xff: 1}\n"),
         lambda e: ["compose", "list"], ("deployments.yaml", "UTF-8")),
    Case("registry-billion-laughs", lambda e: _w(e.cat / "compose" / "deployments.yaml", BILLION_LAUGHS),
         lambda e: ["compose", "list"], ("deployments.yaml", "alias"), "hang"),
    Case("render-to-proc", lambda e: None,
         lambda e: ["compose", "render", "gemma4-26b-a4b-awq-3090-tp1", "-o", "/proc/version"], ("/proc/version",)),
    Case("render-into-missing-dir", lambda e: None,
         lambda e: ["compose", "render", "gemma4-26b-a4b-awq-3090-tp1", "-o", str(e.tmp / "nonexistent" / "dir" / "x.yml")],
         ("nonexistent/dir", "does not exist"), "misleading"),
    # --- rich markup in user text ---------------------------------------------------------------
    Case("markup-overlay-id", lambda e: None, lambda e: ["apply", "[/x]", "--root", str(e.root)], ("[/x]",), "markup"),
    Case("markup-root", lambda e: None, lambda e: ["status", "--root", str(e.tmp / "dir" / "[/x]")], ("[/x]",), "markup"),
    Case("markup-root-eaten", lambda e: None, lambda e: ["status", "--root", str(e.tmp / "dir" / "[bold]z")],
         ("dir/[bold]z",), "markup"),
    Case("markup-model", lambda e: None, lambda e: ["fits", "--model", "[/x]", "--hardware", "rtx-3090"], ("[/x]",), "markup"),
    Case("markup-slug", lambda e: None, lambda e: ["compose", "render", "[/x]"], ("[/x]",), "markup"),
    Case("markup-catalog", lambda e: None, lambda e: ["--catalog", str(e.tmp / "dir" / "[/c]"), "list"], ("[/c]",), "markup"),
]


def _full_argv(env: Env, argv: list[str]) -> list[str]:
    return argv if argv[:1] == ["--catalog"] else ["--catalog", str(env.cat), *argv]


def _run(env: Env, argv: list[str], timeout: float = HANG_LIMIT_S) -> subprocess.CompletedProcess:
    """The real `overlay` entry point (fast path included) in a fresh process."""
    return overlay_process(*_full_argv(env, argv), env={"OVERLAY_CRASH_DIR": str(env.tmp / "crash")}, timeout=timeout)


def _run_here(env: Env, argv: list[str]) -> subprocess.CompletedProcess:
    """The CLI's main() in this process (a subprocess per case costs ~1-15 s on a loaded machine)."""
    try:
        res = run_cli(*_full_argv(env, argv), env={"OVERLAY_CRASH_DIR": str(env.tmp / "crash")})
    except BaseException as exc:  # noqa: BLE001 - escaped the CLI's handler: a crash
        return subprocess.CompletedProcess(argv, 3, "", f"Traceback: {exc!r}")
    return subprocess.CompletedProcess(argv, res.exit_code, res.stdout, res.stderr)


def check_case(case: Case, tmp: Path) -> tuple[str, str]:
    """(outcome, detail): outcome is handled | crash | hang | wrong. Cases that hung before
    issue 10 run in a subprocess with a time limit; the others in-process."""
    env = make_env(tmp)
    case.setup(env)
    before = snapshot(env.root, env.cat)
    t0 = time.monotonic()
    if case.kind == "hang":
        try:
            r = _run(env, case.argv(env))
        except subprocess.TimeoutExpired:
            return "hang", f"no answer in {HANG_LIMIT_S:.0f} s"
    else:
        r = _run_here(env, case.argv(env))
    took = time.monotonic() - t0
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    if r.returncode == 3 or "Traceback" in r.stderr:
        return "crash", r.stderr[-600:]
    if r.returncode != 1:
        return "wrong", f"exit {r.returncode}: {r.stderr[-400:]}"
    if case.status_error:  # `status --json`: the target's status is `error`, the detail says why
        rows = [(o["id"], t["status"], t["detail"]) for o in json.loads(r.stdout)["overlays"] for t in o["targets"]]
        bad = [d for _, st, d in rows if st == "error" and all(x in d for x in case.expect)]
        if not bad:
            return "wrong", f"no target with status error naming {case.expect!r}: {rows!r}"
        if snapshot(env.root, env.cat) != before:
            return "wrong", "changed on disk"
        return "handled", f"{took:.1f} s: status error: {bad[0]}"
    errs = [ln for ln in lines if ln.startswith("error: ")]
    if len(errs) != 1:
        return "wrong", f"expected one 'error:' line, got {lines!r}"
    missing = [s for s in case.expect if s not in errs[0]]
    if missing:
        return "wrong", f"{missing!r} not in {errs[0]!r}"
    after = snapshot(env.root, env.cat)
    if after != before:
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        return "wrong", f"changed on disk: {changed}"
    return "handled", f"{took:.1f} s: {errs[0]}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_exits_1_with_one_line_and_changes_nothing(case, tmp_path):
    outcome, detail = check_case(case, tmp_path)
    assert outcome == "handled", detail


# --- faults root cannot provoke with chmod (CI runs as root): patched system calls, in-process ---------


def _fault_env(tmp_path: Path, monkeypatch) -> Env:
    env = make_env(tmp_path)
    monkeypatch.setenv("OVERLAY_CRASH_DIR", str(tmp_path / "crash"))
    return env


def _run_in_process(env: Env, argv: list[str]) -> tuple[int, list[str]]:
    res = run_cli("--catalog", str(env.cat), *argv)
    return res.exit_code, res.err_lines


def _deny_read(monkeypatch, path: Path, err: int) -> None:
    real_open = os.open

    def fake_open(p, flags, *a, **k):
        if os.fspath(p) == os.fspath(path):
            raise OSError(err, os.strerror(err), os.fspath(p))
        return real_open(p, flags, *a, **k)

    monkeypatch.setattr(os, "open", fake_open)
    import builtins
    import io

    real_io_open = io.open

    def fake_io_open(p, *a, **k):
        if not isinstance(p, int) and os.fspath(p) == os.fspath(path):
            raise OSError(err, os.strerror(err), os.fspath(p))
        return real_io_open(p, *a, **k)

    monkeypatch.setattr(builtins, "open", fake_io_open)
    monkeypatch.setattr(io, "open", fake_io_open)


FAULTS = {
    "target-unreadable": ("vllm/a.py", "Permission denied"),
    "originals-full-disk": ("originals", "No space left"),
    "originals-read-only": ("originals", "Read-only file system"),
}


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_system_call_faults_exit_1_with_one_line(name, tmp_path, monkeypatch):
    env = _fault_env(tmp_path, monkeypatch)
    before = snapshot(env.root, env.cat)
    if name == "target-unreadable":
        _deny_read(monkeypatch, env.target, errno.EACCES)
    else:
        import tempfile

        real_mkstemp = tempfile.mkstemp
        code = errno.ENOSPC if name == "originals-full-disk" else errno.EROFS

        def mkstemp(*a, dir=None, **k):
            if dir is not None and Path(dir).name == "originals":
                raise OSError(code, os.strerror(code), str(dir))
            return real_mkstemp(*a, dir=dir, **k)

        monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    rc, err = _run_in_process(env, ["apply", "--root", str(env.root)])
    monkeypatch.undo()
    assert rc == 1, err
    assert len(err) == 1 and err[0].startswith("error: "), err
    want_path, want_problem = FAULTS[name]
    assert want_path in err[0] and want_problem in err[0], err
    assert snapshot(env.root, env.cat) == before


if __name__ == "__main__":  # the counts for docs/reliability.md
    import tempfile

    counts: dict[str, dict[str, int]] = {}
    only = sys.argv[1:]
    for case in CASES:
        if only and not any(o in case.id for o in only):
            continue
        with tempfile.TemporaryDirectory() as d:
            try:
                outcome, detail = check_case(case, Path(d))
            except Exception as exc:  # noqa: BLE001 - a broken setup is reported, the count goes on
                outcome, detail = "wrong", f"setup: {exc!r}"[:300]
        row = counts.setdefault(case.kind, {"tried": 0, "handled": 0, "crash": 0, "hang": 0, "wrong": 0})
        row["tried"] += 1
        row[outcome] += 1
        print(f"{case.id:<32} {outcome:<8} {detail.splitlines()[0] if detail else ''}"[:220], flush=True)
    print(json.dumps(counts, indent=1))


# --- a held lock: who holds it, a visible wait, a --wait limit (item 10) -------------------------------

_HOLDER = """
import sys, time
from pathlib import Path
from manager.overlays.lock import root_lock
with root_lock(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _hold_lock(env: Env, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(env.state), str(seconds)], stdout=subprocess.PIPE,
                            text=True, cwd=REPO_ROOT)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_held_lock_names_its_holder_and_gives_up_after_wait(tmp_path):
    env = make_env(tmp_path)
    holder = _hold_lock(env, 60)
    try:
        before = snapshot(env.root, env.cat)
        t0 = time.monotonic()
        rc, err = _run_in_process(env, ["apply", "--root", str(env.root), "--wait", "0.5"])
        took = time.monotonic() - t0
    finally:
        holder.kill()
        holder.wait()
    assert rc == 1, err
    waiting = [ln for ln in err if "waiting" in ln]
    assert len(waiting) == 1 and f"pid {holder.pid}" in waiting[0] and "--wait" in waiting[0], err
    assert err[-1].startswith("error: ") and f"pid {holder.pid}" in err[-1] and "gave up after 0.5 s" in err[-1], err
    assert took < 30, took
    after = snapshot(env.root, env.cat)
    assert {k: v for k, v in after.items() if not k.endswith("lock")} == {k: v for k, v in before.items() if not k.endswith("lock")}


def test_apply_waits_for_a_lock_released_within_wait(tmp_path):
    env = make_env(tmp_path)
    holder = _hold_lock(env, 1.0)
    try:
        rc, err = _run_in_process(env, ["apply", "--root", str(env.root), "--wait", "120"])
    finally:
        holder.wait()
    assert rc == 0, err
    assert any("waiting" in ln and f"pid {holder.pid}" in ln for ln in err), err
    assert "overlay:demo v1" in env.target.read_text()


def test_lock_of_a_killed_holder_does_not_block(tmp_path):
    env = make_env(tmp_path)
    holder = _hold_lock(env, 60)
    holder.kill()  # kill -9: the kernel drops the flock, the owner record stays in the file
    holder.wait()
    assert str(holder.pid) in (env.state / "lock").read_text()
    rc, err = _run_in_process(env, ["apply", "--root", str(env.root), "--wait", "0"])
    assert rc == 0, err
    assert not any("waiting" in ln for ln in err), err


# --- probe patterns are bounded in any thread (item 10) ---------------------------------------------


def test_catastrophic_probe_pattern_is_bounded_outside_the_main_thread_too():
    import threading

    from manager.overlays.bounded import ProbeTimeout, search

    box: dict[str, object] = {}

    def run() -> None:
        t0 = time.monotonic()
        try:
            search(r"^(a+)+$", "a" * 40 + "!", "vllm/x.py", budget=1.0)
            box["result"] = "matched"
        except ProbeTimeout as exc:
            box["result"] = str(exc)
        box["took"] = time.monotonic() - t0

    t = threading.Thread(target=run)
    t.start()
    t.join(60)
    assert not t.is_alive()
    assert "vllm/x.py" in str(box["result"]) and "(a+)+" in str(box["result"]), box
    assert box["took"] < 30


def test_literal_and_simple_probe_patterns_keep_their_meaning():
    from manager.overlays.bounded import is_literal, search

    assert is_literal("is_heterogeneous") and search("is_heterogeneous", "x = 1\nif cfg.is_heterogeneous:\n", "f")
    assert not search("_packed", "x = 1\n", "f")
    assert search(r"^def \w+_packed\(", "x = 1\ndef load_packed(a):\n", "f")
    assert not search(r"^def \w+_packed\(", "x = 1\n    def load_packed(a):\n", "f")


# --- upstream check: an unreachable API is said once and fails fast (item 12) -------------------------


def test_unreachable_api_url_fails_fast_with_fail_on_unknown(tmp_path, monkeypatch):
    from manager.upstream import probe

    env = _fault_env(tmp_path, monkeypatch)
    probed = []
    monkeypatch.setattr(probe.CatalogProber, "__call__", lambda self, *a, **k: probed.append(a) or None)
    shutil.copytree(REPO_ROOT / "overlays", env.cat / "overlays", dirs_exist_ok=True)
    shutil.rmtree(env.overlay)
    rc, err = _run_in_process(env, ["upstream", "check", "--api-url", "http://127.0.0.1:9/", "--cache",
                                    str(tmp_path / "gh"), "--fail-on", "unknown"])
    assert rc == 1, err
    assert len(err) == 1 and err[0].startswith("error: ") and "127.0.0.1:9" in err[0] and "unreachable" in err[0], err
    assert probed == []  # stopped before the source probes


def test_unreachable_api_url_is_said_once_without_fail_on(tmp_path, monkeypatch):
    env = _fault_env(tmp_path, monkeypatch)
    shutil.copytree(REPO_ROOT / "overlays", env.cat / "overlays", dirs_exist_ok=True)
    shutil.rmtree(env.overlay)
    rc, err = _run_in_process(env, ["upstream", "check", "--api-url", "http://127.0.0.1:9/", "--cache",
                                    str(tmp_path / "gh"), "--no-probe"])
    assert rc == 0, err
    warnings = [ln for ln in err if ln.startswith("warning:")]
    assert len(warnings) == 1 and "127.0.0.1:9" in warnings[0] and "unreachable" in warnings[0], err


# --- rich markup in catalog text shown in tables (item 8) ---------------------------------------------


def test_markup_in_catalog_text_is_shown_literally(tmp_path, monkeypatch, cli_run):
    """Catalog text in the list and status tables (data: stdout) is shown as typed, never parsed as markup."""
    env = _fault_env(tmp_path, monkeypatch)

    def table(argv: list[str]) -> tuple[int, str]:
        res = cli_run("--catalog", str(env.cat), *argv)
        return res.exit_code, res.output.replace(" ", "").replace("│", "")

    _manifest(env, "title: demo overlay", "title: 'a [/x] title [bold]kept[/bold]'")
    rc, text = table(["list"])
    assert rc == 0, text
    assert "a[/x]title[bold]kept[/bold]" in text, text
    _manifest(env, 'anchor: "return y"', 'anchor: "return [y][/x]"')  # drift: the detail quotes the anchor
    rc, text = table(["status", "--root", str(env.root)])
    assert rc == 1, text
    assert "return[y][/x]" in text, text
