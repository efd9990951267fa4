"""import-config on hostile config.json files: one line naming the file, exit 1, nothing written."""

from __future__ import annotations

import pytest

from manager.errors import ProfileError
from manager.profiles import import_config

DEEP = "[" * 100_000 + "]" * 100_000
HUGE_INT = '{"hidden_size": ' + "7" * 5000 + "}"


@pytest.mark.parametrize("text, problem", [(DEEP, "nested too deeply"), (HUGE_INT, "unreadable JSON")],
                         ids=["nested-100000-deep", "5000-digit-integer"])
def test_a_hostile_config_json_is_one_profile_error_naming_the_file(tmp_path, text, problem):
    src = tmp_path / "config.json"
    src.write_text(text)
    with pytest.raises(ProfileError, match=problem) as info:
        import_config(src)
    assert str(src) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("text", [DEEP, HUGE_INT], ids=["nested-100000-deep", "5000-digit-integer"])
def test_cli_import_config_of_a_hostile_file_exits_1_in_one_line_and_writes_nothing(tmp_path, cli_run, text):
    src = tmp_path / "config.json"
    src.write_text(text)
    out = tmp_path / "out" / "mine.yaml"
    r = cli_run("profiles", "import-config", str(src), "--id", "mine", "-o", str(out))
    assert r.exit_code == 1, r.output
    errors = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "config.json" in errors[0], r.output
    assert "Traceback" not in r.output
    assert not (tmp_path / "out").exists()
