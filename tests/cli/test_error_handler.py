"""The single error handler of the `overlay` CLI: exit 1 user error, 3 bug + crash log, 130 Ctrl-C."""

from __future__ import annotations

import pytest

from manager.cli import main
from manager.errors import OverlayError
from manager.overlays import loader


def _run(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return exc.value.code


def test_user_error_exits_1_with_one_line(monkeypatch, capsys):
    def boom(catalog):
        raise OverlayError("overlays/x/overlay.yaml: id: 'X' must match ...")

    monkeypatch.setattr(loader, "load_overlays", boom)
    assert _run(["list"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: overlays/x/overlay.yaml: id:")


def test_unexpected_exception_exits_3_and_writes_a_crash_log(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("OVERLAY_CRASH_DIR", str(tmp_path))

    def bug(catalog):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(loader, "load_overlays", bug)
    assert _run(["list"]) == 3
    logs = list(tmp_path.glob("overlay-crash-*.log"))
    assert len(logs) == 1
    text = logs[0].read_text()
    assert "ZeroDivisionError: a bug" in text and "Traceback" in text
    assert str(logs[0]) in capsys.readouterr().err.replace("\n", "")


def test_ctrl_c_exits_130(monkeypatch, capsys):
    def interrupted(catalog):
        raise KeyboardInterrupt

    monkeypatch.setattr(loader, "load_overlays", interrupted)
    assert _run(["list"]) == 130
    assert "interrupted" in capsys.readouterr().err


def test_usage_error_exits_1_not_2(capsys):
    assert _run(["apply", "--no-such-flag"]) == 1
    assert "no-such-flag" in capsys.readouterr().err
