"""The vLLM sdist download reports progress (issue 12, point 7): bytes against PyPI's size, the
sha256 PyPI lists checked, cache hits said; the CLI's reporter draws a bar on a TTY and one line
per step otherwise. Served from a local HTTP server shaped like PyPI's simple index (PEP 691)."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import random
import tarfile
import threading
from pathlib import Path

import pytest

from manager import releases
from manager.cli.progress import DownloadProgress
from manager.errors import ReleaseError

VERSION = "9.9.9"


def _sdist_bytes() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        # incompressible bytes: the archive spans several read chunks
        files = {"vllm/blob.bin": random.Random(0).randbytes(300_000), "vllm/_version.py": f"__version__ = '{VERSION}'\n".encode()}
        for rel, data in files.items():
            info = tarfile.TarInfo(f"vllm-{VERSION}/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def pypi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A local index: returns a dict whose 'sha256' the test may corrupt before the first request."""
    body = _sdist_bytes()
    state = {"sha256": hashlib.sha256(body).hexdigest(), "size": len(body), "hits": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/simple/vllm/":
                payload = json.dumps({"files": [{"filename": f"vllm-{VERSION}.tar.gz", "url": f"/files/vllm-{VERSION}.tar.gz",
                                                 "hashes": {"sha256": state["sha256"]}, "size": state["size"]}]}).encode()
                ctype = "application/vnd.pypi.simple.v1+json"
            elif self.path == f"/files/vllm-{VERSION}.tar.gz":
                state["hits"] += 1
                payload, ctype = body, "application/octet-stream"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(releases, "PYPI_SIMPLE", f"http://127.0.0.1:{server.server_port}/simple/{{name}}/")
    monkeypatch.setenv(releases.ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.delenv("http_proxy", raising=False)
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    yield state
    server.shutdown()
    releases.set_progress(None)


def test_download_reports_bytes_checks_sha256_and_a_cache_hit_says_so(pypi) -> None:
    steps: list[releases.Step] = []
    releases.set_progress(steps.append)
    path = releases.sdist(VERSION)
    events = [s.event for s in steps]
    assert events[0] == "start" and events[-1] == "done" and "advance" in events
    advances = [s for s in steps if s.event == "advance"]
    assert len(advances) >= 2 and advances[-1].done == pypi["size"] and advances[-1].total == pypi["size"]
    assert [a.done for a in advances] == sorted(a.done for a in advances)
    assert "sha256" in steps[-1].detail and path.read_bytes() and pypi["hits"] == 1
    steps.clear()
    assert releases.sdist(VERSION) == path and pypi["hits"] == 1
    assert [s.event for s in steps] == ["cached"] and steps[0].detail == str(path)


def test_a_wrong_sha256_keeps_nothing(pypi) -> None:
    pypi["sha256"] = "0" * 64
    with pytest.raises(ReleaseError, match="sha256"):
        releases.sdist(VERSION)
    assert [p.name for p in (Path(releases.cache_dir()) / "sdists").iterdir()] == [f"vllm-{VERSION}.tar.gz.lock"]


def test_pristine_tree_extracts_then_says_cached(pypi) -> None:
    steps: list[releases.Step] = []
    releases.set_progress(steps.append)
    root = releases.pristine_tree(VERSION)
    assert (root / "vllm" / "_version.py").is_file() and "extract" in [s.event for s in steps]
    steps.clear()
    releases.pristine_tree(VERSION)
    assert [s.event for s in steps] == ["cached"]


def test_cli_reporter_without_a_tty_prints_one_line_per_step(pypi, capsys) -> None:
    releases.set_progress(DownloadProgress(tty=False))
    releases.sdist(VERSION)
    releases.sdist(VERSION)
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert cap.out == ""
    assert len(lines) == 3, lines  # start, done, cache hit: no per-chunk lines
    assert lines[0].split()[0] == "download" and "MB" in lines[0]
    assert lines[1].split()[0] == "downloaded" and "MB/s" in lines[1] and "ok" in lines[1]
    assert lines[2].split()[0] == "cached" and "no download" in lines[2]


def test_cli_reporter_on_a_tty_draws_a_bar_and_ends_with_the_summary(pypi, capsys) -> None:
    reporter = DownloadProgress(tty=True)
    seen: list[object] = []

    def spy(step: releases.Step) -> None:
        reporter(step)
        if step.event == "advance":
            seen.append(reporter._bar)

    releases.set_progress(spy)
    releases.sdist(VERSION)
    assert seen and all(b is not None for b in seen) and reporter._bar is None
    assert "downloaded" in capsys.readouterr().err


def _tree_state(top: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(top)): (p.read_bytes() if p.is_file() else None) for p in sorted(top.rglob("*"))}


@pytest.mark.parametrize("under", ["", "sub/dir"], ids=["the-file", "a-path-under-it"])
def test_a_cache_set_to_a_regular_file_is_one_release_error_naming_the_variable_and_path(tmp_path, monkeypatch, under):
    blocker = tmp_path / "cache-file"
    blocker.write_text("not a directory\n")
    raw = str(blocker / under) if under else str(blocker)
    monkeypatch.setenv(releases.ENV_CACHE, raw)
    before = _tree_state(tmp_path)
    with pytest.raises(ReleaseError) as info:
        releases.cache_dir()
    assert releases.ENV_CACHE in str(info.value) and raw in str(info.value) and "\n" not in str(info.value)
    assert _tree_state(tmp_path) == before


@pytest.mark.parametrize("args", [("upstream", "check"), ("demo",)], ids=["upstream-check", "demo-sdist-download"])
def test_cli_with_the_cache_a_regular_file_exits_1_in_one_line_and_writes_nothing(tmp_path, cli_run, args):
    blocker = tmp_path / "cache-file"
    blocker.write_text("not a directory\n")
    before = _tree_state(tmp_path)
    r = cli_run(*args, env={releases.ENV_CACHE: str(blocker)})
    assert r.exit_code == 1, r.stdout + r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and releases.ENV_CACHE in errors[0] and str(blocker) in errors[0], r.stderr
    assert _tree_state(tmp_path) == before


def test_a_regular_file_in_place_of_the_sdists_directory_is_one_release_error(tmp_path, monkeypatch):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "sdists").write_text("x")
    monkeypatch.setenv(releases.ENV_CACHE, str(tmp_path / "cache"))
    with pytest.raises(ReleaseError, match="sdists"):
        releases.sdist(VERSION)
