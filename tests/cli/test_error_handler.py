"""The single error handler of the `overlay` CLI: exit 1 user error, 3 bug + crash log, 130 Ctrl-C."""

from __future__ import annotations

from manager.errors import OverlayError
from manager.overlays import loader


def test_user_error_exits_1_with_one_line(monkeypatch, cli_run):
    def boom(catalog):
        raise OverlayError("overlays/x/overlay.yaml: id: 'X' must match ...")

    monkeypatch.setattr(loader, "load_overlays", boom)
    res = cli_run("list")
    assert res.exit_code == 1
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: overlays/x/overlay.yaml: id:")


def test_unexpected_exception_exits_3_and_writes_a_crash_log(monkeypatch, cli_run, tmp_path):
    monkeypatch.setenv("OVERLAY_CRASH_DIR", str(tmp_path))

    def bug(catalog):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(loader, "load_overlays", bug)
    res = cli_run("list")
    assert res.exit_code == 3
    logs = list(tmp_path.glob("overlay-crash-*.log"))
    assert len(logs) == 1
    text = logs[0].read_text()
    assert "ZeroDivisionError: a bug" in text and "Traceback" in text
    assert str(logs[0]) in res.stderr.replace("\n", "")


def test_ctrl_c_exits_130(monkeypatch, cli_run):
    def interrupted(catalog):
        raise KeyboardInterrupt

    monkeypatch.setattr(loader, "load_overlays", interrupted)
    res = cli_run("list")
    assert res.exit_code == 130
    assert "interrupted" in res.stderr


def test_usage_error_exits_1_not_2(cli_run):
    res = cli_run("apply", "--no-such-flag")
    assert res.exit_code == 1
    assert "no-such-flag" in res.stderr
