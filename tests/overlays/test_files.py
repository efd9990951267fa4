"""manager.overlays.files.Tree: one read and one decode per target per operation, dropped on replace()."""

from __future__ import annotations

import pytest

from manager.errors import OverlayError
from manager.overlays import files
from manager.overlays.files import Tree


def test_tree_text_decodes_a_file_once_per_operation(tmp_path, monkeypatch):
    (tmp_path / "a.py").write_text("x = 1\n")
    calls = []
    real = files.decode_file
    monkeypatch.setattr(files, "decode_file", lambda rel, data: calls.append(rel) or real(rel, data))
    tree = Tree(tmp_path)
    assert tree.text("a.py") == "x = 1\n"
    assert tree.text("a.py") is tree.text("a.py")
    assert calls == ["a.py"]


def test_tree_text_after_replace_is_the_new_bytes_in_the_files_own_encoding(tmp_path):
    (tmp_path / "a.py").write_bytes(b"# -*- coding: latin-1 -*-\nname = '\xe9'\n")
    tree = Tree(tmp_path)
    assert tree.text("a.py").endswith("name = '\u00e9'\n")
    assert tree.syntax("a.py") is not None
    tree.replace("a.py", b"# -*- coding: latin-1 -*-\nname = '\xe8'\n", None)
    assert tree.text("a.py").endswith("name = '\u00e8'\n")
    assert tree.syntax("a.py").body[0].value.value == "\u00e8"
    assert tree.encode("a.py", "# -*- coding: latin-1 -*-\nz = '\u00ea'\n").endswith(b"z = '\xea'\n")


def test_tree_text_of_a_missing_file_is_none_and_a_later_replace_is_seen(tmp_path):
    tree = Tree(tmp_path)
    assert tree.text("new.py") is None
    tree.replace("new.py", b"y = 2\n", None)
    assert tree.text("new.py") == "y = 2\n"
    tree.replace("new.py", None, None)
    assert tree.text("new.py") is None


def test_tree_text_of_undecodable_bytes_names_the_file_and_line_every_time(tmp_path):
    (tmp_path / "bad.py").write_bytes(b"x = 1\ny = '\xff'\n")
    tree = Tree(tmp_path)
    for _ in range(2):
        with pytest.raises(OverlayError, match=r"bad\.py: line 2: not UTF-8 \(byte 0xff\)"):
            tree.text("bad.py")
