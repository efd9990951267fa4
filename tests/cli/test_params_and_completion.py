"""Input validation at the edge (catalog choices with "did you mean", positive ints) and shell
completion of commands and values (issue 12, points 5 and 6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT
from tests.helpers.cli import overlay_process, run_cli

FITS = ["fits", "--model", "gemma-4-26b-a4b", "--hardware", "rtx-3090"]


def _run(argv: list[str]) -> tuple[int, str, list[str]]:
    res = run_cli("--catalog", str(REPO_ROOT), *argv)
    return res.exit_code, res.stdout, res.stderr.strip().splitlines()


@pytest.mark.parametrize(
    "argv, expect",
    [
        (["fits", "--model", "gemma-4-26b", "--hardware", "rtx-3090"], "did you mean 'gemma-4-26b-a4b'?"),
        (["fits", "--model", "gemma-4-26b-a4b", "--hardware", "rtx3090"], "did you mean 'rtx-3090'?"),
        ([*FITS, "--engine", "vllm-0.20"], "did you mean 'vllm-0.20.0'?"),
        ([*FITS, "--kv-dtype", "fp9"], "did you mean 'fp8'?"),
        ([*FITS, "--weights", "awk"], "did you mean 'awq'?"),
        (["plan", "--model", "gemma-4-26b-a4b", "--hardware", "v100"], "did you mean 'v100-"),
        (["compose", "render", "gemma4-26b-a4b-awq-3090"], "did you mean 'gemma4-26b-a4b-awq-3090-tp"),
        (["upstream", "check", "--offline", "--engine", "vllm-0.2"], "did you mean 'vllm-0.2"),
    ],
)
def test_unknown_catalog_value_is_one_line_exit_1_with_a_hint(argv, expect) -> None:
    rc, out, err = _run(argv)
    assert rc == 1 and out == ""
    assert len(err) == 1 and err[0].startswith("error: ") and expect in err[0], err


def test_unknown_value_without_a_close_match_lists_the_known_ones() -> None:
    rc, _, err = _run(["fits", "--model", "zzz", "--hardware", "rtx-3090"])
    assert rc == 1 and len(err) == 1 and "known: gemma-4-" in err[0], err


@pytest.mark.parametrize("opt", ["--gpus", "--tp", "--ctx", "--max-seqs"])
@pytest.mark.parametrize("bad", ["0", "-2"])
def test_counts_must_be_positive_ints_one_line_exit_1(opt: str, bad: str) -> None:
    rc, out, err = _run([*FITS, opt, bad])
    assert rc == 1 and out == ""
    assert len(err) == 1 and opt in err[0] and "x>=1" in err[0], err


def test_a_non_integer_gpu_count_is_one_line_exit_1() -> None:
    rc, _, err = _run([*FITS, "--gpus", "two"])
    assert rc == 1 and len(err) == 1 and "'two' is not a valid integer" in err[0], err


def _complete(words: str, env_extra: dict[str, str] | None = None) -> list[str]:
    env = dict(_OVERLAY_COMPLETE="bash_complete", COMP_WORDS=words,
               COMP_CWORD=str(len(words.split()) - (0 if words.endswith(" ") else 1)),
               PYTHONPATH=str(REPO_ROOT), OVERLAY_CATALOG=str(REPO_ROOT))
    env.update(env_extra or {})
    res = overlay_process(env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    return [ln.split(",", 1)[1] for ln in res.stdout.splitlines() if "," in ln]


def test_completion_of_commands() -> None:
    got = _complete("overlay comp")
    assert "compose" in got and "completion" in got


def test_completion_of_overlay_ids_slugs_and_profile_ids() -> None:
    assert _complete("overlay apply sm") == ["sm70-d512-attention", "sm70-w4-gemm"]
    assert set(_complete("overlay compose render gemma4-26b-a4b-awq")) == {
        "gemma4-26b-a4b-awq-3090-tp1", "gemma4-26b-a4b-awq-3090-tp2", "gemma4-26b-a4b-awq-mtp-3090-tp2",
        "gemma4-26b-a4b-awq-v100-tp2"}
    assert "hardware/v100-sxm2-16gb" in _complete("overlay profiles show hardware/")
    assert "gemma-4-26b-a4b" in _complete("overlay fits --model gemma-4-2")
    assert "rtx-3090" in _complete("overlay plan --hardware rtx")


def test_completion_reads_the_catalog_given_with_dash_dash_catalog(tmp_path: Path) -> None:
    (tmp_path / "overlays" / "my-own-overlay").mkdir(parents=True)
    (tmp_path / "overlays" / "my-own-overlay" / "overlay.yaml").write_text("id: my-own-overlay\n")
    assert _complete(f"overlay --catalog {tmp_path} status my") == ["my-own-overlay"]


def test_completion_in_a_broken_catalog_completes_nothing_without_a_traceback(tmp_path: Path) -> None:
    assert _complete("overlay fits --model g", {"OVERLAY_CATALOG": str(tmp_path / "none")}) == []


@pytest.mark.parametrize("shell, marker", [("bash", "complete -o nosort -F"), ("zsh", "#compdef overlay"),
                                           ("fish", "complete --no-files --command overlay")])
def test_completion_command_prints_the_script(shell: str, marker: str) -> None:
    rc, out, err = _run(["completion", shell])
    assert rc == 0 and marker in out and "_OVERLAY_COMPLETE" in out and err == []
