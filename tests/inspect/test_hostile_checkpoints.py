"""Issue 28 points 9, 13: local checkpoints a hostile hand made: a FIFO where an index names a
shard, JSON nested deeper than the parser's stack, a 5000-digit integer in a header. Each is one
InspectError naming the file (exit 1), never a hang or a traceback."""

from __future__ import annotations

import os

import pytest

from manager.errors import InspectError
from manager.inspect import LocalSource
from manager.inspect.headers import parse_header
from tests.helpers.fifos import error_without_blocking


def test_a_fifo_shard_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "model-00001-of-00002.safetensors")
    src = LocalSource(tmp_path)
    exc = error_without_blocking(lambda: src.read("model-00001-of-00002.safetensors", 0, 8),
                                 tmp_path / "model-00001-of-00002.safetensors")
    assert isinstance(exc, InspectError) and "FIFO" in str(exc)


def test_a_config_nested_past_the_parsers_stack_is_one_error(tmp_path):
    (tmp_path / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InspectError, match="config.json.*nested too deeply"):
        LocalSource(tmp_path).read_json("config.json")


def test_a_config_with_a_5000_digit_integer_is_one_error(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": ' + "9" * 5000 + "}")
    with pytest.raises(InspectError, match="config.json"):
        LocalSource(tmp_path).read_json("config.json")


@pytest.mark.parametrize("raw", [b"[" * 100_000 + b"]" * 100_000,
                                 b'{"w": {"dtype": "F16", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 2]}}'],
                         ids=["nested", "5000-digits"])
def test_a_hostile_header_is_one_error(raw):
    with pytest.raises(InspectError, match="header"):
        parse_header("model.safetensors", raw, where="model.safetensors")
